"""The block-diagonal input-dependent linear recurrence as a sequential-in-time Triton scan, forward and backward.

Paper: Fan, Chi & Rudnicky, "Advancing Regular Language Reasoning in Linear Recurrent Neural Networks"
(arXiv 2309.07412), Eq. 5: ``x_k = A_k x_{k-1} + v_k`` with ``A_k = blockdiag(A_k^(1), ..., A_k^(h))``, b×b blocks,
``A[..., i, j]`` = row i, column j and ``x_i ← Σ_j A[..., i, j] x_j`` (the convention of
:mod:`ssmhub.ops.block_scan`). :func:`block_scan_triton` has the semantics and the return of
:func:`ssmhub.ops.block_scan.block_scan`; the kernels are in :mod:`ssmhub.ops.triton._block_scan_kernels`.

Why sequential in time, where §3.4 scans in parallel: one program per (batch row, group of heads) walks
the T steps with its state x (b floats per head) in registers, one b×b matvec per step. That is O(T·h·b²)
work with no log factor, and no T×b×b matrix products are ever formed or written: the parallel scan
(:func:`~ssmhub.ops.block_scan.block_scan`, under ``torch.compile`` or not) composes ``A₂A₁`` pairs, O(T·h·b³)
flops, and materialises about T composed b×b matrices per head for autograd. The sequential kernel's
parallelism is batch × h / G programs, which is enough at training batch sizes; whether it is faster on a GPU
has not been measured yet (no GPU was available when it was written: the benchmark is pending).

Backward (reverse time, custom): with ``g_k = ∂L/∂x_k`` counting every later use of x_k,
``g_k = ∂L/∂states_k + A_{k+1}^T g_{k+1}``, ``∂L/∂v_k = g_k``, ``∂L/∂A_k = g_k x_{k-1}^T`` and
``∂L/∂x_0 = A_1^T g_1`` (1-based as in the paper). x_{k-1} is read from the forward's states, which it
returns anyway, so saving them for backward costs nothing extra.

Padding and document restarts need nothing here: the layer writes them into A and v (A = I, v = 0 at a
masked step leaves the state unchanged; A = 0 restarts it, :func:`~ssmhub.ops.block_scan.restart_blocks`).

Where it runs: CUDA tensors, or CPU tensors when ``TRITON_INTERPRET=1`` is set before the kernels are first
imported (that is how the tests check it without a GPU); see :func:`can_run_block_scan`.
"""

from __future__ import annotations

import importlib
import importlib.util

import torch

from ..block_scan import block_scan_dtype, check_block_scan_inputs
from ..precision import float32_math
from . import kernel_support, launch_device

__all__ = ["MAX_BLOCK_SIZE", "block_scan_triton", "can_run_block_scan"]

MAX_BLOCK_SIZE = 32  # a (BP, BP) fp32 tile of A per head per step in registers; not tuned on a GPU
KERNELS_MODULE = "ssmhub.ops.triton._block_scan_kernels"  # by absolute name: a remote-code bundle lacks it


def can_run_block_scan(device: torch.device | str, block_size: int | None = None) -> tuple[bool, str]:
    """Whether :func:`block_scan_triton` can run on ``device`` (with b = ``block_size``); if not, ``"key: why"``."""
    usable, reason = kernel_support(KERNELS_MODULE, device)
    if not usable:
        return usable, reason
    if block_size is not None and not 1 <= block_size <= MAX_BLOCK_SIZE:
        return False, f"block size: b = {block_size} is outside the kernel's 1 … {MAX_BLOCK_SIZE}"
    return True, ""


