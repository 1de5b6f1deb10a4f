"""The one-pass, in-place decode kernel of a diagonal recurrence (ssmhub.ops.diagonal_rows) against its float64
oracle, the recurrence of arXiv 2212.00768 Eq. 1 written out: shapes the other tests do not use (odd widths, one
row, 33 rows, slots out of order), rows that reuse a slot, new requests in a reused slot, a λ shared by the
channels and one per channel; and DLR's ``step_rows_`` against the mixer protocol's gather, step and write-back."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("numba")

from ssmhub.layers.dlr import DLRMixer
from ssmhub.layers.mixer import TokenMixer
from ssmhub.ops.diagonal_rows import diagonal_step_rows_, kernel_available

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
    [(7, 5, 9, [5, 1, 7, 2], True), (3, 17, 40, list(range(39, 6, -1)), False), (1, 1, 2, [1], True)],
    ids=["odd widths", "33 rows out of order", "one row"],
)
def test_kernel_equals_the_float64_recurrence(channels, modes, slots, rows, shared):
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
    z_re, z_im = diagonal_step_rows_(table, rows, new, u, lam, weights)

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
