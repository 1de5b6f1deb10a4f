"""block_scan against the sequential loop: values, gradients, final state, step, precision, work, stability."""

import itertools

import pytest
import torch
from devices import bf16_autocast
from torch.utils.flop_counter import FlopCounterMode

from ssmhub.ops import block_scan, block_scan_ref, block_step

LENGTHS = [1, 2, 3, 7, 39, 40, 64, 499, 500, 4096]


def _normalize_columns(raw: torch.Tensor, p: float = 1.0) -> torch.Tensor:
    """Eq. 6 projection per column: ``v / max(1, ‖v‖_p)``; columns run along dim -2 (``x_i ← Σ_j A_ij x_j``)."""
    norms = torch.linalg.vector_norm(raw, ord=p, dim=-2, keepdim=True)  # (..., 1, b)
    return raw / norms.clamp(min=1.0)


def _inputs(batch, seq_len, heads, block, seed=0, dtype=torch.float64, state="batch"):
    gen = torch.Generator().manual_seed(seed)
    A = _normalize_columns(2 * torch.randn(batch, seq_len, heads, block, block, generator=gen, dtype=torch.float64))
    v = torch.randn(batch, seq_len, heads, block, generator=gen, dtype=torch.float64)
    x0 = {
        "none": None,
        "batch": torch.randn(batch, heads, block, generator=gen, dtype=torch.float64),
        "shared": torch.randn(1, heads, block, generator=gen, dtype=torch.float64),
    }[state]
    return A.to(dtype), v.to(dtype), None if x0 is None else x0.to(dtype)


@pytest.mark.parametrize("seq_len", LENGTHS)
@pytest.mark.parametrize("state", ["none", "batch", "shared"])
def test_values_gradients_and_final_state_match_loop(seq_len, state):
    """float64: states, final state and gradients w.r.t. A, v, x_0 equal the loop's, for any T ≥ 1."""
    batch, heads, block = (1, 2, 3) if seq_len > 500 else (2, 2, 3)
    A, v, x0 = _inputs(batch, seq_len, heads, block, seed=seq_len, state=state)
    leaves = [t.requires_grad_() for t in (A, v, x0) if t is not None]
    weight = torch.randn(batch, seq_len, heads, block, generator=torch.Generator().manual_seed(1), dtype=A.dtype)

    fast = block_scan(A, v, x0)
    slow = block_scan_ref(A, v, x0)
    assert fast.shape == (batch, seq_len, heads, block) and fast.dtype == torch.float64
    torch.testing.assert_close(fast, slow, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(fast[:, -1], slow[:, -1], atol=1e-12, rtol=1e-10)
    # at T = 1 from x_0 = 0, A is unused (x_1 = v_1): its gradient is zero, not missing
    fast_grads = torch.autograd.grad((fast * weight).sum(), leaves, allow_unused=True, materialize_grads=True)
    slow_grads = torch.autograd.grad((slow * weight).sum(), leaves, allow_unused=True, materialize_grads=True)
    for name, a, b in zip(["A", "v", "x0"], fast_grads, slow_grads):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-10, msg=lambda m, n=name: f"grad {n}: {m}")


@pytest.mark.parametrize("seq_len", [40, 500])
def test_float32_agrees_with_float64_loop(seq_len):
    """fp32 scan on column-normalised blocks (b = h = 8, as in the paper) within 1e-4 of the float64 loop."""
    A, v, x0 = _inputs(4, seq_len, 8, 8, seed=7)
    expected = block_scan_ref(A, v, x0)
    got = block_scan(A.float(), v.float(), x0.float())
    assert got.dtype == torch.float32
    scale = expected.abs().max().item()
    torch.testing.assert_close(got.double(), expected, atol=1e-4 * scale, rtol=1e-4)


def test_iterated_step_equals_scan():
    """Prefill with the scan, then block_step token by token: the states continue, to float64 round-off."""
    A, v, x0 = _inputs(3, 23, 2, 4, seed=3)
    states = block_scan(A, v, x0)
    prefix = block_scan(A[:, :10], v[:, :10], x0)
    state = prefix[:, -1]
    for k in range(10, 23):
        state = block_step(A[:, k], v[:, k], state)
        torch.testing.assert_close(state, states[:, k], atol=1e-12, rtol=1e-10)
    state = x0[:1]  # a (1, h, b) state broadcasts over the batch
    A1, v1 = A[:1], v[:1]
    for k in range(23):
        state = block_step(A1[:, k], v1[:, k], state)
    torch.testing.assert_close(state, block_scan(A1, v1, x0[:1])[:, -1], atol=1e-12, rtol=1e-10)


