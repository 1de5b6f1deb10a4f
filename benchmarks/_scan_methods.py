"""The scans' inputs and the methods that compute them, shared by ``scans.py`` and the GPU suite (``_gpu_*.py``).

Selective scan (Mamba S6): :func:`selective_inputs` builds Mamba-like leaves, :func:`method_fn` the callables
(``fast``, ``ref``, ``cumsum``, ``transformers``), :func:`to_layout` transformers' (Bt, E, T) layout.
Block scan (block-diagonal LRNN): :func:`block_inputs` builds column-normalised blocks, :data:`BLOCK_METHODS` the
callables (``scan``, ``loop``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ssmhub.ops import block_scan, block_scan_ref, selective_scan, selective_scan_ref
from ssmhub.ops.selective_scan import DEFAULT_CHUNK_SIZE

BLOCK_METHODS = {"scan": block_scan, "loop": block_scan_ref}


def selective_inputs(batch, seq_len, channels, state, seed):
    """``([x, Δ, A, B, C, D, z], g)``: S4D-real A, Δ in the dt init range [1e-3, 0.1], the rest standard normal."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq_len, channels, generator=gen)
    log_dt = torch.rand(batch, seq_len, channels, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)
    delta = log_dt.exp()  # (Bt, T, E) in [1e-3, 0.1]
    A = -torch.arange(1, state + 1, dtype=torch.float32).repeat(channels, 1)  # (E, N)
    B = torch.randn(batch, seq_len, state, generator=gen)
    C = torch.randn(batch, seq_len, state, generator=gen)
    D = torch.ones(channels)
    z = torch.randn(batch, seq_len, channels, generator=gen)
    g = torch.randn(batch, seq_len, channels, generator=gen)
    return [x, delta, A, B, C, D, z], g


def block_inputs(batch, seq_len, heads, block, seed):
    """``(A, v, x0, g)``: blocks column-normalised with p = 1 (paper 002, Eq. 6), so nothing grows."""
    gen = torch.Generator().manual_seed(seed)
    raw = 2 * torch.randn(batch, seq_len, heads, block, block, generator=gen)
    A = raw / torch.linalg.vector_norm(raw, ord=1, dim=-2, keepdim=True).clamp(min=1.0)  # Eq. 6, p = 1
    v = torch.randn(batch, seq_len, heads, block, generator=gen)
    x0 = torch.randn(1, heads, block, generator=gen)
    g = torch.randn(batch, seq_len, heads, block, generator=gen)
    return A, v, x0, g


def _chunk_cumsum(t: torch.Tensor) -> torch.Tensor:
    """Cumulative sum over dim 2 of (Bt, nC, C, E, N) as a lower-triangular matmul (3-4× faster than cumsum)."""
    batch, n_chunks, chunk, channels, state = t.shape
    tri = torch.ones(chunk, chunk, dtype=t.dtype).tril()  # (C, C)
    return torch.matmul(tri, t.reshape(batch * n_chunks, chunk, channels * state)).view_as(t)


def cumsum_scan(x, delta, A, B, C, D, z, chunk=64):
    """Time-parallel alternative (timing only): per-chunk cumulative log-decay with re-centring, autograd.

    Within a chunk, S_t = Σ_{r≤t} Δ_r·A and h_t = exp(S_t − m)·Σ_{s≤t} exp(m − S_s)·Δ_s x_s B_s + exp(S_t)·h_in
    with m = S_end / 2; exact in real arithmetic but exp(m − S_s) overflows float32 once |S_end| ≳ 176.
    Both within-chunk cumulative sums are (C, C) lower-triangular matmuls.
    """
    batch, seq_len, channels = x.shape
    state = A.shape[1]
    pad = (-seq_len) % chunk
    if pad:  # Δ = 0 padding leaves the state unchanged
        x, delta, z = (F.pad(t, (0, 0, 0, pad)) for t in (x, delta, z))
        B, C = (F.pad(t, (0, 0, 0, pad)) for t in (B, C))
    n_chunks = (seq_len + pad) // chunk
    log_decay = (delta.unsqueeze(-1) * A).view(batch, n_chunks, chunk, channels, state)  # (Bt, nC, C, E, N)
    S = _chunk_cumsum(log_decay)  # (Bt, nC, C, E, N)
    m = S[:, :, -1:] / 2  # (Bt, nC, 1, E, N)
    u = ((delta * x).unsqueeze(-1) * B.unsqueeze(2)).view(batch, n_chunks, chunk, channels, state)
    local = torch.exp(S - m) * _chunk_cumsum(torch.exp(m - S) * u)  # (Bt, nC, C, E, N) from h_in = 0
    end_decay = torch.exp(S[:, :, -1])  # (Bt, nC, E, N)
    h, starts = x.new_zeros(batch, channels, state), []
    # unbind, not [:, k]: the backward of nC slices would write nC full-size zero gradients
    for decay_k, local_k in zip(end_decay.unbind(1), local[:, :, -1].unbind(1)):  # (Bt, E, N) each
        starts.append(h)
        h = decay_k * h + local_k
    states = local + torch.exp(S) * torch.stack(starts, dim=1).unsqueeze(2)  # (Bt, nC, C, E, N)
    y = torch.einsum("bkcen,bkcn->bkce", states, C.view(batch, n_chunks, chunk, state))  # (Bt, nC, C, E)
    y = y.reshape(batch, n_chunks * chunk, channels)
    return ((y + D * x) * F.silu(z))[:, :seq_len]


def method_fn(method: str, chunk: int | None):
    """The method as a callable on the 7 leaves (x, Δ, A, B, C, D, z) in its own layout (see to_layout)."""
    if method == "fast":
        return lambda *a: selective_scan(*a, chunk_size=chunk or DEFAULT_CHUNK_SIZE)[0]
    if method == "ref":
        return lambda *a: selective_scan_ref(*a)[0]
    if method == "cumsum":
        return lambda *a: cumsum_scan(*a, chunk=chunk)
    if method == "transformers":
        from transformers.models.mamba.modeling_mamba import mamba_selective_scan

        def hf(x, delta, A, B, C, D, z):  # x, Δ, z (Bt, E, T); B, C (Bt, N, T)
            return mamba_selective_scan(x, delta, A, B, C, D=D, z=z, delta_softplus=False)

        return hf
    raise ValueError(method)


def to_layout(method: str, tensors: list[torch.Tensor], g: torch.Tensor):
    if method != "transformers":
        return tensors, g
    x, delta, A, B, C, D, z = tensors
    tr = [t.transpose(1, 2).contiguous() for t in (x, delta, B, C, z)]
    return [tr[0], tr[1], A, tr[2], tr[3], D, tr[4]], g.transpose(1, 2).contiguous()
