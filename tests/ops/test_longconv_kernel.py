"""Long-conv kernel regularizers, inits and the stateful causal convolution (long-conv paper §3.1, Alg. 1)."""

import math

import pytest
import torch
from comparisons import scaled_close

from ssmhub.ops.longconv import (
    CODE_ORDER,
    DIRECT_TAIL_MAX,
    PAPER_ORDER,
    causal_conv,
    causal_conv_ref,
    causal_conv_step,
    geometric_decay_init,
    random_init,
    regularize_kernel,
    smooth_kernel,
    smooth_kernel_frequency,
    squash_kernel,
)


def _smooth_naive(k, p):
    """Centred window k-p..k+p, zeros outside, always divided by 2p+1 (safari AvgPool1d, count_include_pad)."""
    length = k.shape[-1]
    out = torch.zeros_like(k)
    for t in range(length):
        for s in range(t - p, t + p + 1):
            if 0 <= s < length:
                out[..., t] += k[..., s]
    return out / (2 * p + 1)


def test_squash_hand_values():
    k = torch.tensor([[-0.5, -0.1, 0.0, 0.05, 0.1, 0.3]], dtype=torch.float64)
    expected = torch.tensor([[-0.4, 0.0, 0.0, 0.0, 0.0, 0.2]], dtype=torch.float64)
    torch.testing.assert_close(squash_kernel(k, 0.1), expected)
    assert squash_kernel(k, 0.0) is k


def test_squash_is_the_l1_prox():
    """argmin_x λ|x| + ½(x − k)² is soft-thresholding at λ, checked on a dense grid."""
    lam, grid = 0.2, torch.linspace(-2, 2, 40001, dtype=torch.float64)
    for value in (-1.3, -0.15, 0.05, 0.7):
        objective = lam * grid.abs() + 0.5 * (grid - value) ** 2
        best = grid[objective.argmin()]
        assert abs(squash_kernel(torch.tensor([value], dtype=torch.float64), lam).item() - best.item()) < 1e-3


@pytest.mark.parametrize("p", [0, 1, 3])
@pytest.mark.parametrize("length", [1, 2, 5, 17])
def test_smooth_matches_naive_loop(p, length):
    k = torch.randn(2, 3, length, dtype=torch.float64)
    torch.testing.assert_close(smooth_kernel(k, p), _smooth_naive(k, p))


def test_smooth_hand_values_and_zero_padded_ends():
    k = torch.tensor([[3.0, 6.0, 9.0, 12.0]])
    # p = 1: (0+3+6)/3, (3+6+9)/3, (6+9+12)/3, (9+12+0)/3
    torch.testing.assert_close(smooth_kernel(k, 1), torch.tensor([[3.0, 6.0, 9.0, 7.0]]))
    assert smooth_kernel(k, 0) is k


def test_smooth_frequency_matches_naive():
    k = torch.randn(3, 11, dtype=torch.float64)
    p = 2
    spectrum = torch.fft.rfft(k)
    taps = [math.exp(-0.5 * (i - p) ** 2) for i in range(2 * p + 1)]
    smoothed = torch.zeros_like(spectrum)
    for f in range(spectrum.shape[-1]):
        for i, w in enumerate(taps):
            src = f + i - p
            if 0 <= src < spectrum.shape[-1]:
                smoothed[:, f] += w * spectrum[:, src]
    expected = torch.fft.irfft(smoothed, n=11)
    out = smooth_kernel_frequency(k, p)
    assert out.shape == k.shape  # odd length kept (irfft with n = L)
    torch.testing.assert_close(out, expected)


def test_regularize_order_and_defaults():
    k = torch.randn(4, 20, dtype=torch.float64)
    assert PAPER_ORDER == ("dropout", "smooth", "squash")
    assert CODE_ORDER == ("smooth", "squash", "dropout")
    paper = regularize_kernel(k, squash_lambda=0.1, smooth_width=1)
    torch.testing.assert_close(paper, squash_kernel(smooth_kernel(k, 1), 0.1))
    swapped = regularize_kernel(k, ("squash", "smooth"), squash_lambda=0.1, smooth_width=1)
    torch.testing.assert_close(swapped, smooth_kernel(squash_kernel(k, 0.1), 1))
    assert not torch.allclose(paper, swapped)
    # dropout is training-only; in training it zeroes some taps and rescales the others by 1/(1-p)
    torch.testing.assert_close(regularize_kernel(k, CODE_ORDER, dropout=0.5), k)
    torch.manual_seed(0)
    dropped = regularize_kernel(k, ("dropout",), dropout=0.5, training=True)
    kept = dropped != 0
    assert 0 < kept.sum() < k.numel()
    torch.testing.assert_close(dropped[kept], 2 * k[kept])


