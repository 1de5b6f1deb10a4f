"""The one-pass, in-place decode kernel of a diagonal recurrence (ssmhub.ops.diagonal_rows) against its float64
oracle, the recurrence of arXiv 2212.00768 Eq. 1 written out: shapes the other tests do not use (odd widths, one
row, 33 rows, slots out of order), rows that reuse a slot, new requests in a reused slot, a λ shared by the
channels and one per channel; and DLR's ``step_rows_`` against the mixer protocol's gather, step and write-back."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from step_rows_helpers import in_engine_pages, pages_untouched, step_rows_both_ways

pytest.importorskip("numba")

from ssmhub.layers.dlr import DLRMixer
from ssmhub.layers.h3 import H3Mixer
from ssmhub.layers.mixer import TokenMixer
from ssmhub.ops.diagonal_rows import (
    diagonal_step_rows_,
    kernel_available,
    modal_kernel_available,
    modal_kv_step_rows_,
)

EPS32 = torch.finfo(torch.float32).eps


def _oracle(table, rows, new, u, lam, weights):
    """Eq. 1 in float64 on the rows' states: (Re z, Im z) (R, H) and the new table."""
    table = table.double().clone()
    x = table[rows]  # (R, H, 2, N)
    x[new] = 0.0
    state = torch.complex(x[:, :, 0], x[:, :, 1])  # (R, H, N)
    lam = torch.complex(*[t.double() for t in lam])
    w = torch.complex(*[t.double() for t in weights])
    state = lam * state + u.double()[..., None]
    z = (w * state).sum(-1)
    table[rows] = torch.stack([state.real, state.imag], dim=2)
    return z.real, z.imag, table


def _tolerance(table, rows, lam, weights, u):
    """float32 round-off of the new state (three products and sums per mode) and of a sum over N modes of it."""
    magnitude = table[rows].abs().amax() * torch.stack(lam).abs().amax() * 2 + u.abs().amax()
    state_tol = 4 * EPS32 * magnitude
    modes = table.shape[-1]
    z_tol = (modes + 4) * EPS32 * modes * magnitude * torch.stack(weights).abs().amax() * 2
    return state_tol.item(), z_tol.item()


@pytest.mark.parametrize(
    "channels, modes, slots, rows, shared",
    [(7, 5, 9, [5, 1, 7, 2], True), (3, 17, 40, list(range(39, 6, -1)), False), (1, 1, 2, [1], True),
     (300, 64, 5, [4, 0, 2], False)],
    ids=["odd widths", "33 rows out of order", "one row", "two tiles of channels, the last partial"],
)  # fmt: skip
@pytest.mark.parametrize("layout", ["contiguous", "engine pages"])
def test_kernel_equals_the_float64_recurrence(channels, modes, slots, rows, shared, layout):
    g = torch.Generator().manual_seed(len(rows))
    table = torch.randn(slots, channels, 2, modes, generator=g)
    rows = torch.tensor(rows)
    new = torch.rand(len(rows), generator=g) < 0.3
    u = torch.randn(len(rows), channels, generator=g)
    lam_shape = (modes,) if shared else (channels, modes)
    radius, angle = 0.5 + 0.5 * torch.rand(lam_shape, generator=g), 6.3 * torch.rand(lam_shape, generator=g)
    lam = (radius * torch.cos(angle), radius * torch.sin(angle))
    weights = (torch.randn(channels, modes, generator=g), torch.randn(channels, modes, generator=g))
    state_tol, z_tol = _tolerance(table, rows, lam, weights, u)
    want_re, want_im, want_table = _oracle(table, rows, new, u, lam, weights)

    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[rows] = False
    before = table.clone()
    if layout == "engine pages":  # slots apart in a larger buffer, NaN between them
        table, pages = in_engine_pages(table)
    z_re, z_im = diagonal_step_rows_(table, rows, new, u, lam, weights)

    assert layout == "contiguous" or pages_untouched(pages, table)
    assert torch.equal(table[untouched], before[untouched])  # other slots: bit for bit as they were
    torch.testing.assert_close(table.double(), want_table, rtol=0, atol=state_tol)
    torch.testing.assert_close(z_re.double(), want_re, rtol=0, atol=z_tol)
    torch.testing.assert_close(z_im.double(), want_im, rtol=0, atol=z_tol)