def test_bfloat16_under_autocast_computes_in_float32():
    A, v, x0 = _inputs(2, 100, 2, 4, seed=5, dtype=torch.bfloat16)
    expected = block_scan_ref(A.double(), v.double(), x0.double())  # the exact recurrence of the bf16 values
    with bf16_autocast():
        got = block_scan(A, v, x0)
        step = block_step(A[:, 0], v[:, 0], x0)
    assert got.dtype == torch.float32 and step.dtype == torch.float32
    # bf16 arithmetic would be off by ~1e-2 here; float32 is off by ~1e-6
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(step.double(), expected[:, 0], atol=1e-6, rtol=1e-6)


def test_half_precision_inputs_without_autocast_compute_in_float32():
    A, v, _ = _inputs(1, 9, 1, 2, dtype=torch.float16)
    assert block_scan(A, v).dtype == torch.float32


def test_work_is_linear_in_length():
    """O(T) b×b matmuls (work-efficient), not the O(T log T) of a Hillis–Steele scan."""
    batch, heads, block = 1, 2, 8
    flops = {}
    for seq_len in (512, 4096):
        A, v, x0 = _inputs(batch, seq_len, heads, block, dtype=torch.float32)
        with FlopCounterMode(display=False) as counter:
            block_scan(A, v, x0)
        flops[seq_len] = counter.get_total_flops()
    per_token = 2 * heads * (block**3 + 3 * block**2)  # ≤ 1 matmul and ≤ 3 matvecs per token, 2 flops per MAC
    assert flops[4096] <= per_token * batch * 4096
    assert flops[4096] / flops[512] < 8.2  # exactly linear would be 8; T log T would be 8 · 12/9 ≈ 10.7


@pytest.mark.parametrize("sign", ["signed", "nonnegative"])
def test_p1_normalised_products_stay_bounded_over_100k_steps(sign):
    """Spec §1.4 / paper Eq. 7: with column 1-norms ≤ 1, ‖x_k‖₁ ≤ ‖x_0‖₁ + Σ_{j≤k} ‖v_j‖₁ for every k.

    The non-negative case is the tight one: column-stochastic blocks preserve the 1-norm exactly, so the
    bound is met with equality and any growth from the scan's reordered products would show.
    """
    gen = torch.Generator().manual_seed(11)
    batch, seq_len, heads, block, chunk = 1, 100_000, 2, 4, 25_000
    raw = 3 * torch.randn(batch, seq_len, heads, block, block, generator=gen, dtype=torch.float64)
    v = torch.zeros(batch, seq_len, heads, block, dtype=torch.float64)
    v[:, 0] = torch.randn(batch, heads, block, generator=gen, dtype=torch.float64)  # v = 0 after the first step
    x0 = torch.randn(batch, heads, block, generator=gen, dtype=torch.float64)
    if sign == "nonnegative":
        raw, v, x0 = raw.abs() + 1, v.abs(), x0.abs()  # every column norm > 1, so each is projected to exactly 1
    A = _normalize_columns(raw, p=1.0)
    assert torch.linalg.vector_norm(A, ord=1, dim=-2).max() <= 1 + 1e-12

    bound = x0.abs().sum(-1).unsqueeze(1) + v.abs().sum(-1).cumsum(1)  # (batch, T, h)
    state, norms = x0, []
    for start in range(0, seq_len, chunk):  # the parallel scan in chunks, each handing its state on
        states = block_scan(A[:, start : start + chunk], v[:, start : start + chunk], state)
        norms.append(states.abs().sum(-1))  # (batch, chunk, h)
        state = states[:, -1]
    norms = torch.cat(norms, dim=1)
    assert torch.isfinite(norms).all()
    assert (norms <= bound * (1 + 1e-6)).all()
    if sign == "nonnegative":
        torch.testing.assert_close(norms, bound, rtol=1e-9, atol=0)  # the norm is carried, not lost


