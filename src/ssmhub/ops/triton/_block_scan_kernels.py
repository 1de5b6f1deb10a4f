"""Triton kernels of the block-diagonal linear recurrence ``x_k = A_k x_{k-1} + v_k`` (arXiv 2309.07412 Eq. 5),
forward and reverse-time backward (imported only when triton is installed; see :mod:`ssmhub.ops.triton.block_scan`).

Whether these run compiled (CUDA) or interpreted (CPU tensors, numpy) is fixed when this module is imported:
``TRITON_INTERPRET=1`` must be set before its first import.

Layout (all float32, contiguous): A (batch, T, H, b, b) with ``A[..., i, j]`` = row i, column j; v, states and
their gradients (batch, T, H, b); x_0 (batch or 1, H, b), its row stride 0 when it is shared. One program owns
one batch row and a group of G adjacent heads and walks time sequentially; its state is a (G, BP) register
tile, BP = b rounded up to a power of two (lanes past b are masked to 0 and never stored). Blocks are at most
a few lanes wide (b ≤ 8 in the paper), below the 16 that ``tl.dot`` needs, so each matvec is a broadcast
multiply over the (G, BP, BP) tile of A_k and a reduction over one axis.

Reductions use ``tl.reduce`` with this module's own combine function, not ``tl.sum`` (a ``@jit`` helper of
``triton.language``): once something has imported triton in compiled mode (``torch._dynamo`` does on import),
those helpers cannot be called from kernels interpreted on the CPU.
"""

from __future__ import annotations

import triton
import triton.language as tl

INTERPRETED = bool(triton.knobs.runtime.interpret)


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _tiles(H, B: tl.constexpr, BP: tl.constexpr, G: tl.constexpr):
    """Offsets and masks of this program's heads inside one time step: vectors (G, BP), blocks (G, BP, BP)."""
    head = tl.program_id(1) * G + tl.arange(0, G)  # (G,)
    lane = tl.arange(0, BP)  # (BP,)
    vec_mask = (head[:, None] < H) & (lane[None, :] < B)  # (G, BP)
    vec_off = head[:, None] * B + lane[None, :]  # (G, BP): offset in the (H, b) slab of one step
    blk_mask = vec_mask[:, :, None] & (lane[None, None, :] < B)  # (G, BP, BP)
    blk_off = vec_off[:, :, None] * B + lane[None, None, :]  # (G, BP, BP): head·b² + i·b + j
    return vec_off, vec_mask, blk_off, blk_mask


@triton.jit
def _initial(x0_ptr, x0_row_stride, vec_off, vec_mask, HAS_X0: tl.constexpr, G: tl.constexpr, BP: tl.constexpr):
    """x_0 of this program's row and heads, (G, BP); zeros without one."""
    if HAS_X0:
        row = tl.program_id(0).to(tl.int64)
        return tl.load(x0_ptr + row * x0_row_stride + vec_off, mask=vec_mask, other=0.0)
    return tl.full((G, BP), 0.0, tl.float32)


@triton.jit
def block_scan_fwd_kernel(
    a_ptr, v_ptr, x0_ptr, out_ptr,
    T, H, x0_row_stride,
    HAS_X0: tl.constexpr, B: tl.constexpr, BP: tl.constexpr, G: tl.constexpr,
):  # fmt: skip
    """states[row, k] = A_k states[row, k-1] + v_k for k = 0..T-1 (states[row, -1] = x_0), heads of one group."""
    row = tl.program_id(0).to(tl.int64)
    vec_off, vec_mask, blk_off, blk_mask = _tiles(H, B, BP, G)
    x = _initial(x0_ptr, x0_row_stride, vec_off, vec_mask, HAS_X0, G, BP)  # (G, BP)
    vec_step = H * B  # elements of one time step of v / states
    blk_step = H * B * B  # elements of one time step of A
    a_t = a_ptr + row * T * blk_step  # pointers to step t of this row, advanced each step (int64 row offsets)
    v_t = v_ptr + row * T * vec_step
    out_t = out_ptr + row * T * vec_step
    for _ in range(0, T):
        a = tl.load(a_t + blk_off, mask=blk_mask, other=0.0)  # (G, BP, BP)
        v = tl.load(v_t + vec_off, mask=vec_mask, other=0.0)  # (G, BP)
        x = tl.reduce(a * x[:, None, :], 2, _add) + v  # x_i <- sum_j A[i, j] x_j + v_i
        tl.store(out_t + vec_off, x, mask=vec_mask)
        a_t += blk_step
        v_t += vec_step
        out_t += vec_step


