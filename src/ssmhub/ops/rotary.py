"""Rotary position embeddings (RoPE; RoFormer, Su et al., arXiv 2104.09864), the pure math.

Feature pair i of a query or key at position m is rotated by the angle m·θ_i, θ_i = base^(−2i/d) for
i = 0 .. d/2 − 1 (§3.2.2, Eq. 15, base 10000 there), computed without the rotation matrix as in §3.4.2, Eq. 34:

    out_a = x_a·cos(m θ_i) − x_b·sin(m θ_i)
    out_b = x_a·sin(m θ_i) + x_b·cos(m θ_i)

so that a query at m and a key at n score q·k as a function of m − n only (§3.2.2, Eq. 16). Only the first
``rotary_dim`` features of each head are rotated; the rest pass through. Which features pair up is the layout:

- non-interleaved (GPT-NeoX's layout, the default of flash-attn's ``RotaryEmbedding`` that the released H3
  hybrids use): pair i is (x[i], x[i + d/2]), the two halves of the rotated part;
- interleaved (the paper's Eq. 34 order, GPT-J's): pair i is (x[2i], x[2i + 1]).

Angles are computed in float32 from integer positions (a tensor, so that each row of a cached step rotates at its
own offset) and cos/sin are cast to the features' dtype only at the end, so a bfloat16 model keeps accurate
angles at large positions.
"""

from __future__ import annotations

import torch

__all__ = ["apply_rotary", "rotary_cos_sin", "rotary_embedding"]


def rotary_cos_sin(positions: torch.Tensor, rotary_dim: int, base: float = 10000.0, dtype: torch.dtype | None = None):
    """cos(m θ_i) and sin(m θ_i), each (*positions.shape, rotary_dim / 2), for integer ``positions`` m.

    θ_i = 1 / base^(2i / rotary_dim) (arXiv 2104.09864 Eq. 15), the angles m·θ_i in float32; ``dtype`` (default
    float32) is what cos and sin are cast to afterwards."""
    exponents = torch.arange(0, rotary_dim, 2, device=positions.device, dtype=torch.float32) / rotary_dim
    inv_freq = 1.0 / (base**exponents)  # (rotary_dim / 2,) θ_i
    angles = positions.to(torch.float32)[..., None] * inv_freq  # (..., rotary_dim / 2): m θ_i
    cos, sin = angles.cos(), angles.sin()
    return (cos, sin) if dtype is None else (cos.to(dtype), sin.to(dtype))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """Rotate the first ``2 · cos.shape[-1]`` features of ``x`` (..., d_head) by the angles whose cos and sin are
    given (broadcast against ``x[..., :1]`` with the last dim the pair index: (..., L, rotary_dim / 2) for x
    (..., L, d_head)); the remaining features pass through unchanged (arXiv 2104.09864 §3.4.2, Eq. 34)."""
    rotary_dim = 2 * cos.shape[-1]
    rotated, passed = x[..., :rotary_dim], x[..., rotary_dim:]
    if interleaved:
        x_a, x_b = rotated[..., 0::2], rotated[..., 1::2]  # pair i: features 2i, 2i + 1
    else:
        x_a, x_b = rotated[..., : rotary_dim // 2], rotated[..., rotary_dim // 2 :]  # pair i: features i, i + d/2
    out_a = x_a * cos - x_b * sin
    out_b = x_a * sin + x_b * cos
    if interleaved:
        out = torch.stack((out_a, out_b), dim=-1).flatten(-2)  # (..., rotary_dim / 2, 2) -> (..., rotary_dim)
    else:
        out = torch.cat((out_a, out_b), dim=-1)
    return torch.cat((out, passed), dim=-1) if passed.shape[-1] else out


def rotary_embedding(
    x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, base: float = 10000.0, interleaved: bool = False
) -> torch.Tensor:
    """``x`` (B, heads, L, d_head) with the first ``rotary_dim`` features of each head rotated at ``positions``
    (L,) or (B, L) integers: :func:`rotary_cos_sin` in float32, cast to ``x.dtype``, then :func:`apply_rotary`."""
    cos, sin = rotary_cos_sin(positions, rotary_dim, base, dtype=x.dtype)  # (L, d/2) or (B, L, d/2)
    if cos.dim() == 3:  # (B, L, d/2) -> (B, 1, L, d/2): the same angles for every head
        cos, sin = cos[:, None], sin[:, None]
    return apply_rotary(x, cos, sin, interleaved)