BAD_SHAPES = [
    ((2, 5, 3, 4), (2, 5, 3, 4), None, "A must have shape"),
    ((2, 5, 3, 4, 3), (2, 5, 3, 4), None, "A must have shape"),
    ((2, 5, 3, 4, 4), (2, 5, 3, 3), None, "v must have shape"),
    ((2, 5, 3, 4, 4), (2, 6, 3, 4), None, "v must have shape"),
    ((2, 0, 3, 4, 4), (2, 0, 3, 4), None, "T = 0"),
    ((2, 5, 3, 4, 4), (2, 5, 3, 4), (3, 3, 4), "initial_state must have shape"),
    ((2, 5, 3, 4, 4), (2, 5, 3, 4), (2, 3, 5), "initial_state must have shape"),
    ((2, 5, 3, 4, 4), (2, 5, 3, 4), (2, 1, 3, 4), "initial_state must have shape"),
]


@pytest.mark.parametrize("fn", [block_scan, block_scan_ref])
@pytest.mark.parametrize(("a_shape", "v_shape", "x0_shape", "message"), BAD_SHAPES)
def test_bad_shapes_raise_naming_the_argument(fn, a_shape, v_shape, x0_shape, message):
    x0 = None if x0_shape is None else torch.zeros(x0_shape)
    with pytest.raises(ValueError, match=message):
        fn(torch.zeros(a_shape), torch.zeros(v_shape), x0)


@pytest.mark.parametrize(
    ("a_shape", "v_shape", "state_shape", "message"),
    [
        ((2, 3, 4), (2, 3, 4), (2, 3, 4), "A_t must have shape"),
        ((2, 3, 4, 4), (2, 3, 5), (2, 3, 4), "v_t must have shape"),
        ((2, 3, 4, 4), (2, 3, 4), (3, 3, 4), "state must have shape"),
    ],
)
def test_step_bad_shapes_raise_naming_the_argument(a_shape, v_shape, state_shape, message):
    with pytest.raises(ValueError, match=message):
        block_step(torch.zeros(a_shape), torch.zeros(v_shape), torch.zeros(state_shape))


@pytest.mark.parametrize("scan", [block_scan, block_scan_ref])
@pytest.mark.parametrize("learned_x0", [True, False])
def test_restarted_blocks_scan_every_document_from_x0(scan, learned_x0):
    """restart_blocks (A_k → 0, v_k → v_k + A_k x_0 at a start) makes a scan of a packed row equal each document
    scanned alone from x_0 (documents of lengths 1, 2 and longer; a row that continues its incoming state, a row
    that restarts at 0), values and gradients of A, v and x_0."""
    from ssmhub.ops import restart_blocks

    A, v, carried = _inputs(2, 11, 2, 3, seed=4)
    x0 = torch.randn(1, 2, 3, dtype=torch.float64) if learned_x0 else None
    starts = torch.zeros(2, 11, dtype=torch.bool)
    starts[0, [3, 4, 6]] = True
    starts[1, [0, 8]] = True
    leaves = [t.clone().requires_grad_() for t in (A, v, x0) if t is not None]
    A_l, v_l = leaves[:2]
    x0_l = leaves[2] if learned_x0 else None
    got = scan(*restart_blocks(A_l, v_l, starts, x0_l), carried)
    rows = []
    for b in range(2):
        bounds = [0] + [t for t in starts[b].nonzero().flatten().tolist() if t > 0] + [11]
        pieces = []
        for i, (s, e) in enumerate(itertools.pairwise(bounds)):
            fresh = i > 0 or bool(starts[b, 0])
            pieces.append(
                block_scan_ref(A_l[b : b + 1, s:e], v_l[b : b + 1, s:e], x0_l if fresh else carried[b : b + 1])
            )
        rows.append(torch.cat(pieces, 1))
    expected = torch.cat(rows)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    weights = torch.randn_like(got)
    grads = torch.autograd.grad((got * weights).sum(), leaves)
    grads_ref = torch.autograd.grad((expected * weights).sum(), leaves)
    for name, g, e in zip(("A", "v", "x0"), grads, grads_ref):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12, msg=name)