def test_random_init_scale_and_generator():
    a = random_init(64, 256, generator=torch.Generator().manual_seed(1))
    b = random_init(64, 256, generator=torch.Generator().manual_seed(1))
    assert a.shape == (64, 256) and a.dtype == torch.float32
    torch.testing.assert_close(a, b)
    assert abs(a.std().item() - 0.002) < 1e-4


@pytest.mark.parametrize("convention", ["paper", "code"])
def test_geometric_init_matches_formula(convention):
    channels, length, std = 6, 9, 0.02
    k = geometric_decay_init(channels, length, std, convention, generator=torch.Generator().manual_seed(3))
    x = torch.randn(channels, length, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * std
    expected = torch.empty(channels, length, dtype=torch.float64)
    for h in range(channels):
        for j in range(length):
            if convention == "paper":  # K^{(h)}_k = x exp(-k N^-1 (H/2)^{h/H}), 1-indexed
                expected[h, j] = math.exp(-(j + 1) / length * (channels / 2) ** ((h + 1) / channels))
            else:  # safari double_exp: exp(-(j/L) * int(H/2) ** (i/H)), 0-indexed
                expected[h, j] = math.exp(-(j / length) * int(channels / 2) ** (h / channels))
    torch.testing.assert_close(k, (x * expected).float())


def test_bad_arguments_name_the_argument():
    k = torch.randn(2, 5)
    with pytest.raises(ValueError, match="lam"):
        squash_kernel(k, -0.1)
    with pytest.raises(ValueError, match="width_p"):
        smooth_kernel(k, -1)
    with pytest.raises(ValueError, match="width_p"):
        smooth_kernel_frequency(k, -1)
    with pytest.raises(ValueError, match="kernel length"):
        smooth_kernel(torch.randn(2, 0), 1)
    with pytest.raises(ValueError, match="kernel length"):
        squash_kernel(torch.randn(2, 0), 0.1)
    with pytest.raises(ValueError, match="length"):
        random_init(2, 0)
    with pytest.raises(ValueError, match="length"):
        geometric_decay_init(2, 0)
    with pytest.raises(ValueError, match="num_channels"):
        geometric_decay_init(0, 4)
    with pytest.raises(ValueError, match="squash_lambda"):
        regularize_kernel(k, squash_lambda=-1.0)
    with pytest.raises(ValueError, match="smooth_width"):
        regularize_kernel(k, smooth_width=-2)
    with pytest.raises(ValueError, match="order"):
        regularize_kernel(k, ("smooth", "blur"))
    with pytest.raises(ValueError, match="dropout"):
        regularize_kernel(k, dropout=1.0)


def _conv_by_prepending(u, kernel, skip, history):
    """The stateful convolution by its definition: the float64 loop :func:`causal_conv_ref` run on the stream
    ``[history ; u]`` from a zero start, its first M outputs dropped, plus the skip; and the window of the
    last M inputs of that stream. Differentiable in every argument."""
    window = history.shape[-1]
    stream = torch.cat([history, u], dim=-1)
    y = causal_conv_ref(stream, kernel)[..., window:] + skip[:, None] * u
    return y, stream[..., stream.shape[-1] - window :]


# (batch shape, H channels, L inputs, K taps, M window)
CONV_SHAPES = [
    pytest.param((2,), 3, 12, 5, 4, id="kernel_shorter_than_input"),
    pytest.param((3,), 2, 8, 8, 7, id="kernel_as_long_as_input"),
    pytest.param((2,), 4, 6, 11, 5, id="kernel_longer_than_input"),
    pytest.param((2, 2), 3, 5, 20, 2, id="taps_beyond_window_and_input"),  # K > M + L: they meet nothing
    pytest.param((2,), 3, 4, 6, 7, id="window_longer_than_input"),  # the final window keeps part of the first
    pytest.param((), 2, 7, 3, 2, id="unbatched"),  # u of shape (H, L)
    # more new inputs than DIRECT_TAIL_MAX: a continuation goes through the FFT (overlap-save, fft_conv_continue)
    pytest.param((2,), 3, DIRECT_TAIL_MAX + 8, DIRECT_TAIL_MAX + 13, DIRECT_TAIL_MAX + 12, id="fft_continuation"),
]


@pytest.mark.parametrize("with_state", [True, False], ids=["from_state", "from_zeros"])
@pytest.mark.parametrize("batch, channels, length, taps, window", CONV_SHAPES)
def test_causal_conv_matches_float64_loop_with_gradients(batch, channels, length, taps, window, with_state):
    """causal_conv (float32 FFT) against the float64 double loop on ``[initial_state ; u]``: the outputs, the
    final window and the gradients with respect to u, the kernel, the skip and the initial state."""
    gen = torch.Generator().manual_seed(length * 100 + taps)
    u = torch.randn(*batch, channels, length, generator=gen)
    kernel, skip = torch.randn(channels, taps, generator=gen), torch.randn(channels, generator=gen)
    history = (
        torch.randn(*batch, channels, window, generator=gen) if with_state else torch.zeros(*batch, channels, window)
    )
    weight_y, weight_final = torch.randn(u.shape, generator=gen), torch.randn(history.shape, generator=gen)
    leaves = [t.clone().requires_grad_() for t in (u, kernel, skip, history)]
    state_args = {"initial_state": leaves[3]} if with_state else {"state_length": window}
    y, final = causal_conv(leaves[0], leaves[1], leaves[2], return_final_state=True, **state_args)
    grads = torch.autograd.grad((y * weight_y).sum() + (final * weight_final).sum(), leaves, allow_unused=True)

    ref_leaves = [t.double().requires_grad_() for t in (u, kernel, skip, history)]
    y_ref, final_ref = _conv_by_prepending(*ref_leaves)
    loss_ref = (y_ref * weight_y.double()).sum() + (final_ref * weight_final.double()).sum()
    grads_ref = torch.autograd.grad(loss_ref, ref_leaves)

    scaled_close(y, y_ref.detach(), what="y")
    torch.testing.assert_close(final, final_ref.detach().float(), rtol=0, atol=0)  # a copy of the inputs
    names = ("u", "kernel", "skip", "initial_state") if with_state else ("u", "kernel", "skip")
    for name, grad, grad_ref in zip(names, grads, grads_ref):
        scaled_close(grad, grad_ref, what=f"grad {name}")
    if with_state:  # the oracle's own initial_state path is the same definition
        scaled_close(causal_conv_ref(u, kernel, skip, initial_state=history), y_ref.detach(), 1e-12, "ref")


def test_causal_conv_matches_loop_and_continues_from_state():
    torch.manual_seed(0)
    u = torch.randn(2, 3, 12)
    kernel, skip = torch.randn(3, 5), torch.randn(3)
    y, final = causal_conv(u, kernel, skip, return_final_state=True, state_length=4)
    torch.testing.assert_close(y.double(), causal_conv_ref(u, kernel, skip), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final, u[..., -4:])
    # split in a prefill, one step at a time, and a second chunk
    y_a, state = causal_conv(u[..., :3], kernel, skip, return_final_state=True, state_length=4)
    outs = [y_a]
    for t in range(3, 7):
        y_t, state = causal_conv_step(u[..., t], state, kernel, skip)
        outs.append(y_t.unsqueeze(-1))
    y_b, state = causal_conv(u[..., 7:], kernel, skip, initial_state=state, return_final_state=True)
    torch.testing.assert_close(torch.cat([*outs, y_b], -1), y, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, final)


def test_causal_conv_empty_window():
    u, kernel = torch.randn(1, 2, 6), torch.randn(2, 1)
    y, final = causal_conv(u, kernel, return_final_state=True, state_length=0)
    torch.testing.assert_close(y, kernel[:, 0, None] * u)
    assert final.shape == (1, 2, 0)
    y_t, state = causal_conv_step(u[..., 0], final, kernel)
    torch.testing.assert_close(y_t, y[..., 0])
    assert state.shape == (1, 2, 0)
