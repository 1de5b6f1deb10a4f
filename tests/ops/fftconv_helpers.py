"""Helpers shared by the FFT-convolution tests (fft_conv, the Butterfly and Triton backends): a comparison
scaled to float32 FFT round-off, and the check that a convolution stays float32 under bf16 autocast."""

from __future__ import annotations

import torch
from comparisons import FP32_REL as FP32_FFT_REL
from comparisons import scaled_close
from devices import bf16_autocast

from ssmhub.ops.fftconv import fft_conv_ref

# bfloat16 keeps 8 significant bits: rounding a value to the nearest bfloat16 moves it by at most 2^-8 of itself.
BF16_UNIT_ROUNDOFF = 2.0**-8


def long_tail_inputs(seed=1, heads=3, length=300):
    """u (2, H, L) of bfloat16-representable values and a kernel whose first tap is 1 and whose L − 1 later
    taps are ~1e-3: the long, small tail that a half-precision FFT loses, ~1% of the output here."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(2, heads, length, generator=gen).bfloat16().float()
    kernel = torch.randn(heads, length, generator=gen) * 1e-3
    kernel[:, 0] = 1.0
    return u, kernel


def assert_fp32_conv_under_autocast(conv):
    """``conv(u, kernel)`` (an FFT convolution) computes in float32 under bf16 autocast, as
    :mod:`ssmhub.ops.fftconv` promises, outputs and gradients, on :func:`long_tail_inputs`:

    1. float32 ``u`` under autocast: a float32 result whose error is float32 FFT round-off. Measured on the part
       the kernel's tail contributes (the output minus the first tap's ``u``): its relative error may be at most
       ``FP32_FFT_REL · max|y| / max|tail|`` (8e-4 here; measured 1e-5), while a bf16 FFT errs by 15-30% of the
       tail (~2^-9 of the output) and a dropped tail by 100%. The input and kernel gradients match float64
       autograd to float32 round-off.
    2. bfloat16 ``u``, with and without autocast: a bfloat16 result that is the float64 reference rounded once to
       bfloat16, elementwise ``|y − ref| <= 2^-8·|ref| + FP32_FFT_REL · max|ref|``. A bf16 computation errs by
       ~2^-9 of the largest output everywhere, past the bound of the smaller elements (a third to a half of them
       fail); dropping the tail fails three quarters, dropping only the last tap still a few.
    """
    u, kernel = long_tail_inputs()
    reference = fft_conv_ref(u.double(), kernel.double())  # (2, H, L) float64
    first_tap = kernel[:, :1].double() * u.double()

    u32, kernel32 = u.clone().requires_grad_(), kernel.clone().requires_grad_()
    with bf16_autocast():
        y = conv(u32, kernel32)
    assert y.dtype == torch.float32
    tail, tail_ref = y.double() - first_tap, reference - first_tap
    tail_error = ((tail - tail_ref).abs().max() / tail_ref.abs().max()).item()
    tolerance = FP32_FFT_REL * (reference.abs().max() / tail_ref.abs().max()).item()
    assert tolerance < 1e-2, "the inputs no longer separate float32 from bfloat16 round-off"
    assert tail_error <= tolerance, f"the tail's relative error {tail_error:.2e} exceeds float32's {tolerance:.2e}"
    weight = torch.randn(u.shape, generator=torch.Generator().manual_seed(2))
    got = torch.autograd.grad((y * weight).sum(), (u32, kernel32))
    u64, kernel64 = u.double().requires_grad_(), kernel.double().requires_grad_()
    expected = torch.autograd.grad((fft_conv_ref(u64, kernel64) * weight.double()).sum(), (u64, kernel64))
    for name, a, b in zip(("u", "kernel"), got, expected):
        assert a.dtype == torch.float32, name
        scaled_close(a, b, what=f"gradient of {name} under autocast")

    for autocast in (True, False):
        with bf16_autocast(enabled=autocast):
            y = conv(u.bfloat16(), kernel)
        assert y.dtype == torch.bfloat16
        error = (y.double() - reference).abs()
        bound = BF16_UNIT_ROUNDOFF * reference.abs() + FP32_FFT_REL * reference.abs().max()
        outside = (error > bound).double().mean().item()
        assert outside == 0, f"autocast={autocast}: {outside:.1%} of the elements are not the float32 result rounded"
