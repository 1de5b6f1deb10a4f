"""Half precision computes what float32 computes, to bfloat16's rounding, with the recurrence kept in float32.

Each check runs the model in bfloat16 (under autocast, or loaded with ``dtype=torch.bfloat16``) and compares,
by relative (Frobenius) error, with the float32 model on the same input:

- the logits (what a user sees);
- the output of each recurrent mixer (a mixer that owns a submodule named ``ssm``; not attention) given the
  same input as in the float32 run: the part of the model that a recurrence computed in half precision
  changes first, without the rounding that earlier layers pass on.

Tolerance. bfloat16 keeps 8 significand bits, so one rounding errs by at most u = 2⁻⁸ (relative). A bf16
matmul rounds its inputs and its output, and a mixer has two or three in a row around its float32
recurrence, so its output errs by a few u. Measured on an x86 CPU, L = 300 (autocast | bf16 load):
logits 1.8e-3 - 6.1e-3 | 2.5e-3 - 7.2e-3 (worst: h3-hybrid), mixers 2.7e-3 - 6.6e-3 | 3.1e-3 - 6.6e-3
(worst: h3-hybrid's last layer). The bound 4u = 1.56e-2 leaves a margin of 2.2x over the worst logits and
2.4x over the worst mixer.

What fails it: recurrence parameters rounded to bf16 (a load that drops the float32 keep-list, or a layer
that casts them to autocast's dtype) moves the logits of the three DLR variants by 3.3e-2 - 2.4e-1
(mixers 0.16 - 0.54) and the mixers of h3-ssm by 2.6e-2 - 2.9e-2 (1.65x the bound). In these tiny random
models a whole selective or block scan run in bf16 is not measurable at this level (Mamba's mixers go
from 6.2e-3 to 6.6e-3, BD-LRNN's from 4.9e-3 to 6.5e-3): the op-level autocast tests cover the scans.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import auto_class, auto_class_name, random_ids, random_labels
from devices import bf16_autocast

BF16_UNIT_ROUNDOFF = 2.0**-8
TOLERANCE = 4 * BF16_UNIT_ROUNDOFF  # see the module docstring


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """‖value − reference‖ / ‖reference‖ (Frobenius), computed in float32."""
    return float((value.float() - reference.float()).norm() / reference.float().norm())


def recurrent_mixers(model) -> list[torch.nn.Module]:
    """The mixers of ``model`` that own recurrence parameters (a submodule named ``ssm``); not attention."""
    mixers = [block.mixer for block in model.base_model.layers]
    return [m for m in mixers if any(name.rpartition(".")[2] == "ssm" for name, _ in m.named_modules())]


def run_recording_mixers(model, ids, inputs=None) -> tuple[torch.Tensor, list, list]:
    """``model(ids).logits`` and each recurrent mixer's input and output, in layer order. With ``inputs``
    (one per recurrent mixer), each mixer is fed its given input (cast to the dtype the run hands it)
    in place of the one its layer computed."""
    seen_inputs, outputs, hooks = [], [], []

    def feed(i):
        def hook(_module, args):
            seen_inputs.append(args[0])
            return None if inputs is None else (inputs[i].to(args[0].dtype), *args[1:])

        return hook

    for i, mixer in enumerate(recurrent_mixers(model)):
        hooks.append(mixer.register_forward_pre_hook(feed(i)))
        hooks.append(mixer.register_forward_hook(lambda _module, _args, out: outputs.append(out[0])))
    try:
        with torch.no_grad():
            logits = model(ids).logits
    finally:
        for hook in hooks:
            hook.remove()
    return logits, seen_inputs, outputs


def assert_bf16_matches_float32(model, reference, ids, autocast: bool) -> None:
    """``model`` run in bf16 (a bf16 model, or under bf16 autocast) matches the float32 ``reference``
    within TOLERANCE: its logits, and each recurrent mixer's output given the float32 run's input."""
    what = "bf16 autocast" if autocast else "bf16 model"
    expected_logits, inputs, expected = run_recording_mixers(reference, ids)
    with bf16_autocast(enabled=autocast):
        logits, _, _ = run_recording_mixers(model, ids)
        _, _, outputs = run_recording_mixers(model, ids, inputs)
    error = relative_error(logits, expected_logits)
    assert error <= TOLERANCE, f"{what}: logits differ from float32 by {error:.2e} (relative) > {TOLERANCE:.2e}"
    assert outputs and len(outputs) == len(expected)
    for i, (out, ref) in enumerate(zip(outputs, expected)):
        error = relative_error(out, ref)
        assert error <= TOLERANCE, f"{what}: recurrent mixer {i} differs from float32 by {error:.2e} > {TOLERANCE:.2e}"


def cross_entropy_float64(model, logits, labels) -> torch.Tensor:
    """The loss ``model``'s head should return for ``logits``: cross-entropy in float64 (shifted by one
    position for a causal LM)."""
    if auto_class_name(model) == "AutoModelForCausalLM":
        logits, labels = logits[:, :-1], labels[:, 1:]
    return F.cross_entropy(logits.double().reshape(-1, logits.shape[-1]), labels.reshape(-1))


def test_bf16_autocast_matches_float32(any_model):
    """Under bf16 autocast the logits and the recurrent mixers match float32; the logits come in autocast's bf16
    (as GPT-2's) and the loss, in float32, is the cross-entropy of those logits upcast (to 1e-5 relative, far
    below bf16's 2⁻⁹)."""
    ids = random_ids(2, 300)
    assert_bf16_matches_float32(any_model, any_model, ids, autocast=True)
    labels = random_labels(any_model, ids)
    with bf16_autocast(), torch.no_grad():
        out = any_model(ids, labels=labels)
    assert out.logits.dtype == torch.bfloat16 and out.loss.dtype == torch.float32
    expected = cross_entropy_float64(any_model, out.logits, labels)
    torch.testing.assert_close(out.loss.double(), expected, rtol=1e-5, atol=0)


def test_half_precision_load_keeps_recurrence_in_fp32(any_model, tmp_path):
    """A ``dtype=torch.bfloat16`` load makes every parameter bf16 except the recurrence's (``*.ssm.*``),
    and the loaded model computes what the float32 model does, to bf16's rounding."""
    any_model.save_pretrained(tmp_path)
    loaded = auto_class(any_model).from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    dtypes = {name: p.dtype for name, p in loaded.named_parameters()}
    recurrence = {name for name in dtypes if ".ssm." in name}  # none in bdlrnn-paper (x_0 = 0)
    assert {name: dtypes[name] for name in recurrence} == dict.fromkeys(recurrence, torch.float32)
    others = set(dtypes) - recurrence
    assert {name: dtypes[name] for name in others} == dict.fromkeys(others, torch.bfloat16)
    assert_bf16_matches_float32(loaded, any_model, random_ids(2, 300), autocast=False)


CASTS = {  # a cast of the float32 model -> the dtype a from_pretrained load gets for the same model
    "to(torch.bfloat16)": (lambda model: model.to(torch.bfloat16), torch.bfloat16),
    "bfloat16()": (lambda model: model.bfloat16(), torch.bfloat16),
    "half()": (lambda model: model.half(), torch.float16),
}


@pytest.mark.parametrize("cast", list(CASTS))
def test_half_precision_cast_equals_the_half_precision_load(any_model, cast, tmp_path):
    """``model.to(torch.bfloat16)`` (and ``.bfloat16()``, ``.half()``) keeps the recurrence in float32 exactly as
    ``from_pretrained(dtype=...)`` does, so both give the same parameters (bit for bit), logits (within half
    precision's round-off: two models' forwards are computations of their own) and generated tokens."""
    apply_cast, dtype = CASTS[cast]
    any_model.save_pretrained(tmp_path)
    loaded = auto_class(any_model).from_pretrained(tmp_path, dtype=dtype).eval()
    cast_model = apply_cast(copy.deepcopy(any_model))
    assert cast_model is not None
    expected = {name: p.dtype for name, p in loaded.named_parameters()}
    assert {name: p.dtype for name, p in cast_model.named_parameters()} == expected
    assert all(dtype == torch.float32 for name, dtype in expected.items() if ".ssm." in name)
    for (name, p), q in zip(cast_model.named_parameters(), loaded.parameters()):
        # both round the same float32 tensor to the nearest half-precision value (or keep it): exact
        assert torch.equal(p, q), name
    ids = random_ids(2, 40)
    with torch.no_grad():
        cast_logits, loaded_logits = cast_model(ids).logits, loaded(ids).logits
    assert cast_logits.dtype == loaded_logits.dtype
    error = relative_error(cast_logits, loaded_logits)
    assert error <= TOLERANCE, f"{cast}: logits differ from the loaded model's by {error:.2e} > {TOLERANCE:.2e}"
    if auto_class_name(any_model) == "AutoModelForCausalLM":
        kwargs = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
        # greedy token ids: exact
        assert torch.equal(cast_model.generate(ids, **kwargs), loaded.generate(ids, **kwargs))


def test_cast_to_bf16_and_back_restores_the_float32_model(any_model):
    """The recurrence never went through bf16: casting back to float32 gives it back bit for bit; other
    parameters are rounded, and float64 (for reference runs) still reaches every parameter."""
    before = {name: p.detach().clone() for name, p in any_model.named_parameters()}
    restored = copy.deepcopy(any_model).to(torch.bfloat16).float()
    for name, p in restored.named_parameters():
        if ".ssm." in name:
            assert p.dtype == torch.float32 and torch.equal(p, before[name]), name  # never cast: a copy, exact
    assert all(p.dtype == torch.float64 for p in copy.deepcopy(any_model).double().parameters())
