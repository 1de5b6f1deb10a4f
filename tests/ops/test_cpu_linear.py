"""ssmhub.ops.cpu_linear: oneDNN's matmul against the float64 product, at shapes a decode step and a prefill use (one
row, 33 rows, a 3-d batch, a strided input, with and without a bias), and ``F.linear`` itself, bit for bit, wherever
the fast path must not run (a gradient asked for, bfloat16, a product too small to pay back, a tensor subclass)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ssmhub.ops import cpu_linear as module
from ssmhub.ops.cpu_linear import MIN_MULTIPLY_ADDS, cpu_linear, onednn_linear_fits

EPS32 = torch.finfo(torch.float32).eps
needs_onednn = pytest.mark.skipif(module._onednn_linear() is None, reason="this torch build has no oneDNN")


def _tolerance(x: torch.Tensor, weight: torch.Tensor) -> float:
    """float32 round-off of a sum of ``in`` products: in · eps · max|x| · max|w| (plus the bias's one rounding)."""
    return (x.shape[-1] + 2) * EPS32 * x.abs().amax().item() * weight.abs().amax().item()


@needs_onednn
@pytest.mark.parametrize(
    "lead, features_in, features_out, bias",
    [((1,), 1027, 1031, True), ((33,), 257, 509, False), ((2, 7), 384, 771, True), ((5,), 4096, 300, True)],
    ids=["one row, odd widths", "33 rows, no bias", "3-d batch", "long rows"],
)
def test_onednn_product_equals_the_float64_product(lead, features_in, features_out, bias):
    g = torch.Generator().manual_seed(features_in)
    x = torch.randn(*lead, features_in, generator=g)
    weight = torch.randn(features_out, features_in, generator=g)
    b = torch.randn(features_out, generator=g) if bias else None
    assert onednn_linear_fits(x, weight, b)
    want = F.linear(x.double(), weight.double(), None if b is None else b.double())
    got = cpu_linear(x, weight, b)
    assert got.dtype == torch.float32 and got.shape == (*lead, features_out)
    assert (got.double() - want).abs().max().item() <= _tolerance(x, weight)


@needs_onednn
def test_a_strided_input_is_read_as_its_values():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 12, generator=g).t()  # (12, 1024), transposed: not contiguous
    weight = torch.randn(700, 1024, generator=g)
    assert not x.is_contiguous() and onednn_linear_fits(x, weight)
    want = F.linear(x.double(), weight.double())
    assert (cpu_linear(x, weight).double() - want).abs().max().item() <= _tolerance(x, weight)


class _Marked(torch.Tensor):
    """A tensor subclass, standing for a quantized or distributed weight."""


@pytest.mark.parametrize("case", ["gradient", "bfloat16", "small", "subclass", "width mismatch"])
def test_falls_back_to_f_linear_where_the_op_does_not_apply(case):
    g = torch.Generator().manual_seed(1)
    x, weight = torch.randn(8, 512, generator=g), torch.randn(512, 512, generator=g)
    if case == "gradient":
        weight.requires_grad_(True)
    elif case == "bfloat16":
        x, weight = x.bfloat16(), weight.bfloat16()
    elif case == "small":
        x = x[:1, :64]
        weight = weight[:64, :64]
        assert x.shape[0] * weight.numel() < MIN_MULTIPLY_ADDS
    elif case == "subclass":
        weight = weight.as_subclass(_Marked)
    if case == "width mismatch":
        weight = weight[:, :511]
        assert not onednn_linear_fits(x, weight)
        with pytest.raises(RuntimeError):  # F.linear's own error, not a oneDNN one
            cpu_linear(x, weight)
        return
    assert not onednn_linear_fits(x, weight)
    got = cpu_linear(x, weight)
    assert torch.equal(got, F.linear(x, weight))  # the same op on the same inputs
    if case == "gradient":
        got.sum().backward()
        assert weight.grad is not None and weight.grad.shape == weight.shape


@needs_onednn
def test_no_grad_mode_takes_the_op_even_for_a_parameter():
    weight = torch.nn.Parameter(torch.randn(1024, 1024))
    x = torch.randn(4, 1024)
    assert not onednn_linear_fits(x, weight)
    with torch.no_grad():
        assert onednn_linear_fits(x, weight)
    with torch.inference_mode():
        assert onednn_linear_fits(x, weight)
