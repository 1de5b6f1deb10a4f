"""direct_conv_tail (a continuation of a few tokens convolved directly) is the tail of the whole causal convolution,
values and gradients, against the dense Toeplitz reference in float64; causal_conv takes it up to DIRECT_TAIL_MAX
new tokens and agrees with the FFT path there."""

import pytest
import torch

from ssmhub.ops.fftconv import fft_conv_ref, fft_conv_tail
from ssmhub.ops.longconv import DIRECT_TAIL_MAX, causal_conv, direct_conv_tail


@pytest.mark.parametrize(
    ("past", "seq_len", "kernel_len"),
    [(15, 16, 16), (3, 16, 16), (0, 5, 9), (40, 7, 12), (31, 1, 32), (8, 33, 50), (2, 3, 40)],  # K' above, at, below
)
def test_direct_tail_is_the_tail_of_the_whole_convolution(past, seq_len, kernel_len):
    gen = torch.Generator().manual_seed(past + seq_len)
    history = torch.randn(2, 3, past, generator=gen, dtype=torch.float64).requires_grad_()
    u = torch.randn(2, 3, seq_len, generator=gen, dtype=torch.float64).requires_grad_()
    kernel = torch.randn(3, kernel_len, generator=gen, dtype=torch.float64).requires_grad_()
    weights = torch.randn(2, 3, seq_len, generator=gen, dtype=torch.float64)
    fast = direct_conv_tail(torch.cat([history, u], -1), kernel, seq_len)
    exact = fft_conv_ref(torch.cat([history, u], -1), kernel)[..., past:]
    assert fast.dtype == torch.float32 and fast.shape == exact.shape
    torch.testing.assert_close(fast.double(), exact, atol=1e-4, rtol=1e-4)
    grads = [torch.autograd.grad((y * weights).sum(), [history, u, kernel]) for y in (fast.double(), exact)]
    for mine, theirs in zip(*grads):
        torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("seq_len", [1, DIRECT_TAIL_MAX, DIRECT_TAIL_MAX + 1])
def test_causal_conv_continuations_agree_on_both_sides_of_the_switch(seq_len):
    gen = torch.Generator().manual_seed(seq_len)
    history, u = torch.randn(1, 8, 63, generator=gen), torch.randn(1, 8, seq_len, generator=gen)
    kernel = torch.randn(8, 64, generator=gen)
    y, _ = causal_conv(u, kernel, initial_state=history)
    stream = torch.cat([history, u], -1)
    torch.testing.assert_close(y, fft_conv_tail(stream, kernel, seq_len), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(y, direct_conv_tail(stream, kernel, seq_len), atol=1e-4, rtol=1e-4)


def test_a_tail_longer_than_the_stream_is_refused():
    with pytest.raises(ValueError, match="num_outputs must be in \\[1, 4\\]"):
        direct_conv_tail(torch.zeros(1, 2, 4), torch.zeros(2, 3), 5)
