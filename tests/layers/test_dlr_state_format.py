"""DLR's decode state as float32 real and imaginary planes (B, H, 2, N) (issue 45), and the states saved before it:
complex64 (B, H, N) prompt caches and stateful-training states load into the new layout, exactly; a traced decode
step holds no complex tensor (what lets Inductor fuse it and ONNX run it)."""

import pytest
import torch
from safetensors.torch import save_file

import ssmhub
from ssmhub.cache_files import FORMAT, model_identity
from ssmhub.export import export_decode_step
from ssmhub.models.cache_argument import CACHE_FIELD
from ssmhub.ops.dlr import dlr_state_complex

CONFIGS = {
    "real": {"state_size": 8, "intermediate_size": 32, "weight_std": 0.2},
    "prod": {"state_size": 4, "intermediate_size": 32, "kernel_type": "prod"},
}


def build(kernel_type: str) -> ssmhub.DLRForCausalLM:
    torch.manual_seed(0)
    config = ssmhub.DLRConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, **CONFIGS[kernel_type])
    return ssmhub.DLRForCausalLM(config).eval()


def ids(length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, 64, (2, length), generator=torch.Generator().manual_seed(seed))


def format_1(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A cache state dict as ssmhub wrote it before issue 45: each ``dlr_state`` complex64 (B, H, N)."""
    return {key: dlr_state_complex(t) if key.endswith(".dlr_state") else t for key, t in state.items()}


def write_format_1(path, state: dict[str, torch.Tensor], model) -> None:
    """A prompt-cache file as ``cache_files.write_cache_file`` wrote it at format version 1."""
    tensors = {key: t.contiguous() for key, t in format_1(state).items() if key != "seen_tokens"}
    metadata = {
        "format": FORMAT,
        "version": "1",
        **model_identity(model),
        "batch_size": str(next(iter(tensors.values())).shape[0]),
        "seen_tokens": str(int(state["seen_tokens"])),
    }
    save_file(tensors, str(path), metadata=metadata)


@pytest.mark.parametrize("kernel_type", sorted(CONFIGS))
@torch.no_grad()
def test_a_prompt_cache_of_format_1_loads_and_continues_exactly(kernel_type, tmp_path):
    model = build(kernel_type)
    document, question = ids(9), ids(3, seed=1)
    cache = getattr(model(document, use_cache=True), CACHE_FIELD)
    state = cache.state_dict()
    assert state["layers.0.dlr_state"].dtype == torch.float32  # what is written today
    write_format_1(tmp_path / "old.safetensors", state, model)
    loaded = ssmhub.RecurrentCache.load(tmp_path / "old.safetensors", model, batch_size=2)
    for key, tensor in state.items():  # the conversion only moves float32 values: bit for bit
        assert torch.equal(loaded.state_dict()[key], tensor), key
    prompt = torch.cat([document, question], 1)
    continued = model.generate(prompt, max_new_tokens=5, do_sample=False, **{CACHE_FIELD: loaded})
    assert torch.equal(continued, model.generate(prompt, max_new_tokens=5, do_sample=False))  # greedy ids: exact


def test_a_carried_state_of_format_1_becomes_the_planes():
    """``RecurrentCache.from_state_dict``, where stateful-training checkpoints bring their states back."""
    model = build("real")
    with torch.no_grad():
        state = getattr(model(ids(6), use_cache=True), CACHE_FIELD).state_dict()
    restored = ssmhub.RecurrentCache.from_state_dict(format_1(state), len(model.backbone.layers)).state_dict()
    assert restored.keys() == state.keys()
    assert all(torch.equal(restored[key], state[key]) for key in state)


@pytest.mark.parametrize("kernel_type", sorted(CONFIGS))
def test_a_traced_decode_step_holds_no_complex_tensor(kernel_type):
    """No value in the exported step's graph is complex: the step is real arithmetic end to end, so Inductor fuses
    it (a complex view or copy is an eager fallback there) and ONNX runs it."""
    program = export_decode_step(build(kernel_type), 1, 4)
    values = [node.meta.get("val") for node in program.graph.nodes]
    dtypes = {v.dtype for v in values if isinstance(v, torch.Tensor)}
    assert dtypes and not any(dtype.is_complex for dtype in dtypes), dtypes
