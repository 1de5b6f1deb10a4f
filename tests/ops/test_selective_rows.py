"""The one-pass, in-place decode kernel of the selective SSM (ssmhub.ops.selective_rows) against its float64 oracle,
Mamba's recurrence written out (arXiv 2312.00752 §3.4): shapes the other tests do not use (odd widths, one row, 33
rows, slots out of order), new requests in a reused slot that holds NaN, the decay's exp across its whole range;
and Mamba's (and a branchless SeRpEnt's) ``step_rows_`` against the mixer protocol's gather, step and write-back."""

from __future__ import annotations

import math

import pytest
import torch
from step_rows_helpers import in_engine_pages, pages_untouched, step_rows_both_ways
from torch.nn import functional as F

pytest.importorskip("numba")

from ssmhub.layers.mamba import MambaMixer
from ssmhub.layers.serpent import SerpentMixer
from ssmhub.ops.selective_rows import selective_kernel_available, selective_step_rows_
from ssmhub.ops.selective_scan import decay_exponent_floor, selective_step

EPS32 = torch.finfo(torch.float32).eps


def _oracle(table, rows, new, x, delta, A, B, C, D=None, z=None):
    """h = exp(Δ A) h + Δ x B, y = (C·h + D x) SiLU(z), in float64 on the rows' states: y (R, E), the new table."""
    table = table.double().clone()
    h = table[rows]  # (R, E, N)
    h[new] = 0.0
    x, delta, A, B, C = (t.double() for t in (x, delta, A, B, C))
    h = torch.exp(delta[..., None] * A) * h + (delta * x)[..., None] * B[:, None]
    y = (h * C[:, None]).sum(-1)
    if D is not None:
        y = y + D.double() * x
    if z is not None:
        y = y * F.silu(z.double())
    table[rows] = h
    return y, table


def _inputs(slots, channels, modes, rows, seed):
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(slots, channels, modes, generator=g)
    num_rows = len(rows)
    new = torch.rand(num_rows, generator=g) < 0.3
    table[torch.tensor(rows)[new]] = float("nan")  # a reused slot's leftovers are never read
    operands = dict(
        x=torch.randn(num_rows, channels, generator=g),
        delta=F.softplus(torch.randn(num_rows, channels, generator=g)),
        A=-torch.exp(torch.randn(channels, modes, generator=g)),
        B=torch.randn(num_rows, modes, generator=g),
        C=torch.randn(num_rows, modes, generator=g),
        D=torch.randn(channels, generator=g),
        z=torch.randn(num_rows, channels, generator=g),
    )
    return table, torch.tensor(rows), new, operands


def _tolerances(table, rows, new, o):
    """float32 round-off: the decay's argument Δ·A rounded (relative error |Δ A|·ε in the exp), the exp within 2
    ulp, a product and a sum per element; the read-out a sum over N modes of those, times |C|, plus the skip."""
    old = table[rows][~new].abs().amax().nan_to_num(0.0) if (~new).any() else torch.tensor(0.0)
    drive = (o["delta"] * o["x"]).abs().amax() * o["B"].abs().amax()
    argument = (o["delta"][..., None] * o["A"]).abs().amax()
    state_tol = (argument + 6) * EPS32 * (old + drive)
    modes = table.shape[-1]
    magnitude = old + drive
    y_tol = (modes * state_tol + (modes + 4) * EPS32 * modes * magnitude) * o["C"].abs().amax()
    y_tol = y_tol + 4 * EPS32 * (modes * magnitude * o["C"].abs().amax() + o["D"].abs().amax() * o["x"].abs().amax())
    return state_tol.item(), y_tol.item() * o["z"].abs().amax().item()


