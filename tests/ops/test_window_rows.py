"""The short causal convolution's in-place decode kernel (ssmhub.ops.window_rows) against its float64 oracle, the
window step written out (``y = Σ_j K_j u_{t−j} + D u_t + b``, arXiv 2212.14052 §3.1's shift convolution, arXiv
2312.00752 §3.4's depthwise one): odd widths, one row, 33 rows out of order, taps fewer and more than the window
reaches, new requests in a reused slot that holds NaN, slots in engine pages, each for windows of three inputs
(the kernel written out for four taps) and of other lengths; and ``causal_conv_step`` itself."""

from __future__ import annotations

import pytest
import torch
from step_rows_helpers import in_engine_pages, pages_untouched

pytest.importorskip("numba")

from ssmhub.ops.longconv import causal_conv_step
from ssmhub.ops.window_rows import window_kernel_available, window_step_rows_

EPS32 = torch.finfo(torch.float32).eps


def _oracle(table, rows, new, u, taps, skip, bias):
    """The window of each row (zeros where new), the new input appended, y = Σ_j taps[:, j] u_{t−j} + skip u + bias,
    in float64, channel c with row c mod T of taps, skip and bias (T, …); returns y (R, H) and the table with the
    rows' windows shifted."""
    repeat = table.shape[1] // taps.shape[0]
    taps, skip, bias = taps.repeat(repeat, 1), skip.repeat(repeat), bias.repeat(repeat)
    table = table.double().clone()
    window = table[rows]  # (R, H, M), oldest first
    window[new] = 0.0
    M = window.shape[-1]
    full = torch.cat([window, u.double()[..., None]], dim=-1)  # (R, H, M + 1), newest last
    reach = min(taps.shape[1], M + 1)
    y = sum(taps.double()[:, j] * full[..., M - j] for j in range(reach)) + skip.double() * u.double() + bias.double()
    table[rows] = full[..., 1:]
    return y, table


def _inputs(slots, channels, window, rows, taps, seed, tap_rows=None):
    g = torch.Generator().manual_seed(seed)
    tap_rows = tap_rows or channels
    table = torch.randn(slots, channels, window, generator=g)
    rows = torch.tensor(rows)
    new = torch.arange(len(rows)) % 3 == 1  # some rows start a new request in a used slot
    u, taps = torch.randn(len(rows), channels, generator=g), torch.randn(tap_rows, taps, generator=g)
    skip, bias = torch.randn(tap_rows, generator=g), torch.randn(tap_rows, generator=g)
    return table, rows, new, u, taps, skip, bias


@pytest.mark.parametrize(
    "channels, window, slots, rows, taps, tap_rows",
    [(7, 3, 9, [5, 1, 7, 2], 4, 7), (3, 5, 40, list(range(39, 6, -1)), 6, 3), (1, 1, 2, [1], 2, 1),
     (6, 4, 5, [4, 0], 2, 6), (5, 2, 4, [1, 3], 7, 5), (12, 40, 4, [2, 0, 3], 41, 3), (4, 3, 5, [2, 4], 1, 2),
     (9, 3, 40, list(range(6, 39)), 6, 3), (1, 3, 2, [1], 4, 1), (10, 3, 6, [3, 5, 0], 3, 5)],
    ids=["odd widths", "33 rows out of order", "one row", "fewer taps than the window", "more taps than it reaches",
         "channels sharing a filter, a long window", "only the current input's tap",
         "four taps' window: 33 rows, shared filters, more taps", "four taps' window: one row, one channel",
         "four taps' window: fewer taps"],
)  # fmt: skip
@pytest.mark.parametrize("layout", ["contiguous", "engine pages"])
def test_kernel_equals_the_float64_window_step(channels, window, slots, rows, taps, tap_rows, layout):
    table, rows, new, u, taps, skip, bias = _inputs(slots, channels, window, rows, taps, len(rows), tap_rows)
    want_y, want_table = _oracle(table, rows, new, u, taps, skip, bias)
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[rows] = False
    before = table.clone()
    if layout == "engine pages":  # slots apart in a larger buffer, NaN between them
        table, pages = in_engine_pages(table)

    y = window_step_rows_(table, rows, new, u, taps, skip, bias)

    assert layout == "contiguous" or pages_untouched(pages, table)
    assert torch.equal(table[untouched], before[untouched])  # other slots: bit for bit as they were
    assert torch.equal(table[rows].double(), want_table[rows])  # a shift moves values: exact
    assert torch.all((y.double() - want_y).abs() <= _tolerance(before, u, taps, skip, bias))


