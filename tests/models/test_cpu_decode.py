"""What ``generate`` does on a CPU beyond transformers' loop: the linear maps on oneDNN's matmul for as long as it runs
(ssmhub.models.cpu_linears) and a one-pass mixer's state stepped in the cache's own tensors (RecurrentBlock.step_).
Oracles: the model's own forward over the whole generated sequence, run without either (F.linear, the parallel
scan), and the cache a plain forward leaves."""

from __future__ import annotations

import pytest
import torch
from comparisons import same_states, same_values
from torch import nn
from transformers import AutoModelForCausalLM

import ssmhub
from ssmhub import RecurrentCache
from ssmhub.layers.dlr import DLRMixer
from ssmhub.models import cpu_linears
from ssmhub.models.cache_argument import CACHE_FIELD
from ssmhub.models.cpu_linears import linears_on_cpu_gemm
from ssmhub.models.modeling_recurrent import _steps_in_place
from ssmhub.ops import host_reads
from ssmhub.ops.cpu_linear import _onednn_linear, onednn_linear_fits

# wide enough that the head's product (256 × 4096 at one row) and the MLP's (8 rows) pass MIN_MULTIPLY_ADDS
_WIDE = {"vocab_size": 4096, "hidden_size": 256, "num_hidden_layers": 2, "pad_token_id": 0}
CONFIGS = {
    "dlr": lambda: ssmhub.DLRConfig(state_size=16, intermediate_size=512, weight_std=0.2, **_WIDE),
    "h3": lambda: ssmhub.H3Config(intermediate_size=512, max_kernel_length=64, attention_layers=[], **_WIDE),
    "serpent": lambda: ssmhub.SerpentConfig(resampling_rates=[0.5], **_WIDE),
}


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(CONFIGS[name]()).eval()


def test_linears_are_routed_inside_the_block_and_restored_after():
    class InitialValues(nn.Linear):  # nn.Linear's forward (as Mamba's out_proj): routed
        pass

    class OwnProduct(nn.Linear):  # a forward of the class's own: left alone
        def forward(self, x):
            return x

    own = nn.Linear(4, 4)
    own.forward = lambda x: x  # a forward of its own (an engine's GEMM, an offloading hook): left alone
    model = nn.Sequential(nn.Linear(4, 4), OwnProduct(4, 4), own, nn.Linear(4, 4).double(), InitialValues(4, 4))
    with linears_on_cpu_gemm(model) as routed:
        assert routed == 2 and "forward" in model[0].__dict__ and "forward" in model[4].__dict__
        assert "forward" not in model[1].__dict__ and "forward" not in model[3].__dict__
        with linears_on_cpu_gemm(model) as again:  # re-entered: nothing left to route, nothing restored early
            assert again == 0
        assert "forward" in model[0].__dict__
    assert "forward" not in model[0].__dict__ and model[2].forward is own.forward
    with pytest.raises(KeyError), linears_on_cpu_gemm(model):
        raise KeyError("inside")
    assert "forward" not in model[0].__dict__  # restored however the block exits


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_generate_on_the_cpu_gemm_gives_the_plain_forwards_logits(name, monkeypatch):
    model = _model(name)
    products = []

    def counting(x, weight, bias=None):
        products.append(onednn_linear_fits(x, weight, bias))
        return cpu_linear(x, weight, bias)

    cpu_linear = cpu_linears.cpu_linear
    monkeypatch.setattr(cpu_linears, "cpu_linear", counting)
    ids = torch.randint(1, 4096, (8, 5), generator=torch.Generator().manual_seed(1))
    out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0, output_logits=True,
                         return_dict_in_generate=True)  # fmt: skip
    assert any(products) == (_onednn_linear() is not None)  # taken wherever this torch build has the op
    assert all("forward" not in m.__dict__ for m in model.modules())  # every forward handed back
    with torch.no_grad():
        full = model(out.sequences[:, :-1]).logits[:, ids.shape[1] - 1 :]  # (8, 6, V), F.linear and the parallel form
    same_values(torch.stack(out.logits, 1), full, what=f"{name}: generate's logits")
    assert torch.equal(out.sequences[:, ids.shape[1] :], full.argmax(-1))  # greedy ids: exact unless a tie


def test_dlr_generate_steps_its_state_in_the_caches_tensors(monkeypatch):
    model = _model("dlr")
    calls = []
    step_rows = DLRMixer.step_rows_

    def spy(self, *args, **kwargs):
        calls.append(args[1]["dlr_state"].data_ptr())  # the table it updates
        return step_rows(self, *args, **kwargs)

    monkeypatch.setattr(DLRMixer, "step_rows_", spy)
    ids = torch.randint(1, 4096, (3, 7), generator=torch.Generator().manual_seed(2))
    out = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0, return_dict_in_generate=True)
    cache = getattr(out, CACHE_FIELD)
    expected_calls = 4 * model.config.num_hidden_layers if model.backbone.layers[0].mixer.steps_rows_in_one_pass else 0
    assert len(calls) == expected_calls  # every token after the prompt's first one, every layer
    assert set(calls) <= {state["dlr_state"].data_ptr() for state in cache.layers}  # the cache's own tensors
    with torch.no_grad():
        reference = getattr(model(out.sequences[:, :-1], use_cache=True), CACHE_FIELD)
    same_states(cache, reference)


def test_the_in_place_step_is_taken_only_where_it_is_safe():
    x, mask = torch.zeros(2, 1, 8), torch.ones(2, 1, dtype=torch.long)
    cache = RecurrentCache(1)
    with torch.no_grad():
        assert _steps_in_place(cache, x, mask, None) and _steps_in_place(cache, x, None, None)
        assert not _steps_in_place(cache, torch.zeros(2, 2, 8), None, None)  # a prefill: the parallel form
        assert not _steps_in_place(cache, x, torch.tensor([[1], [0]]), None)  # a padded token adds nothing
        assert not _steps_in_place(cache, x, None, torch.ones(2, 1, dtype=torch.bool))  # a document restarts
        assert not _steps_in_place({}, x, None, None)  # not a RecurrentCache (export's functional states)
        with host_reads.static_paths():  # an accelerator's paths: no kernel that reads on the host
            assert not _steps_in_place(cache, x, None, None)
        static = RecurrentCache.preallocated([{"state": torch.zeros(2, 8)}])
        assert not _steps_in_place(static, x, None, None)  # a static cache is for a compiled step
        cache.activate_past_recording()
        assert not _steps_in_place(cache, x, None, None)  # its rollback holds states by reference
    assert not _steps_in_place(RecurrentCache(1), x, None, None)  # gradients on: a new state keeps its graph
