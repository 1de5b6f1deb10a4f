"""int8 weights, as transformers users quantize, for every family with a causal LM (:mod:`ssmhub.quantization`).

Two routes: ``from_pretrained(folder, quantization_config=TorchAoConfig(Int8WeightOnlyConfig(), ...))``
(skipped without torchao) and ``torch.ao.quantization.quantize_dynamic`` (the plain user call on ``{nn.Linear}``
and :func:`ssmhub.quantization.quantize_dynamic_int8`). Each checks that the model generates; that its logits stay
near the float32 model's; that only projections quantized: every parameter of the recurrences (the ``ssm``
submodules) and the linear layers of ``FLOAT32_LINEAR_NAMES`` are plain float32 tensors, every FFT runs on
float32 (complex64) input, and every recurrent state in the cache is float32; and, for torchao, that the
quantized model saves and loads.

Tolerance of the logits (relative Frobenius error against the float32 model on the same input). Symmetric int8
rounds each weight to a step of max|w|/127 (per output row for torchao's weight-only config, per tensor for
fbgemm's dynamic quantization), so one rounding errs by at most half a step, u₈ = 1/254 ≈ 2⁻⁸ of the largest
weight. A projection's output then errs by a few u₈ of its size (the largest weight of a row is 2-4 times its
rms in these initializations), and the tiny models chain 4-9 projections whose errors add: 8 u₈ = 3.1e-2 for
weight-only. Dynamic quantization also rounds each activation row to 7-bit int8 (fbgemm's reduced range), an
error of u₇ = 2 u₈ next to the weight's u₈ in every projection: 3 × 8 u₈ = 9.4e-2.

Measured on an x86 CPU (AVX2), L = 24: torchao weight-only 1.7e-4 - 1.4e-2, ``quantize_dynamic_int8``
1.3e-2 - 4.2e-2, the worst both times h3-hybrid (rounding errors go through the attention's softmax): margins of
2.2x. What fails it: the plain ``quantize_dynamic(model, {nn.Linear})``, which also quantizes BD-LRNN's
``transition`` (the matrices A(x) of the recurrence), moves that model's logits by 1.2e-1.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from comparisons import same_values
from conftest import random_ids
from families import FAMILIES
from test_precision import relative_error
from torch import nn
from torch.overrides import TorchFunctionMode
from transformers import AutoModelForCausalLM

from ssmhub.models.cache_argument import CACHE_FIELD
from ssmhub.quantization import (
    FLOAT32_LINEAR_NAMES,
    dynamic_qconfig_spec,
    is_kept_float32,
    modules_to_not_convert,
    quantize_dynamic_int8,
    torchao_config,
)

INT8_UNIT_ROUNDOFF = 1 / 254  # half a step of symmetric int8 (max|w| / 127), relative to the largest weight
WEIGHT_ONLY_TOLERANCE = 8 * INT8_UNIT_ROUNDOFF  # see the module docstring
DYNAMIC_TOLERANCE = 3 * WEIGHT_ONLY_TOLERANCE  # activations rounded to 7 bits too
WIDE_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)  # SeRpEnt's clocks are float64
LM_FAMILIES = [f for f in FAMILIES if f.causal_lm is not None]
FFT_FUNCTIONS = {torch.fft.fft, torch.fft.ifft, torch.fft.rfft, torch.fft.irfft, torch.fft.fftn, torch.fft.ifftn}
FFT_FUNCTIONS |= {torch.fft.rfftn, torch.fft.irfftn}


@pytest.fixture(params=LM_FAMILIES, ids=lambda f: f.name)
def float32_lm(request):
    torch.manual_seed(0)
    return request.param.causal_lm(request.param.config()).eval()


class RecordFFTInputs(TorchFunctionMode):
    """Records the dtype of the input of every ``torch.fft`` call run inside it."""

    def __init__(self):
        super().__init__()
        self.dtypes = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in FFT_FUNCTIONS:
            self.dtypes.append(args[0].dtype)
        return func(*args, **(kwargs or {}))


def is_plain_float32(tensor: torch.Tensor) -> bool:
    """A float32 tensor that is not a quantized tensor subclass (torchao's ``Int8Tensor``...)."""
    data = tensor.data if isinstance(tensor, nn.Parameter) else tensor
    return type(data) is torch.Tensor and data.dtype == torch.float32


def linear_weight(module: nn.Module):
    """The weight of a linear layer: the attribute of ``nn.Linear`` (a torchao subclass once quantized), the
    method of ``torch.ao.nn.quantized.dynamic.Linear``."""
    weight = module.weight
    return weight() if callable(weight) else weight


def quantized_linear_names(model: nn.Module) -> list[str]:
    """Names of the linear layers whose weight is no longer a plain float32 tensor."""
    linear_types = (nn.Linear, torch.ao.nn.quantized.dynamic.Linear)
    return [
        n for n, m in model.named_modules() if isinstance(m, linear_types) and not is_plain_float32(linear_weight(m))
    ]


def assert_only_projections_quantized(model: nn.Module, ids: torch.Tensor) -> None:
    """Some projection quantized; kept linear layers, recurrence parameters, FFT inputs and states float32."""
    quantized = quantized_linear_names(model)
    assert quantized, "no linear layer quantized"
    assert not [n for n in quantized if is_kept_float32(n)], f"{FLOAT32_LINEAR_NAMES} must stay float32: {quantized}"
    assert_float32_recurrences(model, ids)


def assert_float32_recurrences(model: nn.Module, ids: torch.Tensor) -> None:
    """The parameters of the ``ssm`` submodules are plain float32; FFT inputs and cached states float32 or wider."""
    for name, module in model.named_modules():
        if name.rpartition(".")[2] == "ssm":
            tensors = [*module.named_parameters(), *module.named_buffers()]
            bad = [n for n, t in tensors if t.is_floating_point() and not is_plain_float32(t)]
            assert not bad, f"recurrence parameters of {name} not plain float32: {bad}"
    record = RecordFFTInputs()
    with torch.no_grad(), record:
        cache = getattr(model(ids, use_cache=True), CACHE_FIELD)
    assert set(record.dtypes) <= set(WIDE_DTYPES), record.dtypes
    for index, layer in enumerate(cache.layers):
        bad = {k: v.dtype for k, v in layer.items() if v.is_floating_point() and v.dtype not in WIDE_DTYPES}
        assert not bad, f"layer {index} states narrower than float32: {bad}"


def assert_near_float32(model, reference, ids, tolerance: float) -> None:
    with torch.no_grad():
        error = relative_error(model(ids).logits, reference(ids).logits)
    assert error < tolerance, f"int8 logits off float32 by {error:.3e} (relative), bound {tolerance:.3e}"


def assert_generates(model, ids) -> None:
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert out.shape == (ids.shape[0], ids.shape[1] + 4) and torch.equal(out[:, : ids.shape[1]], ids)


@contextlib.contextmanager
def quiet_loading():
    """transformers' load reports of a quantized load (expected: the quantized tensors' new names)."""
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)


