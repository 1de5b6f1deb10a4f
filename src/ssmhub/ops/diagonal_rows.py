"""A diagonal recurrence's decode step over rows of a state table, in one pass and in place, compiled for a CPU.

The step is :func:`~ssmhub.ops.diagonal_step.diagonal_step_planes` (DLR's Eq. 1, arXiv 2212.00768 §2:
``x_t = Λ x_{t-1} + u_t``, ``z_t = Σ_n w_n x_t[n]``) for the rows a serving engine runs at once, each with its state
in a row (slot) of a table. Written with tensor ops it is several passes over the state: gather the rows into a
copy, form the new planes, reduce them, write them back into the slots. A decode step is memory-bound (about 11
flops per 8-byte mode), so each pass costs what the whole step should. :func:`diagonal_step_rows_` reads each mode
of a row once and writes the new value where the old one was, reducing as it goes: one read and one write of the
state, the step's floor. :func:`modal_kv_step_rows_` is the same recurrence as H3 decodes it with its SSM in modal
form: one diagonal state per pair of a head's channels, driven by the outer product k ⊗ v and read out against q.

Every row reads the same read-out weights w (H, N), as large as one row's state. :func:`diagonal_step_rows_` walks
the channels in tiles whose weights fit in L2 (:data:`_TILE_FLOATS`) and runs every row through a tile before the
next, so the weights are fetched from memory once per step instead of once per row, while each row's slice of its
state is still read front to back. :func:`modal_kv_step_rows_` does the same with its heads, whose λ and residues
are four (H, N) planes.

It is a numba kernel (numba comes with vLLM's CPU build; ``pip install numba`` elsewhere), compiled in
:mod:`~ssmhub.ops.row_kernels` (which prefetches the state ahead of its reads):
:func:`kernel_available` says whether it can run, and callers keep the tensor step as the fallback and the oracle.
The sum over modes runs in float32 in whatever order the compiler vectorizes it (``fastmath``): the same numbers
as the tensor step up to float32 round-off, not bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch

from .row_tables import flat_rows, rows_kernel_usable, table_layout
from .window_rows import kernel_taps, window_kernel_available

__all__ = [
    "DiagonalRowsStep",
    "ModalRowsStep",
    "diagonal_step_rows_",
    "kernel_available",
    "modal_kernel_available",
    "modal_kv_step_rows_",
]


def kernel_available(table: torch.Tensor) -> bool:
    """Whether :func:`diagonal_step_rows_` can update ``table`` (slots, H, 2, N): numba importable, a float32 CPU
    table with each slot's (H, 2, N) planes contiguous, and not under ``torch.compile``
    (:func:`~ssmhub.ops.row_tables.rows_kernel_usable`)."""
    return rows_kernel_usable(table, torch.float32, 4) and table.shape[2] == 2


def modal_kernel_available(table: torch.Tensor) -> bool:
    """Whether :func:`modal_kv_step_rows_` can update ``table`` (slots, d_h, d_h, H, N): numba importable, a
    complex64 CPU table with each slot's block contiguous, and not under ``torch.compile``."""
    return rows_kernel_usable(table, torch.complex64, 5)


_TILE_FLOATS = 32_768  # 128 KB of read-out weights (Re and Im) per tile of channels: L2-resident on current x86