def _tolerance(table, u, taps, skip, bias):
    """(H,): a float32 sum of at most K + 2 terms per channel, each a product of float32 numbers."""
    magnitude = (taps.abs().sum(-1) + skip.abs()) * max(u.abs().amax(), table.abs().amax()) + bias.abs()
    return ((taps.shape[1] + 3) * EPS32 * magnitude.double()).repeat(table.shape[1] // taps.shape[0])


def test_it_is_causal_conv_step_on_the_rows():
    """The tensor step the mixers fall back to, on the gathered windows: the same numbers up to float32 round-off."""
    table, rows, new, u, taps, skip, _ = _inputs(6, 5, 3, [4, 1, 2], 4, seed=2)
    new = torch.zeros(3, dtype=torch.bool)
    want_y, want_window = causal_conv_step(u, table[rows], taps, skip)
    before = table.clone()
    y = window_step_rows_(table, rows, new, u, taps, skip)
    assert torch.equal(table[rows], want_window)
    assert torch.all((y - want_y).abs().double() <= 2 * _tolerance(before, u, taps, skip, torch.zeros(5)))


def test_a_new_request_in_a_reused_slot_starts_from_an_empty_window():
    _, rows, _, u, taps, skip, bias = _inputs(3, 4, 3, [2], 4, seed=0)
    used, clean = torch.full((3, 4, 3), float("nan")), torch.zeros(3, 4, 3)
    from_used = window_step_rows_(used, rows, torch.tensor([True]), u, taps, skip, bias)
    from_clean = window_step_rows_(clean, rows, torch.tensor([False]), u, taps, skip, bias)
    assert torch.equal(used[2], clean[2]) and torch.equal(from_used, from_clean)


def test_a_table_the_kernel_cannot_update_steps_by_tensor_ops_alike():
    """Another dtype, a window not contiguous, or no window at all: the tensor path, the same numbers."""
    table, rows, new, u, taps, skip, bias = _inputs(4, 3, 2, [3, 0, 1], 3, seed=5, tap_rows=1)  # one shared filter
    want_y, want_table = _oracle(table, rows, new, u, taps, skip, bias)
    for odd in (table.double(), table.transpose(1, 2).contiguous().transpose(1, 2)):
        assert not window_kernel_available(odd)
        y = window_step_rows_(odd, rows, new, u, taps, skip, bias)
        torch.testing.assert_close(odd[rows].double(), want_table[rows], rtol=0, atol=0)
        assert torch.all((y.double() - want_y).abs() <= _tolerance(table, u, taps, skip, bias))
    empty = torch.zeros(2, 3, 0)
    assert not window_kernel_available(empty)
    y = window_step_rows_(empty, torch.tensor([1]), torch.tensor([False]), u[:1], taps, skip, bias)
    want = (taps[:, 0] + skip).double() * u[0].double() + bias.double()  # no window: the new input alone
    assert torch.all((y[0].double() - want).abs() <= _tolerance(table, u, taps, skip, bias))


def test_bad_arguments_are_refused_naming_them():
    _, rows, new, u, taps, _, _ = _inputs(2, 3, 2, [0], 3, seed=0)
    with pytest.raises(ValueError, match=r"skip must have shape \(3,\)"):
        window_step_rows_(torch.zeros(2, 3, 2), rows, new, u, taps, torch.zeros(4))
    with pytest.raises(ValueError, match=r"taps must have shape \(T, K\) with T dividing the table's 3 channels"):
        window_step_rows_(torch.zeros(2, 3, 2), rows, new, u, taps[:2])
