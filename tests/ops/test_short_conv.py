"""causal_depthwise_conv against its oracle, torch.nn.functional.conv1d with groups = E on [history ; x]."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from ssmhub.ops.short_conv import causal_depthwise_conv


def _oracle(x, weight, bias, history):
    """F.conv1d (groups = E, no padding) over [history ; x] in the (B, E, T) layout, back to (B, T, E)."""
    padded = torch.cat([history, x], dim=1).transpose(1, 2)  # (B, E, k − 1 + T)
    return F.conv1d(padded, weight.unsqueeze(1), bias, groups=x.shape[-1]).transpose(1, 2)


def _inputs(batch, seq_len, channels, taps, seed, with_bias=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq_len, channels, generator=g, dtype=torch.float64)
    weight = torch.randn(channels, taps, generator=g, dtype=torch.float64)
    bias = torch.randn(channels, generator=g, dtype=torch.float64) if with_bias else None
    history = torch.randn(batch, taps - 1, channels, generator=g, dtype=torch.float64)
    return x, weight, bias, history


@pytest.mark.parametrize(
    "seq_len,taps,with_bias",
    [(1, 4, True), (2, 4, True), (3, 4, False), (17, 4, True), (9, 1, True), (5, 2, False), (6, 7, True)],
)
def test_matches_conv1d_values_and_gradients(seq_len, taps, with_bias):
    """Outputs and the gradients of x, weight, bias and history equal conv1d's (float64, shorter and longer
    sequences than the kernel, one tap, no bias)."""
    inputs = _inputs(2, seq_len, 3, taps, seed=seq_len * 10 + taps, with_bias=with_bias)
    ours_in = [t.clone().requires_grad_() if t is not None else None for t in inputs]
    ref_in = [t.clone().requires_grad_() if t is not None else None for t in inputs]
    y = causal_depthwise_conv(*ours_in)
    y_ref = _oracle(*ref_in)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    grad = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y.backward(grad)
    y_ref.backward(grad)
    for name, ours, ref in zip(("x", "weight", "bias", "history"), ours_in, ref_in):
        if ref is not None:
            torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-12, atol=1e-12, msg=f"gradient of {name}")


def test_no_history_means_zeros_and_split_equals_whole():
    """history=None is a zero history; a sequence convolved in two pieces (the second with the first's last
    k − 1 inputs as history) equals the sequence convolved whole: the decode-state contract."""
    x, weight, bias, _ = _inputs(2, 12, 5, 4, seed=3)
    whole = causal_depthwise_conv(x, weight, bias)
    torch.testing.assert_close(whole, _oracle(x, weight, bias, x.new_zeros(2, 3, 5)), rtol=1e-12, atol=1e-12)
    first = causal_depthwise_conv(x[:, :7], weight, bias)
    second = causal_depthwise_conv(x[:, 7:], weight, bias, history=x[:, 4:7])
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole, rtol=1e-12, atol=1e-12)


def test_float32_and_bad_shapes():
    x, weight, bias, history = (t.float() for t in _inputs(1, 5, 4, 4, seed=4))
    y = causal_depthwise_conv(x, weight, bias, history)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, _oracle(x, weight, bias, history))
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, E\)"):
        causal_depthwise_conv(x[0], weight)
    with pytest.raises(ValueError, match=r"weight must have shape \(E, k\) with E = 4"):
        causal_depthwise_conv(x, weight[:3])
    with pytest.raises(ValueError, match=r"bias must have shape \(E,\)"):
        causal_depthwise_conv(x, weight, bias[:2])
    with pytest.raises(ValueError, match=r"history must have shape \(B, k − 1, E\)"):
        causal_depthwise_conv(x, weight, bias, history[:, :2])


def _documents_alone(x, weight, bias, history, starts):
    """The oracle of a packed row: conv1d of each document alone from zeros (the history only before a row's
    first start), row by row."""
    rows = []
    for b in range(x.shape[0]):
        bounds = [0] + [t for t in starts[b].nonzero().flatten().tolist() if t > 0] + [x.shape[1]]
        pieces = []
        for i, (begin, end) in enumerate(itertools.pairwise(bounds)):
            fresh = i > 0 or bool(starts[b, 0])
            before = torch.zeros_like(history[b : b + 1]) if fresh else history[b : b + 1]
            pieces.append(_oracle(x[b : b + 1, begin:end], weight, bias, before))
        rows.append(torch.cat(pieces, dim=1))
    return torch.cat(rows)


@pytest.mark.parametrize("taps", [1, 2, 4, 7])
def test_document_starts_cut_every_tap_across_them(taps):
    """A packed row equals each document convolved alone: documents shorter than the kernel (lengths 1, 2),
    longer ones, a row that continues its history and one that restarts at 0; values and all four gradients."""
    x, weight, bias, history = _inputs(2, 13, 3, taps, seed=20 + taps)
    starts = torch.zeros(2, 13, dtype=torch.bool)
    starts[0, [3, 4, 6]] = True  # row 0: history continues for 3, then documents of 1, 2, 7
    starts[1, [0, 9]] = True  # row 1: fresh documents of 9 and 4
    ours_in = [t.clone().requires_grad_() for t in (x, weight, bias, history)]
    ref_in = [t.clone().requires_grad_() for t in (x, weight, bias, history)]
    y = causal_depthwise_conv(*ours_in, starts=starts)
    y_ref = _documents_alone(*ref_in, starts)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    grad = torch.randn(y.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    y.backward(grad)
    y_ref.backward(grad)
    for name, ours, ref in zip(("x", "weight", "bias", "history"), ours_in, ref_in):
        torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-12, atol=1e-12, msg=f"gradient of {name}")


def test_no_document_start_is_the_plain_convolution_and_bad_starts_are_refused():
    x, weight, bias, history = _inputs(2, 9, 3, 4, seed=5)
    no_starts = torch.zeros(2, 9, dtype=torch.bool)
    # with no start every tap's reach is 1 (x·1 = x), but the taps then come from another tensor layout (another
    # loop for addcmul, which may fuse its multiply-add): float64 round-off of a sum of 4 taps, far below 1e-12
    torch.testing.assert_close(
        causal_depthwise_conv(x, weight, bias, history, starts=no_starts),
        causal_depthwise_conv(x, weight, bias, history),
        rtol=1e-12,
        atol=1e-12,
    )
    with pytest.raises(ValueError, match="starts must be a bool tensor"):
        causal_depthwise_conv(x, weight, bias, history, starts=no_starts.long())