@pytest.mark.parametrize(
    "channels, modes, slots, rows",
    [(7, 5, 9, [5, 1, 7, 2]), (3, 17, 40, list(range(39, 6, -1))), (1, 1, 2, [1]), (70, 64, 4, [3, 1])],
    ids=["odd widths", "33 rows out of order", "one row", "channels past the prefetch distance"],
)
@pytest.mark.parametrize("layout", ["contiguous", "engine pages"])
def test_kernel_equals_the_float64_recurrence(channels, modes, slots, rows, layout):
    table, rows, new, o = _inputs(slots, channels, modes, rows, seed=len(rows))
    state_tol, y_tol = _tolerances(table, rows, new, o)
    want_y, want_table = _oracle(table, rows, new, *o.values())
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[rows] = False
    before = table.clone()
    if layout == "engine pages":  # slots apart in a larger buffer, NaN between them
        table, pages = in_engine_pages(table)

    y = selective_step_rows_(table, rows, new, *o.values())

    assert layout == "contiguous" or pages_untouched(pages, table)
    assert torch.equal(table[untouched], before[untouched])  # other slots: bit for bit as they were
    torch.testing.assert_close(table[rows].double(), want_table[rows], rtol=0, atol=state_tol)
    torch.testing.assert_close(y.double(), want_y, rtol=0, atol=y_tol)


def test_the_decay_is_exp_within_two_ulp_over_its_range():
    """With h = 1, B = 0 and Δ = 1 (Δ·A exact) the new state is exp(A) itself: A from the decay's floor (just above
    log of float32's smallest normal) to 0, where a state decays, and past 0 to 88, the clamp above; below the floor
    the decay is the floor's, as in the tensor step (never subnormal)."""
    floor = decay_exponent_floor(torch.float32)
    arguments = torch.cat([torch.linspace(floor, 88.0, 20_001), torch.tensor([-90.0, -300.0, -math.inf])])
    table = torch.ones(1, 1, arguments.numel())
    ones, zeros = torch.ones(1, 1), torch.zeros(1, arguments.numel())
    selective_step_rows_(table, torch.tensor([0]), torch.tensor([False]), ones, ones, arguments[None], zeros, zeros)
    want = torch.exp(arguments.double().clamp_min(floor))
    torch.testing.assert_close(table[0, 0].double(), want, rtol=2 * EPS32, atol=0)
    assert table.min() >= torch.finfo(torch.float32).tiny


def test_the_decays_exp_is_float32_arithmetic():
    """The kernel's exp (row_kernels._exp32) computes in float32 from its argument to its result: an int64 or a
    float64 among its values (numba's promotion of int64 × float32) halves the lanes of its vectors and adds
    conversions, which ran the kernel 2.5× slower with the same numbers to within round-off."""
    import numba  # (the module skips without it)

    from ssmhub.ops import row_kernels

    row_kernels._exp32(numba.float32(-1.5))  # compiles it for a float32 argument
    compiled = row_kernels._exp32.overloads[(numba.float32,)]
    values = {name: str(t) for name, t in compiled.type_annotation.typemap.items() if not name.startswith("$")}
    assert compiled.signature.return_type == numba.float32
    assert values and set(values.values()) == {"float32"}, values


def test_the_tensor_step_floors_the_decay_alike():
    """selective_step (the oracle of the kernel) clamps Δ·A at the same floor: a decay far below it is the floor's."""
    x, delta, B, C = torch.zeros(1, 2), torch.full((1, 2), 10.0), torch.zeros(1, 1), torch.ones(1, 1)
    A = torch.tensor([[-30.0], [-1.0]])  # Δ·A = −300 (floored) and −10
    _, h = selective_step(x, delta, A, B, C, state=torch.ones(1, 2, 1))
    want = torch.exp(torch.tensor([decay_exponent_floor(torch.float32), -10.0]))
    torch.testing.assert_close(h[0, :, 0], want, rtol=2 * EPS32, atol=0)