def _kernels():
    return importlib.import_module(KERNELS_MODULE)


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _launch_shape(batch: int, heads: int, block: int, heads_per_program: int | None) -> tuple[tuple[int, int], dict]:
    """Grid (batch, ⌈h / G⌉) and the constexprs: B = b, BP = b padded to a power of two, G heads per program."""
    padded = _next_power_of_two(block)
    if heads_per_program is None:  # about 128 lanes of A per program (one warp's worth of fp32 pairs); untuned
        heads_per_program = max(1, min(_next_power_of_two(heads), 128 // (padded * padded)))
    if heads_per_program < 1 or heads_per_program & (heads_per_program - 1):
        raise ValueError(f"heads_per_program must be a power of two; got {heads_per_program}")
    grid = (batch, -(-heads // heads_per_program))
    return grid, {"B": block, "BP": padded, "G": heads_per_program}


def _forward(A, v, x0, shape) -> torch.Tensor:
    """states (batch, T, h, b) float32 of the float32 contiguous inputs; x0 (batch or 1, h, b) or None."""
    _, seq_len, heads, block = v.shape
    grid, meta = shape
    states = torch.empty_like(v)
    x0_stride = 0 if x0 is None or x0.shape[0] == 1 else heads * block
    with launch_device(v):
        _kernels().block_scan_fwd_kernel[grid](
            A, v, v if x0 is None else x0, states, seq_len, heads, x0_stride, HAS_X0=x0 is not None, **meta
        )
    return states


def _backward(A, states, x0, grad, need_dA, shape) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """(dA or None, dv, dx0 per row (batch, h, b)) of the scan, by the reverse-time kernel."""
    batch, seq_len, heads, block = states.shape
    grid, meta = shape
    dA = torch.empty_like(A) if need_dA else A  # A: a dummy pointer, never written when NEED_DA is off
    dv = torch.empty_like(states)
    dx0 = states.new_empty(batch, heads, block)
    x0_stride = 0 if x0 is None or x0.shape[0] == 1 else heads * block
    with launch_device(states):
        _kernels().block_scan_bwd_kernel[grid](
            A, states, states if x0 is None else x0, grad, dA, dv, dx0, seq_len, heads, x0_stride,
            HAS_X0=x0 is not None, NEED_DA=need_dA, **meta,
        )  # fmt: skip
    return (dA if need_dA else None), dv, dx0


class _BlockScan(torch.autograd.Function):
    """states = scan(A, v, x0) on float32 contiguous tensors, forward and backward by the Triton kernels."""

    @staticmethod
    def forward(ctx, A, v, x0, shape):
        states = _forward(A, v, x0, shape)
        ctx.save_for_backward(A, states, x0)
        ctx.shape = shape
        return states

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_states):
        A, states, x0 = ctx.saved_tensors
        need_dA, need_dv, need_dx0 = ctx.needs_input_grad[:3]
        dA, dv, dx0 = _backward(A, states, x0, grad_states.float().contiguous(), need_dA, ctx.shape)
        if x0 is not None and x0.shape[0] == 1:
            dx0 = dx0.sum(0, keepdim=True)  # (1, h, b): a shared x_0 collects every row's gradient
        return dA, (dv if need_dv else None), (dx0 if need_dx0 else None), None


@float32_math
def block_scan_triton(
    A: torch.Tensor,
    v: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    *,
    heads_per_program: int | None = None,
) -> torch.Tensor:
    """All states of ``x_k = A_k x_{k-1} + v_k`` (arXiv 2309.07412 Eq. 5) by the sequential Triton scan.

    Args:
        A: (batch, T, h, b, b) per-token blocks, ``A[..., i, j]`` = row i, column j.
        v: (batch, T, h, b) per-token inputs ``B u_k``.
        initial_state: x_0, (batch, h, b) or (1, h, b) broadcast over the batch; None means zeros.
        heads_per_program: G, heads per Triton program (a power of two; None: about 128 lanes of A each).

    Returns:
        states (batch, T, h, b) = x_1..x_T, as :func:`ssmhub.ops.block_scan.block_scan`: float32 for
        half-precision inputs, the inputs' dtype otherwise, but always *computed* in float32 (a float64 input
        gets float32 accuracy). Differentiable in A, v and initial_state. Raises ValueError when the device
        or b cannot run the kernel (:func:`can_run_block_scan` says why).
    """
    check_block_scan_inputs(A, v, initial_state)
    batch, _, heads, block, _ = A.shape
    usable, reason = can_run_block_scan(A.device, block)
    if not usable:
        raise ValueError(f"block_scan_triton cannot run this call: {reason}")
    dtype = block_scan_dtype(A, v, initial_state)
    A32, v32 = A.float().contiguous(), v.float().contiguous()  # (batch, T, h, b, b), (batch, T, h, b)
    x0 = None if initial_state is None else initial_state.float().contiguous()  # (batch or 1, h, b)
    shape = _launch_shape(batch, heads, block, heads_per_program)
    return _BlockScan.apply(A32, v32, x0, shape).to(dtype)
