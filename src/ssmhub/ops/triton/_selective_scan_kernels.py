"""Triton kernels of the selective scan (Mamba-1 S6), forward and backward (imported only when triton is installed).

The math is :mod:`ssmhub.ops.selective_scan`'s (Gu & Dao, arXiv 2312.00752, §3.2 Algorithm 2): per channel e and
state n, ``Ā_t = (1 − r_t)·exp(Δ_t·A)``, ``h_t = Ā_t·h_{t-1} + Δ_t·x_t·B_t``, ``y_t = (C_t·h_t + D·x_t)·silu(z_t)``.
The launch code, shapes and autograd wiring live in :mod:`ssmhub.ops.triton.selective_scan`.

One program owns one batch row and a block of BLOCK_D channels, and walks time sequentially with its state
tile h (BLOCK_D, BLOCK_N) in registers, in float32. All tensors are contiguous float32: x, Δ, z, dy (Bt, T, E);
B, C (Bt, T, N); keep = 1 − r (Bt, T); A (E, N); D (E,); states (Bt, E, N). BLOCK_N is N rounded up to a
power of two; padded states and channels load A = B = C = Δ = 0, so their states stay zero and add nothing.

Whether these run compiled (CUDA) or interpreted (CPU tensors, numpy) is fixed when this module is imported
(``TRITON_INTERPRET=1`` before the first import). As in :mod:`ssmhub.ops.triton._kernels`, only core builtins
of ``triton.language`` are called (``tl.full``, ``tl.reduce``; not the ``@jit`` helpers ``tl.zeros``,
``tl.sum``, ``tl.cdiv``, ``tl.sigmoid``), which stay callable from interpreted kernels after triton was imported
compiled. The per-step loop bodies are written out rather than calling ``@jit`` helpers: the interpreter
re-patches ``triton.language`` on every helper call, which would dominate its run time.
"""

from __future__ import annotations

import triton
import triton.language as tl

INTERPRETED = bool(triton.knobs.runtime.interpret)
LOG2E = tl.constexpr(1.4426950408889634)  # exp(v) = exp2(v·log₂e), as the torch path evaluates Ā
ADD = tl.standard._sum_combine  # tl.reduce(v, axis, ADD) is tl.sum (the interpreter maps it to numpy.sum)


@triton.jit
def _tile(ptr, base, offs_d, offs_n, mask2, state_size):
    """Load the (BLOCK_D, BLOCK_N) tile at ``base`` of a (…, E, N) state (padding reads 0)."""
    return tl.load(ptr + base + offs_d[:, None] * state_size + offs_n[None, :], mask=mask2, other=0.0)


@triton.jit
def _store_tile(ptr, base, value, offs_d, offs_n, mask2, state_size):
    """Store a (BLOCK_D, BLOCK_N) tile at ``base`` of a (…, E, N) state (padding is not written)."""
    tl.store(ptr + base + offs_d[:, None] * state_size + offs_n[None, :], value, mask=mask2)


