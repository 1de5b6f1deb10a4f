"""Mamba's selective scan (S6): the chunked fast path with its own backward, the loop oracle and the O(1) step.

Papers: Gu & Dao, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces" (arXiv 2312.00752,
§3.2 Algorithm 2 and §3.3); Rando et al., "SeRpEnt" (arXiv 2501.11729), Eq. 2 (discrete SSM) and Eq. 8
(selectivity: B, C and Δ are functions of the input). Notation follows transformers'
``mamba_selective_scan`` slow path, which this module reproduces exactly: per channel ``e < E`` and state
``n < N``,

- discretisation (Mamba's Euler/ZOH hybrid, not SeRpEnt Eq. 3's full ZOH for B):
  ``Ā_t[e,n] = exp(Δ_t[e]·A[e,n])``,  ``B̄_t[e,n] = Δ_t[e]·B_t[n]``
- recurrence (SeRpEnt Eq. 2):  ``h_t[e,n] = Ā_t[e,n]·h_{t-1}[e,n] + B̄_t[e,n]·x_t[e]``
- readout:  ``y_t[e] = Σ_n C_t[n]·h_t[e,n] + D[e]·x_t[e]``,  then ``y_t ← y_t·silu(z_t[e])`` if a gate z is given.

Layouts are batch-first with time in dim 1: x, Δ, z (Bt, T, E); B, C (Bt, T, N) (shared by all E channels,
as in Mamba-1); A (E, N) real with A ≤ 0 (``A = -exp(A_log)``); D (E,); states (Bt, E, N). Δ arrives already
positive (the caller applies softplus and the bias); Δ_t[e] = 0 makes position t leave channel e's state
unchanged and add nothing (``Ā = 1``, ``B̄ = 0``), which is how padding is expressed.

Numerics. Every function computes with autocast off, in float32 (float64 if an input is float64), so the
decay ``exp(Δ·A) ∈ [0, 1]`` is never rounded to 1 in half precision. :func:`selective_scan` evaluates the
same per-step products as the loop (``exp(Δ_t·A)`` of a non-positive number, computed as ``exp2(Δ_t·A·log₂e)``,
then ``Ā·h + B̄·x``) and never
the ``exp(-cumsum(Δ·A))`` factorisation of ``Π_{s<r≤t} Ā_r``, whose ``exp(-S)`` factor overflows once the
log-decay inside a chunk passes ≈ −88 in float32 (≈ −176 with re-centring, ≈ −709 even with a float64
exponent). No exponent here is ever positive, so any Δ ≥ 0 with A ≤ 0 is safe: a decay that underflows to 0
is exactly the value the loop computes too, and Δ = 0 runs are exact (``Ā = 1``, ``B̄x = 0``). The decode step
(:func:`selective_step`) floors the decay at the dtype's smallest normal number (its exponent clamped at
:func:`decay_exponent_floor`): an exp whose result is subnormal runs an order of magnitude slower on a CPU, and
SeRpEnt's branch Mambas step every row, emitting or not; the state moves by at most that number times itself.
See :func:`selective_scan` for the algorithm and why it beats time-parallel forms on CPU.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .precision import float32_math

__all__ = ["decay_exponent_floor", "selective_scan", "selective_scan_ref", "selective_step"]

DEFAULT_CHUNK_SIZE = 16  # time steps per chunk; chosen from benchmarks/results/selective_scan.md (chunk sweep)


def _compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float64 if any input is float64, else float32 (half precision and integers are raised to float32)."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def _check_inputs(
    x: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    initial_state: torch.Tensor | None,
    resets: torch.Tensor | None = None,
) -> tuple[int, int, int, int]:
    """Raise ValueError unless every argument has the documented shape; return (Bt, T, E, N)."""
    if x.dim() != 3:
        raise ValueError(f"x must have shape (Bt, T, E); got {tuple(x.shape)}")
    batch, seq_len, channels = x.shape
    if seq_len < 1:
        raise ValueError(f"x must have at least one time step (T ≥ 1 along dim 1); got T = {seq_len}")
    if tuple(delta.shape) != (batch, seq_len, channels):
        raise ValueError(
            f"delta must have shape (Bt, T, E) = {(batch, seq_len, channels)} like x; got {tuple(delta.shape)}"
        )
    if A.dim() != 2 or A.shape[0] != channels:
        raise ValueError(f"A must have shape (E, N) with E = {channels}; got {tuple(A.shape)}")
    state_size = A.shape[1]
    for name, t in (("B", B), ("C", C)):
        if tuple(t.shape) != (batch, seq_len, state_size):
            raise ValueError(
                f"{name} must have shape (Bt, T, N) = {(batch, seq_len, state_size)}; got {tuple(t.shape)}"
            )
    if D is not None and tuple(D.shape) != (channels,):
        raise ValueError(f"D must have shape (E,) = {(channels,)}; got {tuple(D.shape)}")
    if z is not None and tuple(z.shape) != (batch, seq_len, channels):
        raise ValueError(f"z must have shape (Bt, T, E) = {(batch, seq_len, channels)} like x; got {tuple(z.shape)}")
    if initial_state is not None and tuple(initial_state.shape) != (batch, channels, state_size):
        raise ValueError(
            f"initial_state must have shape (Bt, E, N) = {(batch, channels, state_size)}; "
            f"got {tuple(initial_state.shape)}"
        )
    if resets is not None and (resets.dtype != torch.bool or tuple(resets.shape) != (batch, seq_len)):
        raise ValueError(
            f"resets must be a bool tensor of shape (Bt, T) = {(batch, seq_len)}; got {resets.dtype} "
            f"{tuple(resets.shape)}"
        )
    return batch, seq_len, channels, state_size


def _keep_factor(resets: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """(Bt, T) bool resets -> (Bt, T) ``1 − r_t`` in dtype, the factor on Ā_t that restarts the state (None: none)."""
    return None if resets is None else (~resets).to(dtype)


def _skip_and_gate(
    y: torch.Tensor, x: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """``(y + D·x)·silu(z)`` in ``dtype``; D and z optional. y, x, z: (Bt, T, E) or (Bt, E); D: (E,)."""
    if D is not None:
        y = y + D.to(dtype) * x
    if z is not None:
        y = y * F.silu(z.to(dtype))
    return y


@float32_math
def selective_scan_ref(
    x: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
    resets: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reference for :func:`selective_scan`: the recurrence one time step at a time (the oracle).

    Same arguments, shapes and return values as :func:`selective_scan` (no ``chunk_size``). Each step is
    ``h = exp(Δ_t·A)·h + (Δ_t·x_t)·B_t``, ``y_t = h·C_t`` (Mamba Algorithm 2 / SeRpEnt Eq. 2), then the
    D skip and the silu(z) gate; where ``resets[:, t]`` the state first restarts from zero (``h ← 0``, a
    document start in a packed row). Autograd differentiates the loop. O(T) Python steps: use it for checks.
    """
    batch, seq_len, channels, state_size = _check_inputs(x, delta, A, B, C, D, z, initial_state, resets)
    dtype = _compute_dtype(x, delta, A, B, C, D, z, initial_state)
    xc, dc, Ac = x.to(dtype), delta.to(dtype), A.to(dtype)
    h = xc.new_zeros(batch, channels, state_size) if initial_state is None else initial_state.to(dtype)
    du = dc * xc  # (Bt, T, E): Δ_t·x_t
    restart = torch.zeros(batch, seq_len, dtype=torch.bool, device=x.device) if resets is None else resets
    ys = []
    # unbind, not x[:, t]: the backward of T slices would write T full-size zero tensors (O(T²) traffic)
    steps = zip(dc.unbind(1), du.unbind(1), B.to(dtype).unbind(1), C.to(dtype).unbind(1), restart.unbind(1))
    for d_t, du_t, b_t, c_t, r_t in steps:
        h = torch.where(r_t[:, None, None], 0.0, h)  # a document start: the state restarts from zero
        h = torch.exp(d_t.unsqueeze(-1) * Ac) * h + du_t.unsqueeze(-1) * b_t.unsqueeze(1)  # (Bt, E, N)
        ys.append(torch.matmul(h, c_t.unsqueeze(-1)).squeeze(-1))  # (Bt, E)
    y = _skip_and_gate(torch.stack(ys, dim=1), xc, D, z, dtype)  # (Bt, T, E)
    y = y.to(x.dtype)
    return y, (h if return_final_state else None)