def test_a_new_request_in_a_reused_slot_starts_from_zero():
    """A slot that held another request's state (here NaN): with ``new`` its row ignores it, bit for bit as from
    zeros, and so does its output."""
    _, rows, _, o = _inputs(3, 4, 6, [2], seed=0)
    used, clean = torch.full((3, 4, 6), float("nan")), torch.zeros(3, 4, 6)
    from_used = selective_step_rows_(used, rows, torch.tensor([True]), *o.values())
    from_clean = selective_step_rows_(clean, rows, torch.tensor([False]), *o.values())
    assert torch.equal(used[2], clean[2]) and torch.equal(from_used, from_clean)


def test_without_skip_and_gate_it_is_the_bare_read_out():
    table, rows, new, o = _inputs(5, 3, 4, [4, 0], seed=3)
    _, y_tol = _tolerances(table, rows, new, {**o, "D": torch.zeros(3), "z": torch.ones(2, 3)})
    operands = [o[name] for name in ("x", "delta", "A", "B", "C")]
    want_y, _ = _oracle(table, rows, new, *operands)
    y = selective_step_rows_(table, rows, new, *operands)
    torch.testing.assert_close(y.double(), want_y, rtol=0, atol=y_tol)


def test_a_table_it_cannot_update_is_refused_naming_what_it_needs():
    assert not selective_kernel_available(torch.zeros(2, 3, 4, dtype=torch.float64))
    assert not selective_kernel_available(torch.zeros(2, 4, 3).transpose(-1, -2))  # modes not contiguous
    _, rows, new, o = _inputs(2, 3, 4, [0], seed=0)
    with pytest.raises(ValueError, match="float32 CPU table"):
        selective_step_rows_(torch.zeros(2, 3, 4, dtype=torch.float64), rows, new, *o.values())
    with pytest.raises(ValueError, match=r"B_t must have shape \(1, 4\)"):
        selective_step_rows_(torch.zeros(2, 3, 4), rows, new, *{**o, "B": torch.zeros(1, 5)}.values())


def _mamba(kind):
    torch.manual_seed(0)
    options = dict(state_size=5, expand=2, conv_kernel=4)
    if kind == "mamba":
        return MambaMixer(6, **options).eval()
    rates = [] if kind == "serpent" else [0.5, 0.2]
    return SerpentMixer(6, resampling_rates=rates, resampling_window=3, **options).eval()


@pytest.mark.parametrize("kind", ["mamba", "serpent", "serpent with branches"])
def test_step_rows_equals_the_protocols_gather_step_and_write_back(kind):
    """Mamba's kernel path (the convolution window by tensor ops, the SSM state in one pass) against
    TokenMixer.step_rows_ (index_select, the mixer's step, index_copy_), its oracle, with new requests in reused
    slots; SeRpEnt through its base Mamba's, its resampling branches (clocks, windows) by the protocol's path. The
    slots hold the states 9 rows of 11 tokens left."""
    mixer = _mamba(kind)
    assert mixer.steps_rows_in_one_pass
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        _, tables = mixer(torch.randn(9, 11, 6, generator=g), return_state=True)
    rows, new = torch.tensor([8, 0, 3, 5]), torch.tensor([False, True, False, True])
    x = torch.randn(4, 6, generator=g)
    y, want, ours, reference = step_rows_both_ways(mixer, tables, x, rows, new)
    for name in tables:
        if not reference[name].is_floating_point():
            assert torch.equal(ours[name], reference[name]), name
            continue
        scale = reference[name].abs().amax().item() + 1
        torch.testing.assert_close(ours[name], reference[name], rtol=0, atol=64 * EPS32 * scale, msg=name)
    torch.testing.assert_close(y, want, rtol=0, atol=1e-5 * (want.abs().amax().item() + 1))


def test_step_rows_keeps_the_autograd_path_when_a_gradient_is_asked_for():
    mixer = _mamba("mamba")
    tables = {name: torch.randn(4, *shape[1:]) for name, (shape, _) in mixer.state_layout(1).items()}
    x = torch.randn(2, 6, requires_grad=True)
    y = mixer.step_rows_(x, tables, torch.tensor([3, 1]), torch.tensor([False, False]))
    y.sum().backward()
    assert x.grad is not None and mixer.ssm.A_log.grad is not None
