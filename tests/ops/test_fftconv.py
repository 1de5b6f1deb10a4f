"""fft_conv against the dense Toeplitz reference: values, gradients, causality, autocast."""

import math

import pytest
import torch
from fftconv_helpers import assert_fp32_conv_under_autocast

from ssmhub.ops.fftconv import fft_conv, fft_conv_continue, fft_conv_ref, fft_conv_tail, fft_size, smooth_fft_size
from ssmhub.ops.longconv import causal_conv_ref

LENGTHS = [1, 2, 7, 16, 100, 257, 1024]


@pytest.mark.parametrize("seq_len", LENGTHS)
@pytest.mark.parametrize("kernel_len", ["same", "shorter", "longer"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_matches_reference(seq_len, kernel_len, bidirectional):
    gen = torch.Generator().manual_seed(seq_len)
    k_len = {"same": seq_len, "shorter": max(1, seq_len // 3), "longer": 2 * seq_len + 5}[kernel_len]
    u = torch.randn(2, 3, seq_len, generator=gen, dtype=torch.float64).float()
    kernel = torch.randn(3, k_len, generator=gen)
    backward = torch.randn(3, k_len, generator=gen) if bidirectional else None
    torch.testing.assert_close(fft_conv(u, kernel, backward), fft_conv_ref(u, kernel, backward), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize(
    ("batch", "seq_len", "kernel_len"),
    [((2,), 33, 33), ((2, 3), 40, 11), ((1,), 1, 5), ((3,), 17, 50)],  # batch dims, shorter and longer kernels
)
@pytest.mark.parametrize("u_requires_grad", [True, False])
def test_gradients_match_reference(bidirectional, batch, seq_len, kernel_len, u_requires_grad):
    """The hand-written backward (real FFTs, the kernel gradient summed over every batch dim) against
    autograd through the dense Toeplitz product in float64."""
    gen = torch.Generator().manual_seed(seq_len)
    u = torch.randn(*batch, 4, seq_len, generator=gen, requires_grad=u_requires_grad)
    kernel = torch.randn(4, kernel_len, generator=gen, requires_grad=True)
    backward = torch.randn(4, 20, generator=gen, requires_grad=True) if bidirectional else None
    weight = torch.randn(*batch, 4, seq_len, generator=gen)
    inputs = [t for t in (u, kernel, backward) if t is not None and t.requires_grad]
    unused = {"allow_unused": True, "materialize_grads": True}  # at L = 1 no backward tap is used
    fast = torch.autograd.grad((fft_conv(u, kernel, backward) * weight).sum(), inputs, **unused)
    slow = torch.autograd.grad((fft_conv_ref(u, kernel, backward) * weight).sum(), inputs, **unused)
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_no_wraparound_leaks_future_tokens():
    """Output t of the causal convolution must not depend on any input after t, even with a kernel
    as long as the sequence (an FFT of size L would wrap the kernel's tail onto earlier positions and
    give O(1) gradients there; what remains is FFT round-off, ~1e-7 of the gradient's scale)."""
    seq_len = 64
    u = torch.randn(1, 2, seq_len, requires_grad=True)
    kernel = torch.randn(2, seq_len)
    y = fft_conv(u, kernel)
    for t in (0, 10, seq_len - 2):
        (grad,) = torch.autograd.grad(y[..., t].sum(), u, retain_graph=True)
        assert grad[..., t + 1 :].abs().max() < 1e-5 * grad[..., : t + 1].abs().max()


def test_fft_size_covers_linear_convolution():
    assert fft_size(1) == 1 and fft_size(2) == 2 and fft_size(3) == 4 and fft_size(1024) == 1024
    assert fft_size(1025) == 2048


def test_smooth_fft_size_is_the_smallest_5_smooth_size_that_covers_the_length():
    def smooth(n):
        for p in (2, 3, 5):
            while n % p == 0:
                n //= p
        return n == 1

    for length in range(1, 3000):
        expected = next(n for n in range(length, 2 * length + 1) if smooth(n))
        assert smooth_fft_size(length) == expected, length
    assert smooth_fft_size(1151) == 1152 and smooth_fft_size(1024) == 1024


@pytest.mark.parametrize(
    ("past", "seq_len", "kernel_len"),
    # K − 1 above, at, below M; n = M + L (no zero padding: 8 + 8 = 16 is 5-smooth); no history; K > M + L
    [(15, 16, 16), (8, 8, 5), (40, 7, 12), (0, 5, 9), (3, 40, 50), (63, 64, 64)],
)
def test_continuation_in_one_fft_input_matches_the_loop(past, seq_len, kernel_len):
    """fft_conv_continue (the stream written once into the zero-padded FFT input) against the float64 double loop
    causal_conv_ref continuing from the history, values and gradients; the stream it hands back is [history ; u]."""
    gen = torch.Generator().manual_seed(past * 7 + seq_len)
    history = torch.randn(2, 3, past, generator=gen, dtype=torch.float64).requires_grad_()
    u = torch.randn(2, 3, seq_len, generator=gen, dtype=torch.float64).requires_grad_()
    kernel = torch.randn(3, kernel_len, generator=gen, dtype=torch.float64).requires_grad_()
    weights = torch.randn(2, 3, seq_len, generator=gen, dtype=torch.float64)
    fast, stream = fft_conv_continue(history.float(), u.float(), kernel.float())
    assert fast.dtype == torch.float32 and fast.shape == u.shape
    torch.testing.assert_close(stream, torch.cat([history, u], -1).float(), rtol=0, atol=0)  # a copy of the inputs
    exact = causal_conv_ref(u, kernel, initial_state=history)
    # float32 FFT round-off: eps · log2(n) · |kernel|_2 · |stream or weights|_2 (Cauchy-Schwarz on one output's sum)
    n = smooth_fft_size(seq_len + max(past, kernel_len - 1))
    norms = max(t.detach().norm(dim=-1).max().item() for t in (torch.cat([history, u], -1), weights))
    tolerance = 8 * torch.finfo(torch.float32).eps * math.log2(n) * kernel.detach().norm(dim=-1).max().item() * norms
    torch.testing.assert_close(fast.double(), exact, atol=tolerance, rtol=tolerance)
    grads = [torch.autograd.grad((y * weights).sum(), [history, u, kernel]) for y in (fast.double(), exact)]
    for mine, theirs in zip(*grads):
        torch.testing.assert_close(mine, theirs, atol=tolerance, rtol=tolerance)


def test_continuation_needs_a_history_matching_u():
    with pytest.raises(ValueError, match="history must have shape"):
        fft_conv_continue(torch.zeros(2, 3, 4), torch.zeros(1, 3, 4), torch.zeros(3, 4))


def test_fp32_under_autocast():
    """Under bf16 autocast (and for bf16 inputs) the FFTs still run in float32: the kernel's small long tail
    is resolved to float32 round-off, and a bf16 input gets the float32 result rounded once to bf16."""
    assert_fp32_conv_under_autocast(fft_conv)


@pytest.mark.parametrize(
    ("u_shape", "k_shape", "message"),
    [((3, 0), (3, 4), "length 0"), ((2, 3, 8), (4, 8), "shape \\(H, K\\)"), ((8,), (1, 8), "shape")],
)
def test_bad_shapes_raise(u_shape, k_shape, message):
    with pytest.raises(ValueError, match=message):
        fft_conv(torch.zeros(u_shape), torch.zeros(k_shape))


@pytest.mark.parametrize(
    ("past", "seq_len", "kernel_len"),
    [(15, 16, 16), (3, 16, 16), (0, 5, 9), (40, 7, 12), (31, 1, 32), (8, 33, 50)],  # K − 1 above, at, below M
)
def test_continued_convolution_is_the_tail_of_the_whole_one(past, seq_len, kernel_len):
    """Overlap-save (a circular FFT of L + max(M, K − 1) points) gives the last L outputs of the linear
    convolution of [history, u], and their gradients, against the dense Toeplitz reference in float64."""
    gen = torch.Generator().manual_seed(past + seq_len)
    history = torch.randn(2, 3, past, generator=gen, dtype=torch.float64).requires_grad_()
    u = torch.randn(2, 3, seq_len, generator=gen, dtype=torch.float64).requires_grad_()
    kernel = torch.randn(3, kernel_len, generator=gen, dtype=torch.float64).requires_grad_()
    weights = torch.randn(2, 3, seq_len, generator=gen, dtype=torch.float64)
    fast = fft_conv_tail(torch.cat([history, u], -1).float(), kernel.float(), seq_len)
    exact = fft_conv_ref(torch.cat([history, u], -1), kernel)[..., past:]
    torch.testing.assert_close(fast.double(), exact, atol=1e-4, rtol=1e-4)
    grads = [torch.autograd.grad((y * weights).sum(), [history, u, kernel]) for y in (fast.double(), exact)]
    for mine, theirs in zip(*grads):
        torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)