@float32_math
def selective_step(
    x_t: torch.Tensor,
    delta_t: torch.Tensor,
    A: torch.Tensor,
    B_t: torch.Tensor,
    C_t: torch.Tensor,
    D: torch.Tensor | None = None,
    z_t: torch.Tensor | None = None,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One time step of the selective SSM (recurrent decoding), O(E·N) whatever t is.

    Args:
        x_t, delta_t: (Bt, E) input and positive step size Δ_t (softplus already applied). Rows may have more
            than one leading dim, (R, Bt, E) for R mixers stepped at once; written (Bt,) below.
        A: (E, N), A ≤ 0, or one per mixer: (R, 1, E, N), broadcasting against (Bt, E, N).
        B_t, C_t: (Bt, N).  D: (E,), or broadcasting against (Bt, E), or None.  z_t: (Bt, E) gate or None.
        state: h_{t-1} (Bt, E, N); None means zeros.

    Returns:
        ``(y_t, new_state)``: y_t (Bt, E) in x_t's dtype and h_t (Bt, E, N) in the compute dtype (float32,
        float64 for float64 inputs), exactly one step of :func:`selective_scan_ref`:
        ``h_t = exp(Δ_t·A)·h_{t-1} + Δ_t·B_t·x_t``, ``y_t = (C_t·h_t + D·x_t)·silu(z_t)``.
    """
    if x_t.dim() < 2:
        raise ValueError(f"x_t must have shape (Bt, E); got {tuple(x_t.shape)}")
    *rows, channels = x_t.shape
    rows = tuple(rows)
    if tuple(delta_t.shape) != (*rows, channels):
        raise ValueError(f"delta_t must have shape (Bt, E) = {(*rows, channels)} like x_t; got {tuple(delta_t.shape)}")
    state_size = A.shape[-1] if A.dim() >= 2 else 0
    if not _broadcasts(A, (*rows, channels, state_size)) or A.shape[-2] != channels:
        raise ValueError(
            f"A must have shape (E, N) with E = {channels}, or broadcast against (Bt, E, N); got {tuple(A.shape)}"
        )
    for name, t in (("B_t", B_t), ("C_t", C_t)):
        if tuple(t.shape) != (*rows, state_size):
            raise ValueError(f"{name} must have shape (Bt, N) = {(*rows, state_size)}; got {tuple(t.shape)}")
    if D is not None and not _broadcasts(D, (*rows, channels)):
        raise ValueError(f"D must have shape (E,) = {(channels,)} or broadcast against (Bt, E); got {tuple(D.shape)}")
    if z_t is not None and tuple(z_t.shape) != (*rows, channels):
        raise ValueError(f"z_t must have shape (Bt, E) = {(*rows, channels)} like x_t; got {tuple(z_t.shape)}")
    if state is not None and tuple(state.shape) != (*rows, channels, state_size):
        raise ValueError(
            f"state must have shape (Bt, E, N) = {(*rows, channels, state_size)}; got {tuple(state.shape)}"
        )
    dtype = _compute_dtype(x_t, delta_t, A, B_t, C_t, D, z_t, state)
    xc, dc = x_t.to(dtype), delta_t.to(dtype)
    h = xc.new_zeros(*rows, channels, state_size) if state is None else state.to(dtype)
    decay = torch.exp((dc.unsqueeze(-1) * A.to(dtype)).clamp_min(decay_exponent_floor(dtype)))  # (Bt, E, N)
    h = decay * h + (dc * xc).unsqueeze(-1) * B_t.to(dtype).unsqueeze(-2)  # (Bt, E, N)
    y = torch.matmul(h, C_t.to(dtype).unsqueeze(-1)).squeeze(-1)  # (Bt, E)
    return _skip_and_gate(y, xc, D, z_t, dtype).to(x_t.dtype), h


def decay_exponent_floor(dtype: torch.dtype) -> float:
    """The least Δ·A a decode step exponentiates: just above log of ``dtype``'s smallest normal number, so that
    exp(Δ·A) is never subnormal (what :mod:`ssmhub.ops.selective_rows` clamps at in float32, too)."""
    return math.log(torch.finfo(dtype).tiny) + 0.05


def _broadcasts(t: torch.Tensor, shape: tuple[int, ...]) -> bool:
    """Whether ``t`` broadcasts against ``shape`` to exactly ``shape``."""
    return t.dim() <= len(shape) and all(a in (1, b) for a, b in zip(reversed(t.shape), reversed(shape)))


class _Workspace:
    """Chunk buffers reused by every chunk (they stay in cache and cost no page faults), with per-step views.

    States are held as (Bt, N, E), E innermost, so that sums over n reduce a non-inner dim and ``C_t·h_t``
    is a (1, N)·(N, E) matmul; on CPU both are several times faster than with N innermost.
    h: (C+1, Bt, N, E), h[0] the state before the chunk and h[j+1] the state after its step j;
    a, u (and g in the backward): (C, Bt, N, E). The ``*_steps`` tuples hold the (Bt, N, E) view of
    every step, made once so that the stepped loops do no indexing.
    """

    def __init__(self, x: torch.Tensor, chunk: int, state_size: int, adjoint: bool = False):
        batch, _, channels = x.shape
        self.h = x.new_empty(chunk + 1, batch, state_size, channels)  # (C+1, Bt, N, E)
        self.a = x.new_empty(chunk, batch, state_size, channels)  # (C, Bt, N, E): Ā = exp(Δ·A)
        self.u = torch.empty_like(self.a)  # (C, Bt, N, E): B̄x = Δ·x·B, then scratch
        self.g = torch.empty_like(self.a) if adjoint else None  # (C, Bt, N, E): adjoints dL/dh_t
        self.h_steps, self.a_steps, self.u_steps = self.h.unbind(0), self.a.unbind(0), self.u.unbind(0)
        self.g_steps = self.g.unbind(0) if adjoint else ()

    def states(self, length: int, d_c, du_c, A2_t, b_c, keep_c=None):
        """Fill h[1..L] from h[0]: ``h[j+1] = Ā_j·h[j] + B̄_j x_j`` for the chunk's L steps.

        d_c, du_c: (L, Bt, E) Δ and Δ·x; A2_t: (N, E) = Aᵀ·log₂e; b_c: (L, Bt, N); keep_c: (L, Bt) ``1 − r_t``
        or None: a reset multiplies Ā by 0 (the state restarts from zero), and the backward, which reads the
        same Ā, then passes no gradient through it to the earlier state, Δ·A or A. The discretisation is
        two vectorised passes over the chunk; only the multiply-add is stepped (one fused addcmul per step).
        ``Ā = exp(Δ·A)`` is evaluated as ``exp2(Δ·A·log₂e)``: the same value to a few float32 ulps, and
        PyTorch's CPU exp2 is faster than its exp (benchmarks/results/selective_scan.md, "Kernel choices").
        """
        a, u = self.a[:length], self.u[:length]  # (L, Bt, N, E) each
        torch.mul(d_c.unsqueeze(2), A2_t, out=a).exp2_()  # Ā = exp(Δ·A) ∈ [0, 1]: never a positive exponent
        if keep_c is not None:
            a.mul_(keep_c[:, :, None, None])  # Ā_t·(1 − r_t): zero at a document start
        torch.mul(du_c.unsqueeze(2), b_c.unsqueeze(-1), out=u)  # B̄x = (Δ·x)·B
        h, a_s, u_s = self.h_steps, self.a_steps, self.u_steps
        for j in range(length):
            torch.addcmul(u_s[j], a_s[j], h[j], out=h[j + 1])  # (Bt, N, E)

    def readout(self, length: int, c_c: torch.Tensor, x_c: torch.Tensor, D: torch.Tensor | None) -> torch.Tensor:
        """``C_t·h_t + D·x_t`` for the chunk's states h[1..L]: c_c (L, Bt, N), x_c (L, Bt, E) -> (L, Bt, E)."""
        y_c = torch.matmul(c_c.unsqueeze(2), self.h[1 : length + 1]).squeeze(2)  # (L, Bt, E): Σ_n C_t[n]·h_t[n, e]
        return y_c if D is None else y_c.addcmul_(x_c, D)