def test_a_new_request_in_a_reused_slot_starts_from_zero():
    """A slot that held another request's state: with ``new`` its row ignores it, bit for bit as from zeros."""
    g = torch.Generator().manual_seed(0)
    lam = (torch.rand(6, generator=g), torch.rand(6, generator=g))
    weights = (torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g))
    u = torch.randn(1, 4, generator=g)
    used, clean = torch.randn(3, 4, 2, 6, generator=g), torch.zeros(3, 4, 2, 6)
    from_used = diagonal_step_rows_(used, torch.tensor([2]), torch.tensor([True]), u, lam, weights)
    from_clean = diagonal_step_rows_(clean, torch.tensor([2]), torch.tensor([False]), u, lam, weights)
    assert torch.equal(used[2], clean[2]) and all(map(torch.equal, from_used, from_clean))


def test_a_table_it_cannot_update_is_refused_naming_what_it_needs():
    assert not kernel_available(torch.zeros(2, 3, 2, 4, dtype=torch.float64))
    assert not kernel_available(torch.zeros(2, 3, 4, 2).transpose(-1, -2))  # modes not contiguous
    with pytest.raises(ValueError, match="float32 CPU table"):
        diagonal_step_rows_(torch.zeros(2, 3, 2, 4, dtype=torch.float64), torch.tensor([0]), torch.tensor([False]),
                            torch.zeros(1, 3), (torch.zeros(4),) * 2, (torch.zeros(3, 4),) * 2)  # fmt: skip
    with pytest.raises(ValueError, match="u_t must be"):
        diagonal_step_rows_(torch.zeros(2, 3, 2, 4), torch.tensor([0]), torch.tensor([False]), torch.zeros(1, 5),
                            (torch.zeros(4),) * 2, (torch.zeros(3, 4),) * 2)  # fmt: skip
    with pytest.raises(ValueError, match=r"for rows \(1, 1\)"):  # rows must be (R,), one slot per row
        diagonal_step_rows_(torch.zeros(2, 3, 2, 4), torch.tensor([[0]]), torch.tensor([False]), torch.zeros(1, 3),
                            (torch.zeros(4),) * 2, (torch.zeros(3, 4),) * 2)  # fmt: skip


@pytest.mark.parametrize("kernel_type", ["real", "prod"])
def test_dlr_step_rows_equals_the_protocols_gather_step_and_write_back(kernel_type):
    """DLR's kernel path against TokenMixer.step_rows_ (index_select, DLR's step, index_copy_), its oracle; DLR-prod
    reads out ½·Im over its N² Kronecker modes."""
    torch.manual_seed(0)
    mixer = DLRMixer(9, state_size=5, kernel_type=kernel_type).eval()
    assert mixer.steps_rows_in_one_pass
    (shape, _), = mixer.state_layout(1).values()  # fmt: skip
    table = torch.randn(12, *shape[1:])
    rows, new = torch.tensor([11, 0, 4, 7, 3]), torch.tensor([False, True, False, False, True])
    x = torch.randn(5, 9)
    ours, reference = table.clone(), table.clone()
    with torch.no_grad():
        y = mixer.step_rows_(x, {"dlr_state": ours}, rows, new)
        want = TokenMixer.step_rows_(mixer, x, {"dlr_state": reference}, rows, new)
    scale = reference.abs().amax().item() + 1
    torch.testing.assert_close(ours, reference, rtol=0, atol=8 * EPS32 * scale)
    torch.testing.assert_close(y, want, rtol=0, atol=8 * EPS32 * scale * mixer.recurrent_state_size * 9)