@triton.jit
def scan_forward_kernel(
    x_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, keep_ptr, h0_ptr,
    y_ptr, starts_ptr, final_ptr,
    seq_len, channels, state_size, chunk, n_chunks,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_RESETS: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """y (Bt, T, E), the state before every chunk ``starts`` (Bt, nC, E, N) and the final state (Bt, E, N).

    Grid (Bt, ⌈E / BLOCK_D⌉). The discretisation, Δ·x·B, the C readout, the D skip and the silu(z) gate are
    fused into the one pass over time; only the states at chunk boundaries leave the chip (Mamba §3.3: the
    backward recomputes the others from them).
    """
    row = tl.program_id(0).to(tl.int64)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mask_d, mask_n = offs_d < channels, offs_n < state_size
    mask2 = mask_d[:, None] & mask_n[None, :]
    A2 = _tile(A_ptr, 0, offs_d, offs_n, mask2, state_size) * LOG2E  # (BLOCK_D, BLOCK_N): A·log₂e
    skip = tl.full((BLOCK_D,), 0.0, tl.float32)
    if HAS_D:
        skip = tl.load(D_ptr + offs_d, mask=mask_d, other=0.0)
    plane = channels * state_size  # one (E, N) state
    h = _tile(h0_ptr, row * plane, offs_d, offs_n, mask2, state_size)
    for c in range(0, n_chunks):
        _store_tile(starts_ptr, (row * n_chunks + c) * plane, h, offs_d, offs_n, mask2, state_size)
        for t in range(c * chunk, tl.minimum(c * chunk + chunk, seq_len)):
            step = row * seq_len + t  # flat (row, t) index, int64
            at, an = step * channels + offs_d, step * state_size + offs_n
            dt = tl.load(delta_ptr + at, mask=mask_d, other=0.0)
            xt = tl.load(x_ptr + at, mask=mask_d, other=0.0)
            bt = tl.load(B_ptr + an, mask=mask_n, other=0.0)
            ct = tl.load(C_ptr + an, mask=mask_n, other=0.0)
            decay = tl.exp2(dt[:, None] * A2)  # Ā = exp(Δ·A) ∈ [0, 1]: never a positive exponent
            if HAS_RESETS:
                decay = decay * tl.load(keep_ptr + step)  # × (1 − r_t): zero at a document start
            h = decay * h + (dt * xt)[:, None] * bt[None, :]  # h_t = Ā_t·h_{t-1} + Δ_t·x_t·B_t
            y = tl.reduce(h * ct[None, :], 1, ADD) + skip * xt  # (BLOCK_D,): C_t·h_t + D·x_t
            if HAS_Z:
                zt = tl.load(z_ptr + at, mask=mask_d, other=0.0)
                y = y * zt / (1.0 + tl.exp(-zt))  # · silu(z) = z·sigmoid(z)
            tl.store(y_ptr + at, y, mask=mask_d)
    _store_tile(final_ptr, row * plane, h, offs_d, offs_n, mask2, state_size)


@triton.jit
def _recompute_chunk(x_ptr, delta_ptr, B_ptr, keep_ptr, scratch_ptr, h, A2, start, length, seq_len, row,
                     channels, state_size, offs_d, mask_d, offs_n, mask_n, slot,
                     HAS_RESETS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """Write h_{s-1}, h_s, …, h_{s+L-1} (the chunk's start state, then the state after each of its L steps)
    into the program's scratch slots 0..L of (BLOCK_D, BLOCK_N) each: the forward's ops, so its values."""
    tl.store(scratch_ptr + slot, h)
    for j in range(0, length):
        step = row * seq_len + start + j
        at = step * channels + offs_d
        dt = tl.load(delta_ptr + at, mask=mask_d, other=0.0)
        xt = tl.load(x_ptr + at, mask=mask_d, other=0.0)
        bt = tl.load(B_ptr + step * state_size + offs_n, mask=mask_n, other=0.0)
        decay = tl.exp2(dt[:, None] * A2)
        if HAS_RESETS:
            decay = decay * tl.load(keep_ptr + step)
        h = decay * h + (dt * xt)[:, None] * bt[None, :]
        tl.store(scratch_ptr + (j + 1) * (BLOCK_D * BLOCK_N) + slot, h)


@triton.jit
def scan_backward_kernel(
    x_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, keep_ptr, starts_ptr, dy_ptr, dfinal_ptr, scratch_ptr,
    dx_ptr, ddelta_ptr, dz_ptr, dB_ptr, dC_ptr, dA_ptr, dD_ptr, dh0_ptr,
    batch, seq_len, channels, state_size, chunk, n_chunks,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_RESETS: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """The adjoint recurrence ``g_t = dp_t·C_t + Ā_{t+1}·g_{t+1}`` (g = dL/dh_t, from g_{T-1} = dfinal + dp·C),
    chunk by chunk from the end, each chunk's states recomputed from its saved start (Mamba §3.3).

    Grid (Bt, ⌈E / BLOCK_D⌉), as the forward. Through the gate ``y = p·silu(z)``, ``p = C·h + D·x``:
    dz = dy·p·σ·(1 + z·(1 − σ)), dp = dy·silu(z). With ``w_t = g_t·Ā_t·h_{t-1}`` (the gradient reaching
    Δ_t·A) and ``gB_t = Σ_n g_t·B_t``: dx_t = Δ_t·gB_t + D·dp_t, dΔ_t = Σ_n w_t·A + x_t·gB_t,
    dA = Σ_t w_t·Δ_t, dD = Σ_t dp_t·x_t, dB_t = Σ_e g_t·Δ_t·x_t, dC_t = Σ_e dp_t·h_t, dh0 = Ā_0·g_0.
    dB and dC are written as partial sums over this program's channels, (nE, Bt, T, N); dA (Bt, E, N) and
    dD (Bt, E) per batch row; the caller adds the partials up. scratch: (Bt, nE, chunk + 1, BLOCK_D, BLOCK_N).
    """
    row = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1).to(tl.int64)
    offs_d = block * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mask_d, mask_n = offs_d < channels, offs_n < state_size
    mask2 = mask_d[:, None] & mask_n[None, :]
    slot = tl.arange(0, BLOCK_D)[:, None] * BLOCK_N + offs_n[None, :]  # (BLOCK_D, BLOCK_N) in one scratch slot
    A = _tile(A_ptr, 0, offs_d, offs_n, mask2, state_size)  # (BLOCK_D, BLOCK_N)
    A2 = A * LOG2E
    skip = tl.full((BLOCK_D,), 0.0, tl.float32)
    if HAS_D:
        skip = tl.load(D_ptr + offs_d, mask=mask_d, other=0.0)
    scratch_ptr += (row * tl.num_programs(1) + block) * (chunk + 1) * (BLOCK_D * BLOCK_N)  # this program's
    plane = channels * state_size
    g = _tile(dfinal_ptr, row * plane, offs_d, offs_n, mask2, state_size)  # dL/dh_{T-1} from later uses
    gA = tl.full((BLOCK_D, BLOCK_N), 0.0, tl.float32)
    gD = tl.full((BLOCK_D,), 0.0, tl.float32)
    for k in range(0, n_chunks):
        c = n_chunks - 1 - k
        start = c * chunk
        length = tl.minimum(chunk, seq_len - start)
        h = _tile(starts_ptr, (row * n_chunks + c) * plane, offs_d, offs_n, mask2, state_size)
        _recompute_chunk(x_ptr, delta_ptr, B_ptr, keep_ptr, scratch_ptr, h, A2, start, length, seq_len, row,
                         channels, state_size, offs_d, mask_d, offs_n, mask_n, slot,
                         HAS_RESETS, BLOCK_D, BLOCK_N)  # fmt: skip
        tl.debug_barrier()  # the scratch states are read back below
        for i in range(0, length):
            j = length - 1 - i
            step = row * seq_len + start + j
            at, an = step * channels + offs_d, step * state_size + offs_n
            dt = tl.load(delta_ptr + at, mask=mask_d, other=0.0)
            xt = tl.load(x_ptr + at, mask=mask_d, other=0.0)
            bt = tl.load(B_ptr + an, mask=mask_n, other=0.0)
            ct = tl.load(C_ptr + an, mask=mask_n, other=0.0)
            h_prev = tl.load(scratch_ptr + j * (BLOCK_D * BLOCK_N) + slot)  # h_{t-1}
            h = tl.load(scratch_ptr + (j + 1) * (BLOCK_D * BLOCK_N) + slot)  # h_t
            dp = tl.load(dy_ptr + at, mask=mask_d, other=0.0)  # dL/dy_t, made dL/dp_t below
            if HAS_Z:
                zt = tl.load(z_ptr + at, mask=mask_d, other=0.0)
                sig = 1.0 / (1.0 + tl.exp(-zt))
                p = tl.reduce(h * ct[None, :], 1, ADD) + skip * xt  # C_t·h_t + D·x_t, recomputed
                tl.store(dz_ptr + at, dp * p * sig * (1.0 + zt * (1.0 - sig)), mask=mask_d)
                dp = dp * zt * sig
            gD += dp * xt
            partial = block * batch * seq_len * state_size + an  # (nE, Bt, T, N): this block's partial sums
            tl.store(dC_ptr + partial, tl.reduce(dp[:, None] * h, 0, ADD), mask=mask_n)
            g += dp[:, None] * ct[None, :]  # g_t = dp_t·C_t + Ā_{t+1}·g_{t+1}
            decay = tl.exp2(dt[:, None] * A2)
            if HAS_RESETS:
                decay = decay * tl.load(keep_ptr + step)  # a reset passes nothing to h_{t-1}, Δ·A or A
            gB = tl.reduce(g * bt[None, :], 1, ADD)  # (BLOCK_D,)
            tl.store(dx_ptr + at, dt * gB + skip * dp, mask=mask_d)
            w = g * decay * h_prev  # (BLOCK_D, BLOCK_N): dL/d(Δ_t·A)
            tl.store(ddelta_ptr + at, tl.reduce(w * A, 1, ADD) + xt * gB, mask=mask_d)
            gA += w * dt[:, None]
            tl.store(dB_ptr + partial, tl.reduce(g * (dt * xt)[:, None], 0, ADD), mask=mask_n)
            g = decay * g  # dL/dh_{t-1} through step t
        tl.debug_barrier()  # the next chunk overwrites the scratch
    _store_tile(dh0_ptr, row * plane, g, offs_d, offs_n, mask2, state_size)
    _store_tile(dA_ptr, row * plane, gA, offs_d, offs_n, mask2, state_size)
    if HAS_D:
        tl.store(dD_ptr + row * channels + offs_d, gD, mask=mask_d)