def _log2_decay_rates(A: torch.Tensor) -> torch.Tensor:
    """(E, N) A -> (N, E) ``Aᵀ·log₂e``, so that ``exp(Δ·A) = exp2(Δ·Aᵀ·log₂e)``."""
    return (A.t() * math.log2(math.e)).contiguous()


def _time_major(t: torch.Tensor, s: int, e: int) -> torch.Tensor:
    """Steps s..e-1 of a (Bt, T, ·) tensor as a (L, Bt, ·) view (no copy)."""
    return t[:, s:e].transpose(0, 1)


class _SelectiveScanFn(torch.autograd.Function):
    """``y_t = (Σ_n C_t[n]·h_t + D·x_t)·silu(z_t)`` and the final state of ``h_t = exp(Δ_t·A)·h_{t-1} + Δ_t·x_t·B_t``.

    Inputs as in :func:`selective_scan`, already in the compute dtype: x, delta (Bt, T, E); A (E, N);
    B, C (Bt, T, N); D (E,) or None; z (Bt, T, E) or None; h0 (Bt, E, N). Returns y (Bt, T, E) and the
    final state (Bt, E, N). The skip and the gate are applied chunk by chunk while the chunk is in cache,
    so no (Bt, T, E) temporary is made for them. Saves only the inputs and the state before each chunk,
    (nC, Bt, N, E); the backward recomputes each chunk's states from it (same ops, so bit-identical) and
    runs the adjoint recurrence backwards.
    """

    @staticmethod
    def forward(ctx, x, delta, A, B, C, D, z, h0, keep, chunk_size, save_starts):
        batch, seq_len, channels = x.shape
        state_size = A.shape[1]
        chunk = min(chunk_size, seq_len)
        n_chunks = -(-seq_len // chunk)
        A2_t = _log2_decay_rates(A)  # (N, E)
        du = delta * x  # (Bt, T, E): Δ·x
        y = x.new_empty(batch, seq_len, channels)  # (Bt, T, E)
        starts = x.new_empty(n_chunks if save_starts else 0, batch, state_size, channels)  # (nC, Bt, N, E)
        ws = _Workspace(x, chunk, state_size)
        ws.h[0] = h0.transpose(1, 2)  # (Bt, N, E)
        for k, s in enumerate(range(0, seq_len, chunk)):
            e = min(s + chunk, seq_len)
            length = e - s
            if save_starts:
                starts[k] = ws.h[0]
            keep_c = None if keep is None else keep[:, s:e].t()  # (L, Bt)
            ws.states(length, _time_major(delta, s, e), _time_major(du, s, e), A2_t, _time_major(B, s, e), keep_c)
            y_c = ws.readout(length, _time_major(C, s, e), _time_major(x, s, e), D)  # (L, Bt, E)
            if z is not None:
                y_c.mul_(F.silu(_time_major(z, s, e)))
            _time_major(y, s, e).copy_(y_c)
            ws.h[0] = ws.h[length]
        final = ws.h[0].transpose(1, 2).contiguous()  # (Bt, E, N)
        if save_starts:
            ctx.save_for_backward(x, delta, A, B, C, D, z, keep, starts)
            ctx.chunk = chunk
        return y, final

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out, g_final):
        """Gate and skip per chunk, then the adjoint recurrence ``g_t = gy_t·C_t + Ā_{t+1}·g_{t+1}``
        (g = dL/dh_t, gy = dL/d(C·h)), chunk by chunk from the end.

        Gate: with ``p = C·h + D·x`` and σ = sigmoid(z), dp = dy·silu(z), dz = dy·p·σ·(1 + z·(1 − σ)),
        dD = Σ dp·x, and dp also reaches x through D. With ``w_t = g_t·Ā_t·h_{t-1}`` (the gradient
        reaching Δ_t·A): dΔ_t = Σ_n w·A + x_t·Σ_n g·B_t, dx_t = Δ_t·Σ_n g·B_t (+ D·dp_t),
        dB_t = Σ_e g·Δ_t·x_t, dC_t = Σ_e gy_t·h_t, dA = Σ_{t,b} w·Δ_t, dh0 = Ā_0·g_0.
        """
        x, delta, A, B, C, D, z, keep, starts = ctx.saved_tensors
        chunk = ctx.chunk
        seq_len, state_size = x.shape[1], A.shape[1]
        A_t = A.t().contiguous()  # (N, E)
        A2_t = _log2_decay_rates(A)  # (N, E)
        du = delta * x  # (Bt, T, E)
        gx, gdelta = torch.empty_like(x), torch.empty_like(delta)  # (Bt, T, E)
        gB, gC = torch.empty_like(B), torch.empty_like(C)  # (Bt, T, N)
        gz = torch.empty_like(z) if z is not None else None  # (Bt, T, E)
        gD = torch.zeros_like(D) if D is not None else None  # (E,)
        gA_t = torch.zeros_like(A_t)  # (N, E)
        ws = _Workspace(x, chunk, state_size, adjoint=True)
        carry = g_final.transpose(1, 2).contiguous()  # (Bt, N, E): dL/dh at the chunk's last step from later
        for k in reversed(range(starts.shape[0])):
            s = k * chunk
            e = min(s + chunk, seq_len)
            length = e - s
            d_c, du_c, x_c = _time_major(delta, s, e), _time_major(du, s, e), _time_major(x, s, e)  # (L, Bt, E)
            b_c, c_c = _time_major(B, s, e), _time_major(C, s, e)  # (L, Bt, N)
            ws.h[0] = starts[k]
            ws.states(length, d_c, du_c, A2_t, b_c, None if keep is None else keep[:, s:e].t())
            gy_c = _time_major(grad_out, s, e)  # (L, Bt, E): dL/dy
            if z is not None:  # through the gate: gy_c becomes dL/dp
                z_c = _time_major(z, s, e)
                sig = torch.sigmoid(z_c)  # (L, Bt, E)
                p = ws.readout(length, c_c, x_c, D)  # (L, Bt, E): C·h + D·x, recomputed
                dsilu = (1 - sig).mul_(z_c).add_(1).mul_(sig)  # silu'(z) = σ·(1 + z·(1 − σ))
                _time_major(gz, s, e).copy_(p.mul_(gy_c).mul_(dsilu))
                gy_c = sig.mul_(z_c).mul_(gy_c)  # dL/dp = dL/dy·silu(z)
            if D is not None:
                gD += (gy_c * x_c).sum((0, 1))
            a, u, g = ws.a[:length], ws.u[:length], ws.g[:length]  # (L, Bt, N, E) each
            h_prev, h = ws.h[:length], ws.h[1 : length + 1]  # (L, Bt, N, E) each: h_{t-1}, h_t
            torch.mul(gy_c.unsqueeze(2), c_c.unsqueeze(-1), out=g)  # direct dL/dh_t = gy_t[e]·C_t[n]
            g_s, a_s = ws.g_steps, ws.a_steps
            g_s[length - 1].add_(carry)
            for j in range(length - 2, -1, -1):
                g_s[j].addcmul_(a_s[j + 1], g_s[j + 1])  # g_j += Ā_{j+1}·g_{j+1}
            torch.mul(a_s[0], g_s[0], out=carry)  # dL/dh_{s-1}
            _time_major(gC, s, e).copy_(torch.mul(h, gy_c.unsqueeze(2), out=u).sum(-1))  # (L, Bt, N): Σ_e gy·h
            _time_major(gB, s, e).copy_(torch.mul(g, du_c.unsqueeze(2), out=u).sum(-1))  # (L, Bt, N): Σ_e g·Δx
            g_b = torch.matmul(b_c.unsqueeze(2), g).squeeze(2)  # (L, Bt, E): Σ_n B_t[n]·g_t[n, e]
            gx_c = g_b * d_c  # (L, Bt, E); not out= into the time-major view: torch.compile refuses strided out=
            if D is not None:
                gx_c.addcmul_(gy_c, D)
            _time_major(gx, s, e).copy_(gx_c)
            w = torch.mul(g, a, out=u).mul_(h_prev)  # (L, Bt, N, E): g·Ā·h_{t-1} = dL/d(Δ·A)
            g_d = torch.mul(w, A_t, out=a).sum(2).addcmul_(g_b, x_c)  # (L, Bt, E): Σ_n w·A + x·Σ_n g·B
            _time_major(gdelta, s, e).copy_(g_d)
            gA_t += w.mul_(d_c.unsqueeze(2)).sum((0, 1))  # (N, E): Σ w·Δ
        return gx, gdelta, gA_t.t(), gB, gC, gD, gz, carry.transpose(1, 2), None, None, None


