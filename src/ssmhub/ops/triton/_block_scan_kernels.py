"""Triton kernels of the block-diagonal linear recurrence ``x_k = A_k x_{k-1} + v_k`` (arXiv 2309.07412 Eq. 5),
forward and reverse-time backward (imported only when triton is installed; see :mod:`ssmhub.ops.triton.block_scan`).

Whether these run compiled (CUDA) or interpreted (CPU tensors, numpy) is fixed when this module is imported:
``TRITON_INTERPRET=1`` must be set before its first import.

Layout (all float32, contiguous): A (batch, T, H, b, b) with ``A[..., i, j]`` = row i, column j; v, states and
their gradients (batch, T, H, b); x_0 (batch or 1, H, b), its row stride 0 when it is shared. One program owns
one batch row, a group of G adjacent heads and one chunk of CHUNK consecutive steps (N = ⌈T / CHUNK⌉ chunks a
row; CHUNK ≥ T is the plain sequential scan) and walks its steps in order; its state is a (G, BP) register
tile, BP = b rounded up to a power of two (lanes past b are masked to 0 and never stored). Blocks are at most
a few lanes wide (b ≤ 8 in the paper), below the 16 that ``tl.dot`` needs, so each matvec is a broadcast
multiply over the (G, BP, BP) tile of A_k and a reduction over one axis (and a chunk's b×b product one over a
(G, BP, BP, BP) tile). The chunk carries, (batch, N − 1, H, b) and the products (batch, N − 1, H, b, b), are
contiguous too.

The chunked scan (three launches each way; :mod:`ssmhub.ops.triton.block_scan` drives them):

- forward 1, :func:`block_scan_chunk_fwd_kernel`: every chunk c < N − 1 from a zero state, in parallel: its end
  state e_c and its transition product P_c = A_last ⋯ A_first (b×b).
- forward 2, :func:`block_scan_fwd_kernel` on the N − 1 pairs (P_c, e_c) from x_0: s_c = P_c s_{c−1} + e_c, the
  state after chunk c (Eq. 5 itself, one level up: the chunks compose by the §3.4 operator).
- forward 3, :func:`block_scan_fwd_kernel` on (A, v), every chunk from its carried state s_{c−1} (x_0 for c = 0):
  the states.
- backward 1, :func:`block_scan_chunk_bwd_kernel`: every chunk c ≥ 1 in reverse from a zero carry: l_c, the
  gradient it hands to the state before it (A_first^T g_first).
- backward 2, :func:`block_scan_bwd_kernel` on (P, l shifted by one chunk), no dA: r_c = l_{c+1} + P_{c+1}^T r_{c+1},
  the gradient arriving at the end of chunk c from the chunks after it (P_c^T = A_first^T ⋯ A_last^T).
- backward 3, :func:`block_scan_bwd_kernel` on (A, states), every chunk in reverse from r_c: dv, dA and, from
  chunk 0, dx_0.

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
def _matvec(a, x):
    """x_i <- sum_j A[i, j] x_j for each head: (G, BP, BP), (G, BP) -> (G, BP)."""
    return tl.reduce(a * x[:, None, :], 2, _add)


@triton.jit
def _matvec_t(a, g):
    """c_j = sum_i A[i, j] g_i (A^T g) for each head: (G, BP, BP), (G, BP) -> (G, BP)."""
    return tl.reduce(a * g[:, :, None], 1, _add)


@triton.jit
def _matmul(a, p):
    """(A P)[i, j] = sum_k A[i, k] P[k, j] for each head: (G, BP, BP) twice -> (G, BP, BP), via a (G, BP, BP, BP)
    broadcast (b ≤ 8 is below tl.dot's 16)."""
    return tl.reduce(a[:, :, :, None] * p[:, None, :, :], 2, _add)


@triton.jit
def _n_carries(T, CHUNK):
    """N - 1: the carries a row has, one after each chunk but the last (N = ⌈T / CHUNK⌉; not tl.cdiv, a @jit helper)."""
    return (T + CHUNK - 1) // CHUNK - 1


@triton.jit
def _chunk_steps(T, CHUNK):
    """This program's chunk (program_id 2), its first step (int64) and its number of steps (the last may be short)."""
    chunk = tl.program_id(2)
    start = chunk.to(tl.int64) * CHUNK
    return chunk, start, tl.minimum(T - start, CHUNK)


@triton.jit
def block_scan_fwd_kernel(
    a_ptr, v_ptr, x0_ptr, carry_ptr, out_ptr,
    T, H, x0_row_stride, CHUNK,
    HAS_X0: tl.constexpr, B: tl.constexpr, BP: tl.constexpr, G: tl.constexpr,
):  # fmt: skip
    """states[row, k] = A_k states[row, k-1] + v_k over this program's chunk of steps, from x_0 (or zeros) for chunk 0
    and from carry[row, c-1] (the state after chunk c-1, (batch, N-1, H, b)) for chunk c > 0. CHUNK ≥ T: one
    program walks the whole row (the sequential scan)."""
    row = tl.program_id(0).to(tl.int64)
    chunk, start, steps = _chunk_steps(T, CHUNK)
    vec_off, vec_mask, blk_off, blk_mask = _tiles(H, B, BP, G)
    vec_step = H * B  # elements of one time step of v / states
    blk_step = H * B * B  # elements of one time step of A
    if chunk == 0:
        x = _initial(x0_ptr, x0_row_stride, vec_off, vec_mask, HAS_X0, G, BP)  # (G, BP)
    else:
        carry_t = carry_ptr + (row * _n_carries(T, CHUNK) + chunk - 1) * vec_step
        x = tl.load(carry_t + vec_off, mask=vec_mask, other=0.0)  # (G, BP): s_{c-1}
    first = row * T + start  # int64: the flat (row, step) index of this chunk's first step
    a_t = a_ptr + first * blk_step  # pointers to step t, advanced each step
    v_t = v_ptr + first * vec_step
    out_t = out_ptr + first * vec_step
    for _ in range(0, steps):
        a = tl.load(a_t + blk_off, mask=blk_mask, other=0.0)  # (G, BP, BP)
        v = tl.load(v_t + vec_off, mask=vec_mask, other=0.0)  # (G, BP)
        x = _matvec(a, x) + v  # x_i <- sum_j A[i, j] x_j + v_i
        tl.store(out_t + vec_off, x, mask=vec_mask)
        a_t += blk_step
        v_t += vec_step
        out_t += vec_step


@triton.jit
def block_scan_chunk_fwd_kernel(
    a_ptr, v_ptr, end_ptr, prod_ptr,
    T, H, CHUNK,
    B: tl.constexpr, BP: tl.constexpr, G: tl.constexpr,
):  # fmt: skip
    """Chunk c (every chunk but the last, so CHUNK full steps) from a zero state: its end state e_c = x and its
    transition product P_c = A_last ⋯ A_first, written at [row, c] of end (batch, N-1, H, b) and prod
    (batch, N-1, H, b, b). Then the state after chunk c is P_c s_{c-1} + e_c for any state s_{c-1} before it."""
    row = tl.program_id(0).to(tl.int64)
    chunk, start, _ = _chunk_steps(T, CHUNK)
    vec_off, vec_mask, blk_off, blk_mask = _tiles(H, B, BP, G)
    vec_step = H * B
    blk_step = H * B * B
    lane = tl.arange(0, BP)
    eye = (lane[:, None] == lane[None, :]).to(tl.float32)  # (BP, BP)
    prod = tl.full((G, BP, BP), 0.0, tl.float32) + eye[None, :, :]  # (G, BP, BP): P = I
    x = tl.full((G, BP), 0.0, tl.float32)
    first = row * T + start
    a_t = a_ptr + first * blk_step
    v_t = v_ptr + first * vec_step
    for _ in range(0, CHUNK):
        a = tl.load(a_t + blk_off, mask=blk_mask, other=0.0)  # (G, BP, BP)
        x = _matvec(a, x) + tl.load(v_t + vec_off, mask=vec_mask, other=0.0)
        prod = _matmul(a, prod)  # P <- A_k P
        a_t += blk_step
        v_t += vec_step
    slot = row * _n_carries(T, CHUNK) + chunk  # int64: [row, c] of the (batch, N-1) carries
    tl.store(end_ptr + slot * vec_step + vec_off, x, mask=vec_mask)
    tl.store(prod_ptr + slot * blk_step + blk_off, prod, mask=blk_mask)


@triton.jit
def _adjoint_step(carry, before, a_t, da_t, dout_t, dv_t, vec_off, vec_mask, blk_off, blk_mask, NEED_DA: tl.constexpr):
    """One reverse step at t: g_t = dout_t + carry, dv_t = g_t, dA_t = g_t x_{t-1}^T; returns A_t^T g_t, (G, BP)."""
    g = tl.load(dout_t + vec_off, mask=vec_mask, other=0.0) + carry  # (G, BP)
    tl.store(dv_t + vec_off, g, mask=vec_mask)
    if NEED_DA:
        tl.store(da_t + blk_off, g[:, :, None] * before[:, None, :], mask=blk_mask)  # dA[i, j] = g_i x_{t-1, j}
    a = tl.load(a_t + blk_off, mask=blk_mask, other=0.0)  # (G, BP, BP)
    return _matvec_t(a, g)  # c_j = sum_i A[i, j] g_i


@triton.jit
def block_scan_bwd_kernel(
    a_ptr, states_ptr, x0_ptr, carry_ptr, dout_ptr, da_ptr, dv_ptr, dx0_ptr,
    T, H, x0_row_stride, CHUNK,
    HAS_X0: tl.constexpr, NEED_DA: tl.constexpr, B: tl.constexpr, BP: tl.constexpr, G: tl.constexpr,
):  # fmt: skip
    """The adjoint of the forward over this program's chunk, in reverse time: with g_t = dL/dx_t (total) and
    carry c = A_{t+1}^T g_{t+1},

        g_t = dout_t + c,   dv_t = g_t,   dA_t = g_t x_{t-1}^T,   c <- A_t^T g_t,

    starting from c = 0 in the last chunk and from carry[row, c] (r_c, (batch, N-1, H, b)) in chunk c < N-1.
    After chunk 0's first step the carry is dL/dx_0 = A_0^T g_0 (written per row; a shared x_0 is summed by the
    caller). x_{t-1} is read back from the forward's states; the chunk's first step runs after the loop, with x_0
    (or zeros) in chunk 0.
    """
    row = tl.program_id(0).to(tl.int64)
    chunk, start, steps = _chunk_steps(T, CHUNK)
    vec_off, vec_mask, blk_off, blk_mask = _tiles(H, B, BP, G)
    vec_step = H * B
    blk_step = H * B * B
    n_carries = _n_carries(T, CHUNK)
    carry = tl.full((G, BP), 0.0, tl.float32)  # A_{t+1}^T g_{t+1}; zero past the end
    if chunk < n_carries:
        carry = tl.load(carry_ptr + (row * n_carries + chunk) * vec_step + vec_off, mask=vec_mask, other=0.0)
    last = row * T + start + steps - 1  # int64: the flat (row, step) index of this chunk's last step
    a_t = a_ptr + last * blk_step  # pointers to step t, moved back one step each iteration
    da_t = da_ptr + last * blk_step
    dout_t = dout_ptr + last * vec_step  # dout, dv and states share the (batch, T, H, b) layout
    dv_t = dv_ptr + last * vec_step
    prev_t = states_ptr + (last - 1) * vec_step  # x_{t-1}
    for _ in range(0, steps - 1):  # t = last ... first + 1
        before = carry  # a placeholder (unused) when dA is not wanted
        if NEED_DA:
            before = tl.load(prev_t + vec_off, mask=vec_mask, other=0.0)  # (G, BP)
        carry = _adjoint_step(carry, before, a_t, da_t, dout_t, dv_t, vec_off, vec_mask, blk_off, blk_mask, NEED_DA)
        a_t -= blk_step
        da_t -= blk_step
        dout_t -= vec_step
        dv_t -= vec_step
        prev_t -= vec_step
    if chunk == 0:
        before = _initial(x0_ptr, x0_row_stride, vec_off, vec_mask, HAS_X0, G, BP)  # (G, BP): x_0
    else:
        before = tl.load(prev_t + vec_off, mask=vec_mask, other=0.0)  # the last state of the chunk before
    carry = _adjoint_step(carry, before, a_t, da_t, dout_t, dv_t, vec_off, vec_mask, blk_off, blk_mask, NEED_DA)
    if chunk == 0:
        tl.store(dx0_ptr + row * vec_step + vec_off, carry, mask=vec_mask)


@triton.jit
def block_scan_chunk_bwd_kernel(
    a_ptr, dout_ptr, out_ptr,
    T, H, CHUNK,
    B: tl.constexpr, BP: tl.constexpr, G: tl.constexpr,
):  # fmt: skip
    """Chunk c = program_id(2) + 1 (every chunk but the first) in reverse from a zero carry: g_t = dout_t + c,
    c <- A_t^T g_t; the final carry l_c (what the chunk hands to the state before it) is written at [row, c-1] of
    out (batch, N-1, H, b). The gradient arriving from chunk c is then l_c + P_c^T r_c for any r_c arriving at its
    end."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(2) + 1
    start = chunk.to(tl.int64) * CHUNK
    steps = tl.minimum(T - start, CHUNK)
    vec_off, vec_mask, blk_off, blk_mask = _tiles(H, B, BP, G)
    vec_step = H * B
    blk_step = H * B * B
    last = row * T + start + steps - 1
    a_t = a_ptr + last * blk_step
    dout_t = dout_ptr + last * vec_step
    carry = tl.full((G, BP), 0.0, tl.float32)
    for _ in range(0, steps):
        g = tl.load(dout_t + vec_off, mask=vec_mask, other=0.0) + carry  # (G, BP)
        carry = _matvec_t(tl.load(a_t + blk_off, mask=blk_mask, other=0.0), g)  # A_t^T g_t
        a_t -= blk_step
        dout_t -= vec_step
    slot = row * _n_carries(T, CHUNK) + chunk - 1
    tl.store(out_ptr + slot * vec_step + vec_off, carry, mask=vec_mask)
