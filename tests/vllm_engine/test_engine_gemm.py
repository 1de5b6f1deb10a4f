"""A served model's linear maps on vLLM's CPU GEMM (ssmhub.serving.engine_linear): every plain nn.Linear routed
(Mamba's subclasses that keep nn.Linear's forward included),
the same outputs as F.linear up to float32 round-off, the weights still the module's own, and a decode step's
stacked products running a routed module as itself. Runs in ``make test-vllm``'s environment; skipped where vLLM is
not installed."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

pytest.importorskip("vllm")

import ssmhub
from ssmhub.layers.stacking import linear_maps
from ssmhub.serving.engine_linear import use_engine_gemm

EPS32 = torch.finfo(torch.float32).eps


def _model(family):
    torch.manual_seed(0)
    if family == "dlr":
        config = ssmhub.DLRConfig(vocab_size=61, hidden_size=24, num_hidden_layers=2, state_size=5,
                                  intermediate_size=40)  # fmt: skip
    else:  # Mamba's layers: dt_proj and out_proj are nn.Linear subclasses that keep its forward
        config = ssmhub.SerpentConfig(vocab_size=61, hidden_size=24, num_hidden_layers=2, state_size=5,
                                      resampling_rates=[])  # fmt: skip
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("family", ["dlr", "serpent-mamba"])
def test_every_linear_is_routed_and_gives_f_linears_numbers(family):
    model, reference = _model(family), _model(family)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert use_engine_gemm(model) == len(linears) > 0
    assert all("forward" in m.__dict__ for m in linears)
    assert use_engine_gemm(model) == 0  # routed once: a module with a forward of its own is left as it is
    ids = torch.randint(1, 61, (3, 11))
    with torch.no_grad():
        got, want = model(ids).logits, reference(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=64 * EPS32 * want.abs().amax().item())
    assert model.state_dict().keys() == reference.state_dict().keys()
    assert model.lm_head.weight is model.backbone.embeddings.weight  # the tie kept


@pytest.mark.parametrize("rows", [1, 33])
def test_a_routed_module_runs_as_itself_in_a_decode_steps_products(rows):
    linear = nn.Linear(13, 7)
    plain = copy.deepcopy(linear)
    use_engine_gemm(nn.Sequential(linear))
    x = torch.randn(1, rows, 13)
    torch.testing.assert_close(linear_maps([linear])(x), linear_maps([plain])(x), rtol=0, atol=32 * EPS32 * 13)