@float32_math
def selective_scan(
    x: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    resets: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Selective scan (Mamba §3.2 Algorithm 2, SeRpEnt Eqs. 2 and 8), fast and memory-lean, with gradients.

    Args:
        x: (Bt, T, E) input.  delta: (Bt, T, E) step size Δ ≥ 0, softplus already applied (0 = skip).
        A: (E, N), real, A ≤ 0.  B, C: (Bt, T, N) input-dependent, shared by the E channels.
        D: (E,) skip weight or None.  z: (Bt, T, E) gate or None (``y ← y·silu(z)``).
        initial_state: (Bt, E, N) state before t = 0; None means zeros.
        return_final_state: also return h_{T-1}, so a sequence scanned in two pieces (the second from
            the first's final state) equals the sequence scanned whole.
        chunk_size: time steps per chunk (any T works; the last chunk may be shorter).
        resets: (Bt, T) bool or None: where True, the state restarts from zero before step t, as at a
            sequence start (a document start in a packed row): ``h_t = (1 − r_t)·Ā_t·h_{t-1} + B̄_t x_t``.
            A reset at t = 0 discards ``initial_state``. Same cost as without.

    Returns:
        ``(y, final_state)`` (the uniform signature of ssmhub's recurrence ops): y (Bt, T, E) in x's dtype;
        final_state (Bt, E, N) in the compute dtype (float32, or float64 when an input is float64) with
        ``return_final_state``, else None. Autocast is off inside.

    Algorithm (a custom autograd Function; same values as :func:`selective_scan_ref` up to rounding order).
    The sequence is cut into chunks of ``chunk_size`` steps; the state is carried from chunk to chunk.
    Within a chunk the discretisation ``Ā = exp(Δ·A)`` (as ``exp2``, see :class:`_Workspace`) and
    ``B̄x = Δ·x·B`` is one vectorised pass each over (C, Bt, N, E) (states are held N-major inside, so the
    readout ``y = C·h`` is one batched (1, N)·(N, E) matmul), and only the multiply-add
    ``h_t = Ā_t·h_{t-1} + B̄_t x_t`` is stepped, as a single fused ``addcmul`` per step on (Bt, N, E) writing
    into a chunk buffer that is reused (it stays in cache). The D skip and the gate are applied to the
    chunk's readout while it is in cache. The forward saves just the inputs and the state before each
    chunk (nC·Bt·E·N numbers; no (Bt, T, E, N) tensor is kept). The backward walks the chunks from the end:
    it recomputes the chunk's states from the saved start (bit-identical), takes the gate and skip
    gradients, runs the adjoint recurrence ``g_t = C_t·gy_t + Ā_{t+1}·g_{t+1}`` the same way (one addcmul
    per step), and forms every parameter gradient of the chunk with batched matmuls and reductions. Memory
    is O(T·Bt·E·N / chunk_size + chunk_size·Bt·E·N) and time is linear in T.

    Why not a time-parallel (cumsum / log-depth) scan inside chunks: on CPU those read and write the
    (Bt, T, E, N) state several more times (cumsum + two exps, or log₂C passes), and the scan is memory-bound,
    so they measured slower than stepping one cache-resident addcmul per step (benchmarks/results/
    selective_scan.md, "Alternatives"); the cumsum form also needs ``exp(-cumsum(Δ·A))``, which overflows
    (see the module docstring). Here every exponent is ``Δ·A ≤ 0``, so any Δ ≥ 0 and A ≤ 0 are safe.
    Double backward is not supported.
    """
    batch, _, channels, state_size = _check_inputs(x, delta, A, B, C, D, z, initial_state, resets)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int; got {chunk_size!r}")
    dtype = _compute_dtype(x, delta, A, B, C, D, z, initial_state)
    xc = x.to(dtype)
    h0 = xc.new_zeros(batch, channels, state_size) if initial_state is None else initial_state.to(dtype)
    D_c, z_c = (None if D is None else D.to(dtype)), (None if z is None else z.to(dtype))
    inputs = (xc, delta.to(dtype), A.to(dtype), B.to(dtype), C.to(dtype), D_c, z_c, h0)
    save = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs)
    y, final = _SelectiveScanFn.apply(*inputs, _keep_factor(resets, dtype), chunk_size, save)  # (Bt, T, E), (Bt, E, N)
    return y.to(x.dtype), (final if return_final_state else None)