def test_dlr_step_rows_keeps_the_autograd_path_when_a_gradient_is_asked_for():
    torch.manual_seed(0)
    mixer = DLRMixer(6, state_size=3)
    table = torch.randn(4, 6, 2, 3)
    x = torch.randn(2, 6, requires_grad=True)
    y = mixer.step_rows_(x, {"dlr_state": table}, torch.tensor([3, 1]), torch.tensor([False, False]))
    y.sum().backward()
    assert x.grad is not None and mixer.ssm.weight.grad is not None


def _modal_kv_oracle(table, rows, new, q, k, v, lam, residues, direct):
    """H3's modal step in float64, written out: x[i, j, h] = λ_h x + k_i v_j, s_ij = Re Σ c x + D k_i v_j,
    o_j = Σ_i q_i s_ij; returns o (R, H, d_h) and the new table."""
    table = table.to(torch.complex128).clone()
    x = table[rows]  # (R, d_h, d_h, H, N)
    x[new] = 0
    lam = torch.complex(*[t.double() for t in lam])  # (H, N)
    c = torch.complex(*[t.double() for t in residues])
    kv = torch.einsum("rhi,rhj->rijh", k.double(), v.double())  # (R, d_h, d_h, H)
    x = lam * x + kv[..., None]
    s = (c * x).sum(-1).real + direct.double() * kv  # (R, d_h, d_h, H)
    table[rows] = x
    return torch.einsum("rhi,rijh->rhj", q.double(), s), table


@pytest.mark.parametrize(
    "width, heads, modes, slots, rows",
    [
        (3, 2, 5, 7, [6, 0, 2]),
        (2, 1, 3, 40, list(range(39, 6, -1))),
        (1, 1, 1, 2, [1]),
        (2, 21, 100, 3, [2, 0]),
        (2, 5, 3000, 3, [2, 0]),
        (1, 37, 16, 40, list(range(6, 39))),
    ],
    ids=[
        "odd widths",
        "33 rows",
        "one row",
        "heads past the prefetch distance",
        "three tiles of heads, the last partial",
        "one channel a head, 33 rows",
    ],  # 3000 modes: 2 heads a tile (_TILE_FLOATS)
)
@pytest.mark.parametrize("layout", ["contiguous", "engine pages"])
def test_modal_kernel_equals_h3s_float64_step(width, heads, modes, slots, rows, layout):
    g = torch.Generator().manual_seed(len(rows))
    table = torch.randn(slots, width, width, heads, modes, 2, generator=g)
    table = torch.view_as_complex(table)  # (slots, d_h, d_h, H, N) complex64
    rows = torch.tensor(rows)
    new = torch.rand(len(rows), generator=g) < 0.3
    q, k, v = (torch.randn(len(rows), heads, width, generator=g) for _ in range(3))
    radius, angle = 0.5 + 0.5 * torch.rand(heads, modes, generator=g), 6.3 * torch.rand(heads, modes, generator=g)
    lam = (radius * torch.cos(angle), radius * torch.sin(angle))
    residues = (torch.randn(heads, modes, generator=g), torch.randn(heads, modes, generator=g))
    direct = torch.randn(heads, generator=g)
    want_o, want_table = _modal_kv_oracle(table, rows, new, q, k, v, lam, residues, direct)
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[rows] = False
    before = table.clone()
    if layout == "engine pages":  # slots apart in a larger buffer, NaN between them
        table, pages = in_engine_pages(table)
    o = modal_kv_step_rows_(table, rows, new, (q, k, v), lam, residues, direct)
    assert layout == "contiguous" or pages_untouched(pages, table)
    assert torch.equal(table[untouched], before[untouched])  # other slots: bit for bit as they were
    # the state: a product and sums per mode, of magnitude ≤ |x|·|λ|·2 + |k v|; o: a sum over d_h·(N + 1) terms
    state = (table.abs().amax() * 2 + (k.abs().amax() * v.abs().amax())).item()
    torch.testing.assert_close(torch.view_as_real(table).double(), torch.view_as_real(want_table), rtol=0,
                               atol=8 * EPS32 * state)  # fmt: skip
    scale = q.abs().amax().item() * state * (modes * residues[0].abs().amax().item() * 2 + direct.abs().amax().item())
    torch.testing.assert_close(o.double(), want_o, rtol=0, atol=(width * (modes + 2) + 8) * EPS32 * scale * width)


