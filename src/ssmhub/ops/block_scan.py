"""Block-diagonal input-dependent linear recurrence: the parallel matrix scan, its loop oracle and the O(1) step.

Paper: Fan, Chi & Rudnicky, "Advancing Regular Language Reasoning in Linear Recurrent Neural Networks"
(arXiv 2309.07412). Notation follows it: ``h`` independent b×b blocks ("heads") per layer,

- Eq. 5:  ``x_k = A_k x_{k-1} + v_k``  with  ``A_k = blockdiag(A_k^(1), ..., A_k^(h))``  (``v_k = B u_k``)
- §3.4:   the recurrence is a scan over the associative operator
          ``(A₂, v₂) ∘ (A₁, v₁) = (A₂A₁, A₂v₁ + v₂)``, so it runs in ⌈log₂ T⌉ parallel steps.

Convention (the authors' code): ``A[..., i, j]`` is row i, column j and the matvec is
``x_i ← Σ_j A[..., i, j] x_j`` (einsum ``'bhij,bhj->bhi'``); the Eq. 6 norm constraint is on columns.

:func:`block_scan` is work-efficient: it composes adjacent pairs, recurses on the half-length
sequence, and fills in the other half with one matvec each (the recursive form of Blelloch's
up-/down-sweep). That is at most T − 1 b×b matmuls and about 2T matvecs in all, with O(T·h·b²) autograd
memory, instead of the (T/2)·log₂T matmuls of the authors' PScan or T·log₂T of a Hillis–Steele scan.
:func:`block_scan_ref` is the plain loop over time; :func:`block_step` is one token of it.
"""

from __future__ import annotations

import torch

from .precision import float32_math

__all__ = [
    "block_scan",
    "block_scan_dtype",
    "block_scan_ref",
    "block_step",
    "check_block_scan_inputs",
    "restart_blocks",
]


def block_scan_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """The promoted floating dtype of the inputs, with half precision raised to float32."""
    dtype = None
    for t in tensors:
        if t is not None:
            dtype = t.dtype if dtype is None else torch.promote_types(dtype, t.dtype)
    if dtype is None or not dtype.is_floating_point or dtype.itemsize < 4:
        return torch.float32
    return dtype


def check_block_scan_inputs(A: torch.Tensor, v: torch.Tensor, initial_state: torch.Tensor | None) -> None:
    """Raise ValueError unless A is (batch, T, h, b, b), v is (batch, T, h, b), T ≥ 1 and the state fits."""
    if A.dim() != 5 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f"A must have shape (batch, T, h, b, b); got {tuple(A.shape)}")
    batch, seq_len, heads, block, _ = A.shape
    if v.dim() != 4 or tuple(v.shape) != (batch, seq_len, heads, block):
        raise ValueError(f"v must have shape (batch, T, h, b) = {(batch, seq_len, heads, block)}; got {tuple(v.shape)}")
    if seq_len < 1:
        raise ValueError(f"A and v must have at least one time step (T ≥ 1 along dim 1); got T = {seq_len}")
    if initial_state is not None and (
        initial_state.dim() != 3
        or initial_state.shape[0] not in (1, batch)
        or initial_state.shape[1:] != (heads, block)
    ):
        raise ValueError(
            f"initial_state must have shape (batch, h, b) = {(batch, heads, block)} or (1, h, b); "
            f"got {tuple(initial_state.shape)}"
        )