def diagonal_step_rows_(
    table: torch.Tensor,
    rows: torch.Tensor,
    new: torch.Tensor,
    u_t: torch.Tensor,
    lam: tuple[torch.Tensor, torch.Tensor],
    weights: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of ``x = λ x + u``, ``z = Σ_n w_n x[n]`` for the table rows ``rows``, updated in place: one call of
    :class:`DiagonalRowsStep`, which a decode loop keeps between steps instead.

    Args:
        table: (slots, H, 2, N) float32 state planes (Re, Im) of every slot; only the rows in ``rows`` change.
        rows: (R,) int slot of each running row (distinct); new: (R,) bool, rows that start from the zero state
            (a new request in a reused slot) instead of what their slot holds.
        u_t: (R, H) real input, added to every mode.
        lam: (Re λ, Im λ), each (N,) or (1, N) (one λ for every channel) or (H, N); weights: (Re w, Im w),
            each (H, N).
    Returns: (Re z, Im z), (R, H) float32 each.
    """
    return DiagonalRowsStep(table, lam, weights)(table, rows, new, u_t)


class DiagonalRowsStep:
    """:func:`diagonal_step_rows_` for one λ and w and one table layout, with what depends only on them (λ and w as
    numpy planes, the table's checks) formed once, as :class:`ModalRowsStep` does for H3: a decode loop keeps one
    per layer while neither changes. It holds no table: each call names the one it steps, which must be laid out as
    the one it was formed for. The weights are read as they are now: when they change, form a new one."""

    def __init__(self, table, lam, weights):
        if not kernel_available(table):
            raise ValueError(f"the kernel needs a float32 CPU table (slots, H, 2, N), each slot's planes contiguous, "
                             f"and numba, outside torch.compile; got {table.dtype} {tuple(table.shape)} with strides "
                             f"{table.stride()} on {table.device}")  # fmt: skip
        self.channels, modes = table.shape[1], table.shape[3]
        self._lam = [t.detach().float().reshape(-1, modes).contiguous().numpy() for t in lam]  # (1, N) or (H, N)
        self._weights = [t.detach().float().expand(self.channels, modes).contiguous().numpy() for t in weights]
        self._layout = table_layout(table)
        self._tile = max(1, _TILE_FLOATS // (2 * modes))  # channels whose w stays in L2 while every row reads it

    def __call__(self, table, rows, new, u_t) -> tuple[torch.Tensor, torch.Tensor]:
        """table (slots, H, 2, N) laid out as at forming, rows (R,) slots, new (R,) bool, u_t (R, H) -> (Re z, Im z)
        (R, H) float32 each; the rows' states updated in place."""
        _check_layout(table, self._layout, "table")
        num_rows = rows.shape[0]
        if u_t.shape != (num_rows, self.channels) or new.shape != (num_rows,) or rows.dim() != 1:
            raise ValueError(f"u_t must be ({num_rows}, {self.channels}) and new ({num_rows},) for rows "
                             f"{tuple(rows.shape)}; got {tuple(u_t.shape)} and {tuple(new.shape)}")  # fmt: skip
        from .row_kernels import diagonal_step_rows, use_torch_threads  # imports numba, at the first call

        use_torch_threads()
        z_re, z_im = torch.empty(2, num_rows, self.channels, device=u_t.device)  # (R, H) float32 each
        rows, new, u_t = rows.long().numpy(), new.bool().numpy(), u_t.detach().float().contiguous().numpy()
        diagonal_step_rows(*flat_rows(table), rows, new, u_t, *self._lam, *self._weights, z_re.numpy(), z_im.numpy(),
                           self._tile)  # fmt: skip
        return z_re, z_im


def modal_kv_step_rows_(
    table: torch.Tensor,
    rows: torch.Tensor,
    new: torch.Tensor,
    qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    lam: tuple[torch.Tensor, torch.Tensor],
    residues: tuple[torch.Tensor, torch.Tensor],
    direct: torch.Tensor,
    shift: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None,
) -> torch.Tensor:
    """H3's state-passing step (arXiv 2212.14052 §3.1, its SSM in modal form) for the table rows ``rows``, in place:
    per head h, the state x[i, j] of each pair of head channels takes ``x = λ x + k_i v_j`` (every mode), is read
    out as ``s_ij = Re Σ_n c_n x[n] + D_h k_i v_j`` and contracted with q: ``o_j = Σ_i q_i s_ij``. With ``shift``,
    k is first passed through H3's shift convolution (§3.1's shift SSM, a short causal convolution), its window
    shifted in place in the same call (:func:`~ssmhub.ops.window_rows.window_step_rows_`'s step): one call per layer
    and step where two cost two calls' dispatch, which a served step spends more on than on either window's bytes.

    One call of :class:`ModalRowsStep`, which a decode loop keeps between steps instead.

    Args:
        table: (slots, d_h, d_h, H, N) complex64 modal states of every slot; only the rows in ``rows`` change.
        rows: (R,) int slot of each running row (distinct); new: (R,) bool, rows that start from the zero state
            (and an empty shift window).
        qkv: q, k (shifted already, unless ``shift`` is given), and v, each (R, H, d_h) float32 (head h's channels
            h·d_h … h·d_h + d_h − 1).
        lam, residues: (Re, Im) of λ and of the residues c, each (H, N); direct: (H,) D, the skip and the modal
            direct term together.
        shift: None, or (window table (slots, H·d_h, M) float32, taps (H·d_h, K), skip (H·d_h,) or None), as
            :func:`~ssmhub.ops.window_rows.window_step_rows_` takes them, one tap row per channel.
    Returns: o (R, H, d_h) float32.
    """
    q = qkv[0]
    if table.dim() != 5 or q.dim() != 3 or table.shape[1:4] != (q.shape[2], q.shape[2], q.shape[1]):
        raise ValueError(f"table must be (slots, d_h, d_h, H, N) for q (R, H, d_h) {tuple(q.shape)}; got "
                         f"{tuple(table.shape)}")  # fmt: skip
    if any(t.shape != q.shape for t in qkv):
        raise ValueError(f"k and v must be shaped as q {tuple(q.shape)}; got {[tuple(t.shape) for t in qkv]}")
    step = ModalRowsStep(table, lam, residues, direct, shift)
    qkv = torch.stack(qkv, 1).flatten(1)  # (R, 3, H, d_h) -> (R, 3·H·d_h)
    return step(table, rows, new, qkv, None if shift is None else shift[0]).view_as(q)


class ModalRowsStep:
    """:func:`modal_kv_step_rows_` for one set of weights and one layout of the tables, with what depends only on
    them (λ, the residues, D and the shift's taps as numpy arrays, the tables' checks) formed once: a decode loop
    keeps one per layer while neither changes, and each step then hands the kernel only its tables, rows and inputs
    (formed anew each call, those conversions and checks are Python work repeated for every layer of every step). It
    holds no table: each call names the ones it steps, laid out as those it was formed for. The arguments are
    :func:`modal_kv_step_rows_`'s, the weights read as they are now: when they change, form a new one."""

    def __init__(self, table, lam, residues, direct, shift=None):
        if not modal_kernel_available(table):
            raise ValueError(f"the kernel needs a complex64 CPU table, each slot's block contiguous, and numba, "
                             f"outside torch.compile; got {table.dtype} {tuple(table.shape)} with strides "
                             f"{table.stride()} on {table.device}")  # fmt: skip
        slots, self.width, _, self.heads, modes = table.shape
        if table.shape[1] != table.shape[2]:
            raise ValueError(f"table must be (slots, d_h, d_h, H, N); got {tuple(table.shape)}")
        planes = (*lam, *residues, direct)
        if any(t.shape != (self.heads, modes) for t in planes[:4]) or direct.shape != (self.heads,):
            raise ValueError(f"λ and the residues must be ({self.heads}, {modes}) each and direct ({self.heads},) "
                             f"for a table {tuple(table.shape)}; got {[tuple(t.shape) for t in planes]}")  # fmt: skip
        self._shift = _shift_operands(shift, slots, self.heads * self.width)  # checked before any state changes
        self._planes = [t.detach().float().contiguous().numpy() for t in planes]  # (H, N) each, D (H,)
        self._layouts = table_layout(table), table_layout(None if shift is None else shift[0])
        self._tile = max(1, _TILE_FLOATS // (4 * modes))  # heads whose λ and residues stay in L2 for every row

    def __call__(self, table, rows, new, qkv, shift_table=None) -> torch.Tensor:
        """table and shift_table (the shift's window table, None without a shift) laid out as at forming, rows (R,)
        slots, new (R,) bool, qkv (R, 3·H·d_h): q, k and v side by side (an input projection's output as it is;
        float32) -> o (R, H·d_h) float32; the rows' states updated in place."""
        _check_layout(table, self._layouts[0], "table")
        _check_layout(shift_table, self._layouts[1], "shift_table")
        num_rows, channels = rows.shape[0], self.heads * self.width
        if qkv.shape != (num_rows, 3 * channels) or new.shape != (num_rows,) or rows.dim() != 1:
            raise ValueError(f"qkv must be ({num_rows}, {3 * channels}) and new ({num_rows},) for rows "
                             f"{tuple(rows.shape)}; got {tuple(qkv.shape)} and {tuple(new.shape)}")  # fmt: skip
        from .row_kernels import modal_step_rows, use_torch_threads  # imports numba, at the first call

        use_torch_threads()
        qkv = qkv.detach().float().contiguous().view(num_rows, 3, self.heads, self.width)  # [r, q|k|v, h, i]
        k_shift, out = torch.empty(2, num_rows, self.heads, self.width, device=qkv.device)  # (R, H, d_h) each
        window, taps, current = self._shift
        shifts = (np.zeros(1, np.float32), 0) if shift_table is None else flat_rows(shift_table)  # (flat, stride)
        rows, new, table = rows.long().numpy(), new.bool().numpy(), torch.view_as_real(table.detach())
        modal_step_rows(*flat_rows(table), *shifts, window, rows, new, qkv.numpy(), taps, current, *self._planes,
                        k_shift.numpy(), out.numpy(), self._tile)  # fmt: skip
        return out.view(num_rows, channels)


def _shift_operands(shift, slots: int, channels: int):
    """``modal_kv_step_rows_``'s shift as the kernel takes it, but for its window table: (window M, taps
    (channels, ≥ M + 1) float32, current-input weights (channels,)); no shift is a window of none with unit
    weights (k as it is). A ValueError naming what differs, before any work."""
    if shift is None:
        return 0, np.ones((channels, 1), np.float32), np.ones(channels, np.float32)
    table, taps, skip = shift
    if not window_kernel_available(table) or table.shape[:2] != (slots, channels):
        raise ValueError(f"shift's window table must be a float32 CPU table ({slots}, {channels}, M), each slot's "
                         f"block contiguous; got {table.dtype} {tuple(table.shape)} on {table.device}")  # fmt: skip
    window = table.shape[2]
    if taps.shape[0] != channels or taps.dim() != 2 or (skip is not None and skip.shape != (channels,)):
        raise ValueError(f"shift's taps must be ({channels}, K) and its skip ({channels},) or None; got "
                         f"{tuple(taps.shape)} and {None if skip is None else tuple(skip.shape)}")  # fmt: skip
    return (window, *kernel_taps(taps, skip, window))


def _check_layout(table, layout, name: str) -> None:
    """A ValueError unless ``table`` has ``layout`` (:func:`~ssmhub.ops.row_tables.table_layout`), the one a step
    was formed and checked for."""
    if table_layout(table) != layout:
        raise ValueError(f"{name} must be laid out as the one this step was formed for, {layout}; got "
                         f"{table_layout(table)}")  # fmt: skip