def _shift_oracle(table, rows, new, k, taps, skip):
    """H3's shift convolution step in float64, written out per channel c = h·d_h + i: window place s (oldest first,
    zeros for a new row) meets taps[c, M − s], the current input taps[c, 0] + skip[c]; the window drops its oldest
    input. Returns k̃ (R, H, d_h) and the new window table."""
    table = table.double().clone()
    window = table[rows]  # (R, d, M)
    window[new] = 0
    flat_k = k.double().flatten(1)  # (R, d)
    taps = torch.nn.functional.pad(taps.double(), (0, max(0, window.shape[2] + 1 - taps.shape[1])))
    m = window.shape[2]
    shifted = flat_k * (taps[:, 0] + (0 if skip is None else skip.double()))
    for s in range(m):
        shifted = shifted + taps[:, m - s] * window[:, :, s]
    table[rows] = torch.cat([window[:, :, 1:], flat_k[:, :, None]], dim=2)
    return shifted.view_as(k), table


@pytest.mark.parametrize(
    "width, heads, window, taps, skip, rows",
    [
        (3, 2, 3, 4, True, [6, 0, 2]),
        (2, 3, 2, 5, False, list(range(39, 6, -1))),
        (1, 1, 3, 2, True, [1]),
        (2, 1, 1, 2, False, [4, 5]),
        (1, 37, 3, 4, True, list(range(39, 6, -1))),
        (1, 37, 4, 5, False, [0, 3]),
    ],
    ids=[
        "odd widths, four taps",
        "33 rows, a window of two, more taps",
        "one row, fewer taps",
        "a window of one",
        "one channel a head, 33 rows, four taps",
        "one channel a head, a window of four",
    ],
)
@pytest.mark.parametrize("layout", ["contiguous", "engine pages"])
def test_the_modal_kernel_steps_hs_shift_window_in_the_same_call(width, heads, window, taps, skip, rows, layout):
    """modal_kv_step_rows_ with ``shift``: k through the float64 shift oracle, then the modal oracle, both tables
    in place, new rows starting from an empty window and a zero state."""
    g = torch.Generator().manual_seed(len(rows) + window)
    slots, modes, channels = 40, 7, heads * width
    table = torch.view_as_complex(torch.randn(slots, width, width, heads, modes, 2, generator=g))
    windows = torch.randn(slots, channels, window, generator=g)
    rows = torch.tensor(rows)
    new = torch.rand(len(rows), generator=g) < 0.3
    q, k, v = (torch.randn(len(rows), heads, width, generator=g) for _ in range(3))
    lam = (0.9 * torch.rand(heads, modes, generator=g), 0.3 * torch.rand(heads, modes, generator=g))
    residues = (torch.randn(heads, modes, generator=g), torch.randn(heads, modes, generator=g))
    direct = torch.randn(heads, generator=g)
    shift_taps = torch.randn(channels, taps, generator=g)
    shift_skip = torch.randn(channels, generator=g) if skip else None
    k_shift, want_windows = _shift_oracle(windows, rows, new, k, shift_taps, shift_skip)
    want_o, want_table = _modal_kv_oracle(table, rows, new, q, k_shift, v, lam, residues, direct)
    if layout == "engine pages":
        (table, pages), (windows, window_pages) = in_engine_pages(table), in_engine_pages(windows)
    o = modal_kv_step_rows_(table, rows, new, (q, k, v), lam, residues, direct, (windows, shift_taps, shift_skip))
    assert layout == "contiguous" or (pages_untouched(pages, table) and pages_untouched(window_pages, windows))
    torch.testing.assert_close(windows.double(), want_windows, rtol=0, atol=0)  # moved and copied, not computed
    state = (table.abs().amax() * 2 + k_shift.abs().amax() * v.abs().amax()).item()
    torch.testing.assert_close(torch.view_as_real(table).double(), torch.view_as_real(want_table), rtol=0,
                               atol=8 * EPS32 * state * (taps + 2))  # fmt: skip
    scale = q.abs().amax().item() * state * (modes * residues[0].abs().amax().item() * 2 + direct.abs().amax().item())
    sums = (width * (modes + 2) + 8) * width * (taps + 2)  # o's terms, each from a k̃ of taps + 1 products
    torch.testing.assert_close(o.double(), want_o, rtol=0, atol=sums * EPS32 * scale)


