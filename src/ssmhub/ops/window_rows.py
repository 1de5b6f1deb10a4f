"""A short causal convolution's decode step over rows of a state table, its window shifted in place, compiled for a
CPU: H3's shift convolution (arXiv 2212.14052 §3.1) and Mamba's depthwise convolution before its SSM (arXiv
2312.00752 §3.4, its reference code's ``conv1d``).

Each channel keeps its last M inputs (a window, oldest first); a step's output is
``y_t = Σ_{j=0}^{M} K_j u_{t−j} + D u_t + b`` and the window drops its oldest input for u_t
(:func:`~ssmhub.ops.longconv.causal_conv_step`, the oracle and the fallback). Written with tensor ops it is a
gather of the rows' windows, a concatenation, a product, a sum and a write-back: half a dozen ops per layer on a few
inputs per channel, each costing more in dispatch than in arithmetic. :func:`window_step_rows_` does it in one call
(:func:`~ssmhub.ops.row_kernels.window_step_rows`, numba), reading each window where its slot holds it, and by
those tensor ops where the kernel cannot run (no numba, another dtype, under ``torch.compile``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .longconv import causal_conv_step
from .row_tables import check_row_operands, flat_rows, rows_kernel_usable

__all__ = ["kernel_taps", "window_kernel_available", "window_step_rows_"]


def window_kernel_available(table: torch.Tensor) -> bool:
    """Whether :func:`window_step_rows_` can update ``table`` (slots, H, M), M ≥ 1: numba importable, a float32 CPU
    table with each slot's (H, M) block contiguous, and not under ``torch.compile``."""
    return rows_kernel_usable(table, torch.float32, 3) and table.shape[2] >= 1


def kernel_taps(taps: torch.Tensor, skip: torch.Tensor | None, window: int):
    """``taps`` (T, K) and ``skip`` (T,) or None as the window kernels take them: (taps (T, ≥ M + 1), zeros past K
    where K ≤ M; the current input's weight taps[:, 0] + skip (T,)), float32 numpy arrays, for a window of M."""
    taps = taps.detach().float()
    if taps.shape[1] <= window:  # fewer taps than the window reaches: zeros past K, (T, M + 1)
        taps = F.pad(taps, (0, window + 1 - taps.shape[1]))
    current = taps[:, 0] if skip is None else taps[:, 0] + skip.detach().float()  # (T,): the weight of u_t
    return taps.contiguous().numpy(), current.contiguous().numpy()


def window_step_rows_(
    table: torch.Tensor,
    rows: torch.Tensor,
    new: torch.Tensor,
    u_t: torch.Tensor,
    taps: torch.Tensor,
    skip: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """One step of a short causal convolution for the table rows ``rows``, their windows shifted in place: by the
    kernel where :func:`window_kernel_available`, else by tensor ops (the rows' windows gathered,
    :func:`~ssmhub.ops.longconv.causal_conv_step`, written back).

    Args:
        table: (slots, H, M) windows of every slot, the last M inputs oldest first; only the rows in ``rows``
            change.
        rows: (R,) int slot of each running row (distinct); new: (R,) bool, rows whose window starts empty (zeros:
            a new request in a reused slot) instead of what their slot holds.
        u_t: (R, H) the new inputs. taps: (T, K), T dividing H, channel c's row c mod T (H3's heads share their
            head's filter); tap j meets the input j steps back (only the first M + 1 are used; fewer are
            zero-padded). skip: (T,) D or None; bias: (T,) b or None.
    Returns: y_t (R, H) float32.
    """
    num_rows, channels, tap_rows = rows.shape[0], table.shape[1], taps.shape[0]
    if taps.dim() != 2 or channels % max(1, tap_rows):
        raise ValueError(f"taps must have shape (T, K) with T dividing the table's {channels} channels; got "
                         f"{tuple(taps.shape)}")  # fmt: skip
    shapes = {"new": (new, (num_rows,)), "u_t": (u_t, (num_rows, channels))}
    for name, tensor in (("skip", skip), ("bias", bias)):
        if tensor is not None:
            shapes[name] = (tensor, (tap_rows,))
    check_row_operands(shapes, table, num_rows)
    if not window_kernel_available(table):
        repeat = channels // tap_rows  # channel c = k·T + t takes row t
        taps, skip, bias = (None if t is None else t.repeat(repeat, *[1] * (t.dim() - 1)) for t in (taps, skip, bias))
        window = torch.where(new[:, None, None], 0.0, table.index_select(0, rows))  # (R, H, M)
        y, window = causal_conv_step(u_t, window, taps, skip)
        table.index_copy_(0, rows, window.to(table.dtype))
        return y if bias is None else y + bias.float()
    from .row_kernels import use_torch_threads, window3_step_rows, window_step_rows  # imports numba, at first call

    use_torch_threads()
    cpu, window = table.device, table.shape[2]
    bias = torch.zeros(tap_rows, device=cpu) if bias is None else bias.detach().float()
    operands = [u_t.detach().float().contiguous().numpy(), *kernel_taps(taps, skip, window), bias.contiguous().numpy()]
    y = torch.empty(num_rows, channels, device=cpu)  # (R, H) float32
    flat, stride = flat_rows(table)
    indices = rows.long().numpy(), new.bool().numpy()
    if window == 3:  # a four-tap convolution's window, written out so that it vectorizes across channels
        window3_step_rows(flat, stride, *indices, *operands, y.numpy())
    else:
        window_step_rows(flat, stride, window, *indices, *operands, y.numpy())
    return y