@triton.jit
def _adjoint_step(carry, before, a_t, da_t, dout_t, dv_t, vec_off, vec_mask, blk_off, blk_mask, NEED_DA: tl.constexpr):
    """One reverse step at t: g_t = dout_t + carry, dv_t = g_t, dA_t = g_t x_{t-1}^T; returns A_t^T g_t, (G, BP)."""
    g = tl.load(dout_t + vec_off, mask=vec_mask, other=0.0) + carry  # (G, BP)
    tl.store(dv_t + vec_off, g, mask=vec_mask)
    if NEED_DA:
        tl.store(da_t + blk_off, g[:, :, None] * before[:, None, :], mask=blk_mask)  # dA[i, j] = g_i x_{t-1, j}
    a = tl.load(a_t + blk_off, mask=blk_mask, other=0.0)  # (G, BP, BP)
    return tl.reduce(a * g[:, :, None], 1, _add)  # c_j = sum_i A[i, j] g_i


@triton.jit
def block_scan_bwd_kernel(
    a_ptr, states_ptr, x0_ptr, dout_ptr, da_ptr, dv_ptr, dx0_ptr,
    T, H, x0_row_stride,
    HAS_X0: tl.constexpr, NEED_DA: tl.constexpr, B: tl.constexpr, BP: tl.constexpr, G: tl.constexpr,
):  # fmt: skip
    """The adjoint of the forward, in reverse time: with g_t = dL/dx_t (total) and carry c = A_{t+1}^T g_{t+1},

        g_t = dout_t + c,   dv_t = g_t,   dA_t = g_t x_{t-1}^T,   c <- A_t^T g_t,

    and after step 0 the carry is dL/dx_0 = A_0^T g_0 (written per row; a shared x_0 is summed by the caller).
    x_{t-1} is read back from the forward's states for t >= 1; step 0 runs after the loop with x_0 (or zeros).
    """
    row = tl.program_id(0).to(tl.int64)
    vec_off, vec_mask, blk_off, blk_mask = _tiles(H, B, BP, G)
    vec_step = H * B
    blk_step = H * B * B
    last = row * T + T - 1  # int64: the flat (row, step) index of this row's last step
    a_t = a_ptr + last * blk_step  # pointers to step t, moved back one step each iteration
    da_t = da_ptr + last * blk_step
    dout_t = dout_ptr + last * vec_step  # dout, dv and states share the (batch, T, H, b) layout
    dv_t = dv_ptr + last * vec_step
    prev_t = states_ptr + (last - 1) * vec_step  # x_{t-1}
    carry = tl.full((G, BP), 0.0, tl.float32)  # A_{t+1}^T g_{t+1}; zero past the end
    for _ in range(0, T - 1):  # t = T-1 ... 1
        before = carry  # a placeholder (unused) when dA is not wanted
        if NEED_DA:
            before = tl.load(prev_t + vec_off, mask=vec_mask, other=0.0)  # (G, BP)
        carry = _adjoint_step(carry, before, a_t, da_t, dout_t, dv_t, vec_off, vec_mask, blk_off, blk_mask, NEED_DA)
        a_t -= blk_step
        da_t -= blk_step
        dout_t -= vec_step
        dv_t -= vec_step
        prev_t -= vec_step
    x0 = _initial(x0_ptr, x0_row_stride, vec_off, vec_mask, HAS_X0, G, BP)  # (G, BP)
    carry = _adjoint_step(carry, x0, a_t, da_t, dout_t, dv_t, vec_off, vec_mask, blk_off, blk_mask, NEED_DA)  # t = 0
    tl.store(dx0_ptr + row * vec_step + vec_off, carry, mask=vec_mask)
