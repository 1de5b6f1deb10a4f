"""The fused Triton FlashButterfly kernel (ssmhub.ops.triton) against the dense reference: values and the
custom backward. On a CPU-only machine it runs under TRITON_INTERPRET=1; skipped without triton."""

import os

import pytest
import torch
from comparisons import scaled_close

from ssmhub.ops.fftconv import fft_conv_ref
from ssmhub.ops.triton import MAX_FFT_SIZE, can_run, triton_conv

if not torch.cuda.is_available():  # the kernels are decorated (interpreted or compiled) at the first Triton call
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(
    not can_run(DEVICE, 256)[0], reason="Triton cannot run here: " + can_run(DEVICE, 256)[1]
)


def reference(u, kernel, backward, skip):
    y = fft_conv_ref(u.double(), kernel.double(), None if backward is None else backward.double())
    return y if skip is None else y + skip.double()[:, None] * u.double()


@pytest.mark.parametrize("seq_len", [1, 16, 100, 1000, 2048])
@pytest.mark.parametrize("rows", [1, 3])  # an odd row count leaves the last row without an imaginary partner
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("with_skip", [False, True])
def test_values_match_reference(seq_len, rows, bidirectional, with_skip):
    if bidirectional and 2 * seq_len > MAX_FFT_SIZE:
        pytest.skip("FFT size over the fused kernel's limit (fft_conv falls back; see test_fftconv_backends)")
    gen = torch.Generator().manual_seed(seq_len + rows)
    heads = 2
    u = torch.randn(rows, heads, seq_len, generator=gen)
    kernel = torch.randn(heads, seq_len, generator=gen)
    backward = torch.randn(heads, max(1, seq_len // 2), generator=gen) if bidirectional else None
    skip = torch.randn(heads, generator=gen) if with_skip else None
    to = {"device": DEVICE}
    got = triton_conv(
        u.to(**to),
        kernel.to(**to),
        None if backward is None else backward.to(**to),
        None if skip is None else skip.to(**to),
    )
    scaled_close(got, reference(u, kernel, backward, skip))


@pytest.mark.parametrize("bidirectional", [False, True])
def test_backward_matches_reference(bidirectional):
    """The custom backward: du by the same fused kernel with the conjugate spectrum (+ skip·dy), the
    circulant's gradient by the batch-accumulated cross-spectrum kernel, dskip = Σ u·dy."""
    gen = torch.Generator().manual_seed(5)
    u = torch.randn(3, 4, 300, generator=gen).to(DEVICE).requires_grad_()
    kernel = torch.randn(4, 300, generator=gen).to(DEVICE).requires_grad_()
    backward = torch.randn(4, 40, generator=gen).to(DEVICE).requires_grad_() if bidirectional else None
    skip = torch.randn(4, generator=gen).to(DEVICE).requires_grad_()
    weight = torch.randn(3, 4, 300, generator=gen).to(DEVICE)
    named = {"u": u, "kernel": kernel, "kernel_backward": backward, "skip": skip}
    named = {name: t for name, t in named.items() if t is not None}
    got = torch.autograd.grad((triton_conv(u, kernel, backward, skip) * weight).sum(), list(named.values()))
    exact = {name: t.detach().double().requires_grad_() for name, t in named.items()}  # float64 leaves
    expected_y = reference(exact["u"], exact["kernel"], exact.get("kernel_backward"), exact["skip"])
    expected = torch.autograd.grad((expected_y * weight.double()).sum(), list(exact.values()))
    for name, a, b in zip(named, got, expected):
        scaled_close(a, b, what=f"gradient of {name}")


def test_leading_dims_dtype_and_limits():
    gen = torch.Generator().manual_seed(2)
    u = torch.randn(2, 3, 4, 50, generator=gen).to(DEVICE)  # (..., H, L) with two leading dims
    kernel = torch.randn(4, 20, generator=gen).to(DEVICE)
    y = triton_conv(u, kernel)
    assert y.shape == u.shape and y.dtype == torch.float32
    scaled_close(y, reference(u.cpu(), kernel.cpu(), None, None))
    assert triton_conv(u.double(), kernel).dtype == torch.float64  # returns the input's dtype
    with pytest.raises(ValueError, match="on-chip limit"):
        triton_conv(torch.zeros(1, 1, MAX_FFT_SIZE, device=DEVICE), torch.zeros(1, MAX_FFT_SIZE, device=DEVICE))
    with pytest.raises(ValueError, match="skip"):
        triton_conv(u, kernel, skip=torch.zeros(3, device=DEVICE))


def test_tables_cached_under_inference_mode_serve_autograd():
    """The cached DFT tables are normal tensors even when first built in inference mode: a later backward
    through them gives the reference's kernel gradient (the batch-accumulated cross-spectrum kernel)."""
    from ssmhub.ops.triton import _tables

    _tables.cache_clear()
    gen = torch.Generator().manual_seed(0)
    u, kernel, weight = (torch.randn(shape, generator=gen).to(DEVICE) for shape in ((1, 2, 40), (2, 40), (1, 2, 40)))
    with torch.inference_mode():
        triton_conv(u, kernel)
    kernel.requires_grad_()
    (got,) = torch.autograd.grad((triton_conv(u, kernel) * weight).sum(), kernel)
    (expected,) = torch.autograd.grad((fft_conv_ref(u.double(), kernel.double()) * weight).sum(), kernel)
    scaled_close(got, expected.double())