def _matvec(A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``x_i ← Σ_j A[..., i, j] x_j`` over any leading dims: (..., b, b) × (..., b) -> (..., b)."""
    return torch.matmul(A, x.unsqueeze(-1)).squeeze(-1)


def _scan(A: torch.Tensor, v: torch.Tensor, x0: torch.Tensor | None) -> torch.Tensor:
    """States x_1..x_T of ``x_k = A_k x_{k-1} + v_k`` from x_0 (None: zeros), by recursive pairing.

    A: (B, T, h, b, b), v: (B, T, h, b), x0: (B, h, b); returns (B, T, h, b), position k (0-based)
    holding x_{k+1}. Pairs (2i, 2i+1) are composed with ``(A₂A₁, A₂v₁ + v₂)``; the half-length scan
    of the pairs from the same x_0 gives the odd positions, and each even position is one step on
    from the odd position before it (or from x_0). An odd T leaves a tail token, stepped on at the end.
    Matrices are split with ``split``/``unbind`` rather than strided slices, whose backward would
    allocate and zero-fill a full-size gradient per slice. Autograd keeps about 2× the size of A
    (the de-interleaved A plus the composed pairs of every level: T/2 + T/4 + ... matrices).
    """
    batch, seq_len, heads, block, _ = A.shape
    if seq_len == 1:
        return v if x0 is None else (_matvec(A[:, 0], x0) + v[:, 0]).unsqueeze(1)
    half = seq_len // 2
    if seq_len % 2:
        A, a_tail = A.split([seq_len - 1, 1], dim=1)  # (B, T-1, h, b, b), (B, 1, h, b, b)
        v, v_tail = v.split([seq_len - 1, 1], dim=1)  # (B, T-1, h, b), (B, 1, h, b)
    # contiguous once here, or every matmul below would copy (and keep for backward) its own strided copy
    a_lo, a_hi = (a.contiguous() for a in A.unflatten(1, (half, 2)).unbind(2))  # (B, T/2, h, b, b): A_{2i}, A_{2i+1}
    v_lo, v_hi = v.unflatten(1, (half, 2)).unbind(2)  # (B, T/2, h, b) each
    v_pair = _matvec(a_hi, v_lo) + v_hi  # (B, T/2, h, b): A₂v₁ + v₂
    if half == 1 and x0 is None:
        odd = v_pair  # one pair from zero needs no composed matrix
    else:
        odd = _scan(torch.matmul(a_hi, a_lo), v_pair, x0)  # (B, T/2, h, b): positions 1, 3, 5, ...
    start = odd.new_zeros(batch, 1, heads, block) if x0 is None else x0.unsqueeze(1)  # (B, 1, h, b)
    before_even = torch.cat([start, odd[:, :-1]], dim=1)  # (B, T/2, h, b): states before positions 0, 2, ...
    even = _matvec(a_lo, before_even) + v_lo  # (B, T/2, h, b)
    states = torch.stack([even, odd], dim=2).flatten(1, 2)  # (B, 2·(T/2), h, b)
    if seq_len % 2:
        tail = _matvec(a_tail, odd[:, -1:]) + v_tail  # (B, 1, h, b)
        states = torch.cat([states, tail], dim=1)  # (B, T, h, b)
    return states


@float32_math
def block_scan(A: torch.Tensor, v: torch.Tensor, initial_state: torch.Tensor | None = None) -> torch.Tensor:
    """All states of ``x_k = A_k x_{k-1} + v_k`` (Eq. 5) by a work-efficient log-depth parallel scan (§3.4).

    Args:
        A: (batch, T, h, b, b) per-token blocks, ``A[..., i, j]`` = row i, column j.
        v: (batch, T, h, b) per-token inputs ``B u_k``.
        initial_state: x_0, (batch, h, b) or (1, h, b) broadcast over the batch; None means zeros.

    Returns:
        states (batch, T, h, b) = x_1..x_T (x_0 excluded); the final state is ``states[:, -1]``.
        Computed with autocast off, in float32 for half-precision inputs and in the inputs' dtype
        otherwise (float64 stays float64). Any T ≥ 1 works; depth ⌈log₂ T⌉, at most T − 1 b×b matmuls.
    """
    check_block_scan_inputs(A, v, initial_state)
    dtype = block_scan_dtype(A, v, initial_state)
    A, v = A.to(dtype), v.to(dtype)
    x0 = None if initial_state is None else initial_state.to(dtype).expand(A.shape[0], -1, -1)  # (batch, h, b)
    return _scan(A, v, x0)


def block_scan_ref(A: torch.Tensor, v: torch.Tensor, initial_state: torch.Tensor | None = None) -> torch.Tensor:
    """Reference for :func:`block_scan`: Eq. 5 one token at a time, in the inputs' (promoted) dtype."""
    check_block_scan_inputs(A, v, initial_state)
    batch, _, heads, block, _ = A.shape
    dtype = torch.promote_types(A.dtype, v.dtype)
    state = torch.zeros(batch, heads, block, dtype=dtype, device=A.device)
    if initial_state is not None:
        state = state + initial_state.to(dtype)
    states = []
    # unbind, not A[:, k]: the backward of T slices would write T full-size zero tensors (O(T²) traffic)
    for a_k, v_k in zip(A.to(dtype).unbind(1), v.to(dtype).unbind(1)):
        state = torch.einsum("bhij,bhj->bhi", a_k, state) + v_k
        states.append(state)
    return torch.stack(states, dim=1)  # (batch, T, h, b)


@float32_math
def block_step(A_t: torch.Tensor, v_t: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """One token of Eq. 5: ``x_k = A_k x_{k-1} + v_k``, O(h·b²) whatever k is.

    Args: A_t (batch, h, b, b); v_t (batch, h, b); state (batch, h, b) or (1, h, b).
    Returns: the new state (batch, h, b), float32 for half-precision inputs.
    """
    if A_t.dim() != 4 or A_t.shape[-1] != A_t.shape[-2]:
        raise ValueError(f"A_t must have shape (batch, h, b, b); got {tuple(A_t.shape)}")
    batch, heads, block, _ = A_t.shape
    if tuple(v_t.shape) != (batch, heads, block):
        raise ValueError(f"v_t must have shape (batch, h, b) = {(batch, heads, block)}; got {tuple(v_t.shape)}")
    if state.dim() != 3 or state.shape[0] not in (1, batch) or state.shape[1:] != (heads, block):
        raise ValueError(f"state must have shape (batch, h, b) = {(batch, heads, block)}; got {tuple(state.shape)}")
    dtype = block_scan_dtype(A_t, v_t, state)
    return _matvec(A_t.to(dtype), state.to(dtype)) + v_t.to(dtype)


def restart_blocks(
    A: torch.Tensor, v: torch.Tensor, starts: torch.Tensor, initial_state: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold document starts into the inputs of Eq. 5, so that any scan of them restarts there from x_0.

    At a start k the state must be ``x_k = A_k x_0 + v_k`` whatever came before (a packed row's next document
    begins as a sequence does), which is Eq. 5 itself with ``A_k → 0`` and ``v_k → v_k + A_k x_0``.

    Args: A (batch, T, h, b, b); v (batch, T, h, b); starts (batch, T) bool; initial_state x_0 (1 or batch, h, b)
        or None (zeros: then only ``A_k → 0``).
    Returns: ``(A', v')`` of the same shapes, equal to (A, v) away from the starts.
    """
    check_block_scan_inputs(A, v, initial_state)
    if tuple(starts.shape) != tuple(A.shape[:2]) or starts.dtype != torch.bool:
        raise ValueError(
            f"starts must be a bool tensor of shape (batch, T) = {tuple(A.shape[:2])}; got {tuple(starts.shape)}"
        )
    if initial_state is not None:
        fresh = _matvec(A, initial_state.to(A.dtype).unsqueeze(1))  # (batch, T, h, b): A_k x_0
        v = torch.where(starts[..., None, None], v + fresh, v)
    A = torch.where(starts[..., None, None, None], 0.0, A)  # (batch, T, h, b, b)
    return A, v
