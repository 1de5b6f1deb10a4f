"""A diagonal recurrence's decode step over rows of a state table, in one pass and in place, compiled for a CPU.

The step is :func:`~ssmhub.ops.diagonal_step.diagonal_step_planes` (DLR's Eq. 1, arXiv 2212.00768 §2:
``x_t = Λ x_{t-1} + u_t``, ``z_t = Σ_n w_n x_t[n]``) for the rows a serving engine runs at once, each with its state
in a row (slot) of a table. Written with tensor ops it is several passes over the state: gather the rows into a
copy, form the new planes, reduce them, write them back into the slots. A decode step is memory-bound (about 11
flops per 8-byte mode), so each pass costs what the whole step should. :func:`diagonal_step_rows_` reads each mode
of a row once and writes the new value where the old one was, reducing as it goes: one read and one write of the
state, the step's floor.

It is a numba kernel (numba comes with vLLM's CPU build; ``pip install numba`` elsewhere):
:func:`kernel_available` says whether it can run, and callers keep the tensor step as the fallback and the oracle.
The sum over modes runs in float32 in whatever order the compiler vectorizes it (``fastmath``): the same numbers
as the tensor step up to float32 round-off, not bit for bit.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

__all__ = ["diagonal_step_rows_", "kernel_available", "kernel_importable"]


@functools.cache
def kernel_importable() -> bool:
    """Whether numba is installed (looked up once; not imported until the kernel first runs)."""
    return importlib.util.find_spec("numba") is not None


def kernel_available(table: torch.Tensor) -> bool:
    """Whether :func:`diagonal_step_rows_` can update ``table`` (slots, H, 2, N): numba importable, a float32 CPU
    table whose planes are contiguous over the modes, and not under ``torch.compile`` (which cannot trace it)."""
    return (
        kernel_importable()
        and table.device.type == "cpu"
        and table.dtype == torch.float32
        and table.dim() == 4
        and table.shape[2] == 2
        and table.stride(-1) == 1
        and not torch.compiler.is_compiling()
    )


@functools.cache
def _kernel():
    """The compiled kernel (numba compiles it at the first call of a process; ``cache=True`` keeps it on disk)."""
    import numba
    import numpy as np

    @numba.njit(parallel=True, fastmath=True, cache=True, boundscheck=False)
    def step_rows(table, rows, new, u, lam_re, lam_im, w_re, w_im, z_re, z_im):
        num_rows, channels = u.shape
        modes = w_re.shape[1]
        shared = lam_re.shape[0] == 1  # one λ for every channel (DLR), or a row of λ per channel
        for flat in numba.prange(num_rows * channels):  # one (row, channel) per iteration, its N modes inside
            r = flat // channels
            h = flat - r * channels
            s = rows[r]  # the row's slot: indexed directly, no view (a view costs two atomic reference counts)
            k = 0 if shared else h
            if new[r]:  # the zero state before a first token
                for n in range(modes):
                    table[s, h, 0, n] = 0.0
                    table[s, h, 1, n] = 0.0
            u_rh = u[r, h]
            acc_re = np.float32(0.0)
            acc_im = np.float32(0.0)
            for n in range(modes):
                old_re = table[s, h, 0, n]
                old_im = table[s, h, 1, n]
                re = lam_re[k, n] * old_re - lam_im[k, n] * old_im + u_rh
                im = lam_re[k, n] * old_im + lam_im[k, n] * old_re
                table[s, h, 0, n] = re
                table[s, h, 1, n] = im
                acc_re += re * w_re[h, n] - im * w_im[h, n]
                acc_im += re * w_im[h, n] + im * w_re[h, n]
            z_re[r, h] = acc_re
            z_im[r, h] = acc_im

    return numba, step_rows


def diagonal_step_rows_(
    table: torch.Tensor,
    rows: torch.Tensor,
    new: torch.Tensor,
    u_t: torch.Tensor,
    lam: tuple[torch.Tensor, torch.Tensor],
    weights: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of ``x = λ x + u``, ``z = Σ_n w_n x[n]`` for the table rows ``rows``, updated in place.

    Args:
        table: (slots, H, 2, N) float32 state planes (Re, Im) of every slot; only the rows in ``rows`` change.
        rows: (R,) int slot of each running row (distinct); new: (R,) bool, rows that start from the zero state
            (a new request in a reused slot) instead of what their slot holds.
        u_t: (R, H) real input, added to every mode.
        lam: (Re λ, Im λ), each (N,) or (1, N) (one λ for every channel) or (H, N); weights: (Re w, Im w),
            each (H, N).
    Returns: (Re z, Im z), (R, H) float32 each.
    """
    if not kernel_available(table):
        raise ValueError(f"the kernel needs a float32 CPU table (slots, H, 2, N) and numba; got {table.dtype} "
                         f"{tuple(table.shape)} on {table.device}")  # fmt: skip
    num_rows, channels, modes = rows.shape[0], table.shape[1], table.shape[3]
    if u_t.shape != (num_rows, channels) or new.shape != (num_rows,):
        raise ValueError(f"u_t must be ({num_rows}, {channels}) and new ({num_rows},); got {tuple(u_t.shape)} and "
                         f"{tuple(new.shape)}")  # fmt: skip
    numba, step_rows = _kernel()
    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))
    lam = [t.float().reshape(-1, modes).contiguous().numpy() for t in lam]  # (1, N) shared, or (H, N)
    weights = [t.float().expand(channels, modes).contiguous().numpy() for t in weights]  # (H, N) each
    z_re, z_im = torch.empty(2, num_rows, channels)  # (R, H) float32 each
    step_rows(table.detach().numpy(), rows.long().numpy(), new.bool().numpy(), u_t.detach().float().numpy(),
              *lam, *weights, z_re.numpy(), z_im.numpy())  # fmt: skip
    return z_re, z_im