def test_torchao_int8_weight_only(float32_lm, tmp_path):
    pytest.importorskip("torchao")
    ids = random_ids(2, 24)
    float32_lm.save_pretrained(tmp_path / "float32")
    with quiet_loading():
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "float32", quantization_config=torchao_config())
    assert_only_projections_quantized(model, ids)
    assert_near_float32(model, float32_lm, ids, WEIGHT_ONLY_TOLERANCE)
    assert_generates(model, ids)
    model.save_pretrained(tmp_path / "int8")
    with quiet_loading():
        reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "int8")
    assert quantized_linear_names(reloaded) == quantized_linear_names(model)
    with torch.no_grad():  # the same int8 weights loaded again: the same model up to float32 rounding
        same_values(reloaded(ids).logits, model(ids).logits, what="reloaded int8 model's logits")


def test_quantize_dynamic_as_users_call_it(float32_lm):
    """The plain call quantizes every ``nn.Linear`` (BD-LRNN's transition too, which ``quantize_dynamic_int8``
    keeps float32): it generates and leaves the recurrence parameters, FFTs and states float32."""
    ids = random_ids(2, 24)
    model = torch.ao.quantization.quantize_dynamic(float32_lm, {nn.Linear}, dtype=torch.qint8)
    assert quantized_linear_names(model)
    assert_float32_recurrences(model, ids)
    assert_generates(model, ids)


def test_quantize_dynamic_int8(float32_lm):
    ids = random_ids(2, 24)
    model = quantize_dynamic_int8(float32_lm)
    assert "lm_head" in quantized_linear_names(model)
    assert not quantized_linear_names(float32_lm), "the float32 model must be left as it was"
    assert_only_projections_quantized(model, ids)
    assert_near_float32(model, float32_lm, ids, DYNAMIC_TOLERANCE)
    assert_generates(model, ids)


def test_kept_modules_match_transformers_patterns(float32_lm):
    """transformers' own matcher reads ``modules_to_not_convert()`` as ``is_kept_float32`` does, plus the head;
    ``dynamic_qconfig_spec`` keeps the same layers (and the head on request)."""
    from transformers.quantizers.quantizers_utils import should_convert_module

    spec = dynamic_qconfig_spec(float32_lm, quantize_lm_head=False)
    for name, module in float32_lm.named_modules():
        if isinstance(module, nn.Linear):
            kept = is_kept_float32(name) or name == "lm_head"
            assert should_convert_module(f"{name}.weight", modules_to_not_convert()) is not kept, name
            assert (spec.get(name, "quantized") is None) is kept, name


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: dynamic_qconfig_spec("model"), "model must be a torch.nn.Module"),
        (lambda: quantize_dynamic_int8(nn.Linear(2, 2), quantize_lm_head=1), "quantize_lm_head must be a bool"),
    ],
)
def test_bad_arguments(call, message):
    with pytest.raises(TypeError, match=message):
        call()
