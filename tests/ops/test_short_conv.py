"""causal_depthwise_conv against its oracle, torch.nn.functional.conv1d with groups = E on [history ; x]."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from ssmhub.ops.short_conv import causal_depthwise_conv, conv_window


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


def _real_rows(x, mask, starts):
    """Each row's real tokens alone, in order, and their document starts: a start at a pad (or at the real token
    itself) marks the next real token; ``late_start[b]``: a start after row b's last real token."""
    rows, row_starts, late_start = [], [], []
    for b in range(x.shape[0]):
        kept, flags, pending = [], [], False
        for t in range(x.shape[1]):
            pending = pending or bool(starts is not None and starts[b, t])
            if mask[b, t]:
                kept.append(t)
                flags.append(pending)
                pending = False
        rows.append(x[b, kept])
        row_starts.append(torch.tensor(flags, dtype=torch.bool))
        late_start.append(pending)
    return rows, row_starts, late_start


def _masked_oracle(x, weight, bias, history, mask, starts=None):
    """Every row's real tokens convolved alone (:func:`_documents_alone`), put back at their positions; 0 at pads."""
    rows, row_starts, _ = _real_rows(x, mask, starts)
    outputs = []
    for b, (row, flags) in enumerate(zip(rows, row_starts)):
        row_y = x.new_zeros(x.shape[1:])  # (T, E)
        if len(row):
            alone = _documents_alone(row[None], weight, bias, history[b : b + 1], flags[None])[0]  # (n, E)
            row_y = row_y.index_put((mask[b].nonzero().flatten(),), alone)
        outputs.append(row_y)
    return torch.stack(outputs)


def _holes():
    """Row 0: left padding and holes; row 1: holes of one and two pads, a document start at a pad (it moves to the
    next real token) and at a real token; row 2: no pad; row 3: pads only at the end."""
    mask = torch.ones(4, 11, dtype=torch.long)
    mask[0, [0, 1, 4, 7, 8]] = 0
    mask[1, [2, 5, 6]] = 0
    mask[3, [8, 9, 10]] = 0
    starts = torch.zeros(4, 11, dtype=torch.bool)
    starts[1, [5, 8]] = True
    starts[3, 9] = True  # after the last real token: the window restarts
    return mask, starts


@pytest.mark.parametrize("with_starts", [False, True], ids=["pads", "pads_and_documents"])
@pytest.mark.parametrize("taps", [1, 2, 4])
def test_pads_are_skipped_as_if_absent(taps, with_starts):
    """With ``mask``, each real token's taps meet the real tokens before it (pads skipped, left padding and holes
    alike), as conv1d over the row without its pads; 0 at pads; values and all four gradients."""
    x, weight, bias, history = _inputs(4, 11, 3, taps, seed=40 + taps)
    mask, starts = _holes()
    starts = starts if with_starts else None
    ours_in = [t.clone().requires_grad_() for t in (x, weight, bias, history)]
    ref_in = [t.clone().requires_grad_() for t in (x, weight, bias, history)]
    y = causal_depthwise_conv(*ours_in, starts=starts, mask=mask)
    y_ref = _masked_oracle(*ref_in, mask, starts)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    grad = torch.randn(y.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    y.backward(grad)
    y_ref.backward(grad)
    for name, ours, ref in zip(("x", "weight", "bias", "history"), ours_in, ref_in):
        torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-12, atol=1e-12, msg=f"gradient of {name}")


@pytest.mark.parametrize("with_starts", [False, True], ids=["pads", "pads_and_documents"])
def test_the_window_after_a_masked_row_holds_its_last_real_inputs(with_starts):
    """conv_window with ``mask``: the last k − 1 real inputs of [history ; x] (pads skipped), zeros before the last
    document start (a start after the last real token empties it), by a loop over each row."""
    x, _, _, history = _inputs(4, 11, 3, 4, seed=7)
    mask, starts = _holes()
    starts = starts if with_starts else None
    rows, row_starts, late_start = _real_rows(x, mask, starts)
    expected = []
    for b, (row, flags) in enumerate(zip(rows, row_starts)):
        stream = torch.cat([history[b], row])  # (k − 1 + n, E)
        last = max([i for i, flag in enumerate(flags) if flag], default=None)
        if last is not None:
            stream[: history.shape[1] + last] = 0
        if late_start[b]:
            stream.zero_()
        expected.append(stream[-history.shape[1] :])
    torch.testing.assert_close(conv_window(history, x, starts, mask=mask), torch.stack(expected), rtol=0, atol=0)
    with pytest.raises(ValueError, match="ends or mask"):
        conv_window(history, x, ends=mask.sum(1), mask=mask)
    with pytest.raises(ValueError, match=r"mask must have shape \(B, T\)"):
        causal_depthwise_conv(x, torch.ones(3, 4, dtype=torch.float64), mask=mask[:, :5])
