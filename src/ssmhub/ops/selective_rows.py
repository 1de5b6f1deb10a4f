"""The selective SSM's decode step over rows of a state table, in one pass and in place, compiled for a CPU.

The step is :func:`~ssmhub.ops.selective_scan.selective_step` (Mamba's recurrence, arXiv 2312.00752 §3.4, Euler
``B̄ = Δ B`` as its reference code; SeRpEnt's Eq. 2 and 8, arXiv 2501.11729 §3):
``h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t x_t``, ``y_t = (C_t · h_t + D x_t) · SiLU(z_t)``, for the rows a serving engine
(or ``generate``) runs at once, each with its state in a row (slot) of a table. Written with tensor ops it is a
gather, the decay, the update, the read-out and a write-back: several passes over an (E, N) state per row, where a
decode step should make one. :func:`selective_step_rows_` reads each element of a row's state once, writes the new
value where the old one was and reduces the read-out as it goes.

Unlike DLR's λ, the decay exp(Δ_t A) depends on the token: one exp per state element and token (E·N per row).
numba compiles ``math.exp`` to a scalar libm call unless Intel's SVML is installed, which would make the step
exp-bound; the kernel evaluates it as Cephes' ``expf`` instead (the argument reduced by ln 2 in two parts, a
degree-6 polynomial, the power of two built from its exponent bits), which LLVM vectorizes: within one float32
ulp of exp on the range it clamps to, up to 88.7 from the tensor step's floor
(:func:`~ssmhub.ops.selective_scan.decay_exponent_floor`: a decay is never subnormal).

It is a numba kernel like :mod:`ssmhub.ops.diagonal_rows`, compiled in :mod:`~ssmhub.ops.row_kernels` (numba comes
with vLLM's CPU build); callers keep the tensor step as the fallback and the oracle. The read-out sums in float32 in
whatever order the compiler vectorizes it (``fastmath``): the tensor step's numbers up to float32 round-off, not bit
for bit.
"""

from __future__ import annotations

import torch

from .row_tables import check_row_operands, flat_rows, rows_kernel_usable

__all__ = ["selective_kernel_available", "selective_step_rows_"]


def selective_kernel_available(table: torch.Tensor) -> bool:
    """Whether :func:`selective_step_rows_` can update ``table`` (slots, E, N): numba importable, a float32 CPU table
    with each slot's (E, N) block contiguous, and not under ``torch.compile``
    (:func:`~ssmhub.ops.row_tables.rows_kernel_usable`)."""
    return rows_kernel_usable(table, torch.float32, 3)


def selective_step_rows_(
    table: torch.Tensor,
    rows: torch.Tensor,
    new: torch.Tensor,
    x_t: torch.Tensor,
    delta_t: torch.Tensor,
    A: torch.Tensor,
    B_t: torch.Tensor,
    C_t: torch.Tensor,
    D: torch.Tensor | None = None,
    z_t: torch.Tensor | None = None,
) -> torch.Tensor:
    """One selective-SSM step for the table rows ``rows``, their states updated in place.

    Args:
        table: (slots, E, N) float32 states of every slot; only the rows in ``rows`` change.
        rows: (R,) int slot of each running row (distinct); new: (R,) bool, rows that start from the zero state
            (a new request in a reused slot) instead of what their slot holds.
        x_t, delta_t: (R, E) input and step size Δ_t (softplus applied). A: (E, N). B_t, C_t: (R, N).
        D: (E,) or None. z_t: (R, E) gate or None.
    Returns: y_t (R, E) float32.
    """
    if not selective_kernel_available(table):
        raise ValueError(f"the kernel needs a float32 CPU table (slots, E, N), each slot's (E, N) contiguous, and "
                         f"numba, outside torch.compile; got {table.dtype} {tuple(table.shape)} with strides "
                         f"{table.stride()} on {table.device}")  # fmt: skip
    num_rows, (channels, modes) = rows.shape[0], table.shape[1:]
    per_row, per_mode = (num_rows, channels), (num_rows, modes)
    shapes = {"new": (new, (num_rows,)), "x_t": (x_t, per_row), "delta_t": (delta_t, per_row),
              "A": (A, (channels, modes)), "B_t": (B_t, per_mode), "C_t": (C_t, per_mode)}  # fmt: skip
    if z_t is not None:
        shapes["z_t"] = (z_t, (num_rows, channels))
    if D is not None:
        shapes["D"] = (D, (channels,))
    check_row_operands(shapes, table, num_rows)
    from .row_kernels import selective_step_rows, use_torch_threads  # imports numba, at the first call

    use_torch_threads()
    cpu = table.device
    gate = torch.ones(num_rows, channels, device=cpu) if z_t is None else torch.nn.functional.silu(z_t.detach().float())
    skip = torch.zeros(channels, device=cpu) if D is None else D
    operands = [t.detach().float().contiguous().numpy() for t in (x_t, delta_t, A, B_t, C_t, skip, gate)]
    y = torch.empty(num_rows, channels, device=cpu)  # (R, E) float32
    selective_step_rows(*flat_rows(table), rows.long().numpy(), new.bool().numpy(), *operands, y.numpy())
    return y
