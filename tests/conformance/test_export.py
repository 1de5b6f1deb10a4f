"""The exported decode step (ssmhub.export), every family with a causal LM: 32 greedy tokens from the
``torch.export`` program and from onnxruntime running the ONNX file equal eager ``generate``'s, and their logits
equal ``generate``'s within float32 round-off (other kernels: ``MODEL_REL`` of each step's largest logit, see
tests/comparisons.py); bad input is refused by name before anything is traced."""

import pytest
import torch
from comparisons import MODEL_REL, scaled_close
from conftest import random_ids
from families import FAMILIES

from ssmhub.export import (
    DecodeStep,
    decode_state_specs,
    export_decode_step,
    export_decode_step_onnx,
    greedy_decode,
    initial_decode_states,
    onnx_step,
    program_step,
)

NEW_TOKENS, PROMPT = 32, 5
MAX_LENGTH = PROMPT + NEW_TOKENS


def _decoder_params():
    return [pytest.param(family, id=family.name) for family in FAMILIES if family.causal_lm is not None]


def _eager(family):
    torch.manual_seed(0)
    model = family.causal_lm(family.config()).eval()
    prompt = random_ids(1, PROMPT)
    out = model.generate(
        prompt, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
    return model, prompt, out.sequences[:, PROMPT:], out.logits


def _assert_matches(step, model, prompt, tokens, logits):
    got, scores, _ = greedy_decode(step, prompt, initial_decode_states(model, 1, MAX_LENGTH), NEW_TOKENS)
    assert torch.equal(got, tokens)  # greedy token ids: exact
    for step, (ours, theirs) in enumerate(zip(scores, logits)):
        scaled_close(ours, theirs, rel=MODEL_REL, what=f"logits of step {step}")


@pytest.mark.parametrize("family", _decoder_params())
def test_the_exported_program_decodes_as_generate(family):
    model, prompt, tokens, logits = _eager(family)
    program = export_decode_step(model, 1, MAX_LENGTH)
    _assert_matches(program_step(program), model, prompt, tokens, logits)


# the ONNX export takes several seconds a family: the families whose step the others repeat run in `make test-all`
@pytest.mark.parametrize("family", _decoder_params())
def test_onnxruntime_decodes_as_generate(family, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    model, prompt, tokens, logits = _eager(family)
    path = export_decode_step_onnx(model, tmp_path / "step.onnx", 1, MAX_LENGTH)
    assert [p.name for p in tmp_path.iterdir()] == ["step.onnx"]  # written atomically, nothing left over
    session = ort.InferenceSession(str(path))
    names = [i.name for i in session.get_inputs()]
    assert names == ["input_ids", *(spec.name for spec in decode_state_specs(model, 1, MAX_LENGTH))]
    _assert_matches(onnx_step(session), model, prompt, tokens, logits)


def test_the_onnx_file_is_traced_from_a_cpu_copy(tmp_path):
    """An ONNX graph names no device and a GPU's kernels have no ONNX function (CUDA runs F.rms_norm as
    aten._fused_rms_norm), so the file is traced from a copy of the model on the CPU: the caller's model keeps its
    device (a GPU's under ``$SSMHUB_TEST_DEVICE=cuda``), its mode and its weights; a model on the meta device has no
    weights to copy and is refused by name."""
    family = next(f for f in FAMILIES if f.name == "serpent")  # a SeRpEnt mixer's RMSNorm: the fused kernel on CUDA
    torch.manual_seed(0)
    model = family.causal_lm(family.config()).train()
    before = {name: t.clone() for name, t in model.state_dict().items()}
    export_decode_step_onnx(model, tmp_path / "step.onnx", 1, 4)
    assert model.training
    for name, tensor in model.state_dict().items():
        assert tensor.device == before[name].device and torch.equal(tensor, before[name]), name
    with torch.device("meta"):
        unloaded = family.causal_lm(family.config())
    with pytest.raises(ValueError, match="meta device"):
        export_decode_step_onnx(unloaded, tmp_path / "unloaded.onnx", 1, 4)
    assert [p.name for p in tmp_path.iterdir()] == ["step.onnx"]


def test_the_signature_is_the_caches_one_format():
    """The states are named and ordered as the cache's state dict (prompt caches and stateful checkpoints hold the
    same): a static cache's, ``seen_tokens`` left out; a complex state crosses as its real view."""
    family = next(f for f in FAMILIES if f.name == "h3-hybrid")
    torch.manual_seed(0)
    model = family.causal_lm(family.config()).eval()
    specs = decode_state_specs(model, 2, 7)
    cache = model.static_cache(2, 7).state_dict()
    assert [s.name for s in specs] == [name for name in cache if name != "seen_tokens"]
    for spec in specs:
        held = cache[spec.name]
        assert spec.name == f"layers.{spec.layer}.{spec.field}" and spec.is_complex == held.is_complex()
        view = torch.view_as_real(held) if held.is_complex() else held
        assert (spec.shape, spec.dtype) == (tuple(view.shape), view.dtype)
    attention = {s.field: s for s in specs if s.layer == 1}
    assert attention["key"].shape == (2, 2, 7, 8) and attention["length"].dtype == torch.long
    step = DecodeStep(model, 2, 7)
    assert step.output_names() == ["logits", *(f"new.{s.name}" for s in specs)]


def test_a_complex_state_crosses_as_its_real_view():
    """A distilled H3 holds its modal state complex: the step takes and returns its real view and decodes as
    ``generate`` (eagerly: its distilled step does not trace with ``torch.export`` yet)."""
    import ssmhub

    torch.manual_seed(0)
    config = ssmhub.H3Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, max_kernel_length=32,
                             attention_layers=[], ssm_num_heads=2)  # fmt: skip
    model = ssmhub.H3ForCausalLM(config).eval()
    model.distill_for_decoding(4)
    complex_specs = [s for s in decode_state_specs(model, 1, 8) if s.is_complex]
    assert complex_specs and all(s.shape[-1] == 2 and not s.dtype.is_complex for s in complex_specs)
    prompt = random_ids(1, 3, vocab=64)
    out = model.generate(prompt, max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True)
    step = DecodeStep(model, 1, 8)

    def eager(input_ids, states):
        logits, *states = step(input_ids, *states)
        return logits, states

    got, scores, states = greedy_decode(eager, prompt, initial_decode_states(model, 1, 8), 4)
    assert [(tuple(t.shape), t.dtype) for t in states] == [(s.shape, s.dtype) for s in step.specs]
    assert torch.equal(got, out.sequences[:, 3:])
    for i, (ours, theirs) in enumerate(zip(scores, out.logits)):
        scaled_close(ours, theirs, rel=MODEL_REL, what=f"logits of step {i}")


def test_bad_input_is_refused_by_name():
    classifier_family = next(f for f in FAMILIES if f.name == "dlr-bidirectional")
    classifier = classifier_family.sequence_classification(classifier_family.config(num_labels=2))
    with pytest.raises(ValueError, match="causal language model"):
        export_decode_step(classifier)
    family = next(f for f in FAMILIES if f.name == "dlr")
    model = family.causal_lm(family.config())
    model.backbone.layers[1].mixer.causal = False  # as a bidirectional layer is (no causal LM can hold one)
    with pytest.raises(ValueError, match="cannot decode token by token: layer 1: a bidirectional DLR"):
        export_decode_step(model)
    model.backbone.layers[1].mixer.causal = True
    for kwargs, name in (({"batch_size": 0}, "batch_size"), ({"max_length": 2.5}, "max_length")):
        with pytest.raises(ValueError, match=name):
            DecodeStep(model, **kwargs)
    with pytest.raises(ValueError, match="path"):
        export_decode_step_onnx(model, "step.txt")
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_decode(program_step(export_decode_step(model, 1, 4)), random_ids(1, 2), [], 0)


def test_a_full_attention_buffer_is_refused():
    family = next(f for f in FAMILIES if f.name == "h3-hybrid")
    torch.manual_seed(0)
    model = family.causal_lm(family.config()).eval()
    cache = model.static_cache(1, 4)
    with torch.no_grad():
        model(random_ids(1, 4), cache=cache)
        with pytest.raises(ValueError, match="holds 4 tokens"):
            model(random_ids(1, 1), cache=cache)