def test_the_modal_kernels_shift_is_refused_before_any_state_changes():
    table = torch.zeros(2, 1, 1, 3, 4, dtype=torch.complex64)
    qkv, planes = (torch.ones(1, 3, 1),) * 3, (torch.zeros(3, 4),) * 2
    for shift, message in (
        ((torch.zeros(2, 4, 3), torch.zeros(3, 4), None), "window table must be"),
        ((torch.zeros(1, 3, 3), torch.zeros(3, 4), None), "window table must be"),  # fewer slots than the states
        ((torch.zeros(2, 3, 3), torch.zeros(2, 4), None), "taps must be"),
        ((torch.zeros(2, 3, 3), torch.zeros(3, 4), torch.zeros(2)), "taps must be"),
    ):
        with pytest.raises(ValueError, match=message):
            modal_kv_step_rows_(table, torch.tensor([0]), torch.tensor([True]), qkv, planes, planes, torch.ones(3),
                                shift)  # fmt: skip
        assert not table.any()


def test_the_modal_kernel_refuses_a_table_of_another_shape_naming_it():
    with pytest.raises(ValueError, match="table must be"):
        modal_kv_step_rows_(torch.zeros(2, 3, 3, 2, 4, dtype=torch.complex64), torch.tensor([0]),
                            torch.tensor([False]), (torch.zeros(1, 2, 2),) * 3, (torch.zeros(2, 4),) * 2,
                            (torch.zeros(2, 4),) * 2, torch.zeros(2))  # fmt: skip
    with pytest.raises(ValueError, match="complex64 CPU table"):
        modal_kv_step_rows_(torch.zeros(2, 2, 2, 2, 4), torch.tensor([0]), torch.tensor([False]),
                            (torch.zeros(1, 2, 2),) * 3, (torch.zeros(2, 4),) * 2, (torch.zeros(2, 4),) * 2,
                            torch.zeros(2))  # fmt: skip


def _h3(kind: str) -> H3Mixer:
    torch.manual_seed(0)
    if kind == "diagonal SSM":
        return H3Mixer(12, ssm_num_heads=3, kernel_type="diagonal_ssm", ssm_state_size=5).eval()
    mixer = H3Mixer(12, ssm_num_heads=3, max_kernel_length=32).eval()
    if kind == "distilled":
        mixer.distill(num_modes=4)
    return mixer


@pytest.mark.parametrize("kind", ["diagonal SSM", "distilled", "long convolution"])
@pytest.mark.parametrize("layout", ["contiguous", "slots innermost", "shift slots innermost"])
def test_h3_step_rows_equals_the_protocols_gather_step_and_write_back(kind, layout):
    """H3's kernel path (the shift window and a long convolution's window shifted in place, a modal state in one
    pass, the shift in the modal kernel's call) against TokenMixer.step_rows_ (index_select, H3's step,
    index_copy_), its oracle, with new requests in reused slots; on tables whose slots are their innermost dimension
    (no slot's block contiguous) it takes the protocol's path instead of the kernels, and a shift window laid out so
    steps by tensor ops beside the kernel of the long convolution."""
    mixer = _h3(kind)
    assert mixer.steps_rows_in_one_pass
    g = torch.Generator().manual_seed(1)
    tables = {}
    for name, (shape, dtype) in mixer.state_layout(1).items():
        garbage = torch.randn(9, *shape[1:], 2 if dtype.is_complex else 1, generator=g)
        table = torch.view_as_complex(garbage) if dtype.is_complex else garbage[..., 0]
        innermost = layout == "slots innermost" or (layout == "shift slots innermost" and name == "shift_state")
        tables[name] = table.movedim(0, -1).contiguous().movedim(-1, 0) if innermost else table
    kv = tables["kv_state"]
    usable = modal_kernel_available(kv) if kv.is_complex() else kv[0].is_contiguous()
    assert usable == (layout != "slots innermost")
    assert tables["shift_state"][0].is_contiguous() == (layout == "contiguous")
    rows, new = torch.tensor([8, 0, 3, 5]), torch.tensor([False, True, False, True])
    x = torch.randn(4, 12, generator=g)
    y, want, ours, reference = step_rows_both_ways(mixer, tables, x, rows, new)
    for name in tables:
        scale = torch.view_as_real(reference[name]).abs().amax().item() if reference[name].is_complex() else 1.0
        got, expected = (torch.view_as_real(t) if t.is_complex() else t for t in (ours[name], reference[name]))
        torch.testing.assert_close(got, expected, rtol=0, atol=64 * EPS32 * (scale + 1))
    torch.testing.assert_close(y, want, rtol=0, atol=1e-5 * (want.abs().amax().item() + 1))


@pytest.mark.parametrize("kind", ["DLR", "H3 diagonal SSM", "H3 distilled", "H3 long convolution"])
def test_step_rows_keeps_its_kernel_operands_only_while_weights_and_layout_stay(kind):
    """DLR and H3 keep their kernels' operands (``TokenMixer._kept_rows_kernel``) between steps on tables of one
    layout and the same weights, wherever the tables lie, and form them anew after an in-place change of the weights
    (as an optimizer step makes) and for tables of another layout; every step equals the protocol's oracle stepping
    copies of the same tables alongside, and the mixer holds no table once a step is done."""
    torch.manual_seed(0)
    mixer = DLRMixer(12, state_size=5).eval() if kind == "DLR" else _h3(kind.removeprefix("H3 "))
    g = torch.Generator().manual_seed(2)
    rows, new = torch.tensor([8, 0, 3]), torch.tensor([False, True, False])

    def tables(slots):
        layout = mixer.state_layout(slots).items()
        return {name: torch.randn(shape, dtype=dtype, generator=g) for name, (shape, dtype) in layout}

    def step_and_compare(ours):
        reference = {name: t.clone() for name, t in ours.items()}
        x = torch.randn(3, 12, generator=g)
        with torch.no_grad():
            y = mixer.step_rows_(x, ours, rows, new)
            want = TokenMixer.step_rows_(mixer, x, reference, rows, new)
        torch.testing.assert_close(y, want, rtol=0, atol=1e-5 * (want.abs().amax().item() + 1))
        for name in ours:
            got, expected = (torch.view_as_real(t) if t.is_complex() else t for t in (ours[name], reference[name]))
            torch.testing.assert_close(got, expected, rtol=0, atol=64 * EPS32 * (expected.abs().amax().item() + 1))
        return mixer.__dict__["_kept_rows_kernel_entry"]

    kept_tables = tables(9)
    first = step_and_compare(kept_tables)
    assert step_and_compare(kept_tables) is first  # the same weights and tables: kept
    assert step_and_compare(tables(9)) is first  # other tables of the same layout: kept, and stepped where they lie
    with torch.no_grad():
        for tensor in (*mixer.parameters(), *mixer.buffers()):
            if tensor.is_floating_point() or tensor.is_complex():
                tensor.mul_(0.8)  # every weight changed in place, where it lies
    after_update = step_and_compare(kept_tables)
    assert after_update is not first
    last = tables(11)
    assert step_and_compare(last) is not after_update  # more slots: another layout, its operands formed from it
    gone = [weakref.ref(t) for t in last.values()]
    del last
    gc.collect()
    assert all(ref() is None for ref in gone)  # the kept operands hold no table
