"""Vector p-norms for a non-integer p, fast on CPU, with their own backward.

The block-diagonal LRNN (Fan et al. 2023, arXiv 2309.07412, Eq. 6 and §3.3) bounds every column of every
transition block in the p-norm with p = 1.2. ``torch.linalg.vector_norm`` evaluates ``|x|^p`` for a
fractional p with a scalar ``pow`` per element, which made the norm and its backward a large share of a
training step of the regular-language models (experiments/results/pnorm.md). Here
``|x|^p = exp2(p·log2|x|)`` runs on PyTorch's vectorised exp2/log2:

- forward: ``‖x‖_p = (Σ |x|^p)^(1/p)`` along ``dim``;
- backward: ``∂‖x‖_p/∂x = sign(x)·(|x| / ‖x‖_p)^(p−1)``, evaluated as ``sign(x)·exp2((p−1)·(log2|x| − log2‖x‖_p))``,
  0 where x = 0 (p > 1) and 0 for an all-zero vector (as torch's own backward).

p = 1, 2 and ∞ go to ``torch.linalg.vector_norm``, which has exact fast paths for them.
"""

from __future__ import annotations

import math

import torch

__all__ = ["vector_p_norm"]


class _VectorPNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p, dim, keepdim):
        powered = x.abs().log2_().mul_(p).exp2_()  # |x|^p; log2(0) = −inf, so exactly 0 where x = 0
        norm = powered.sum(dim, keepdim=True).pow(1.0 / p)  # (…, 1, …)
        ctx.save_for_backward(x, norm)
        ctx.p, ctx.dim = p, dim
        return norm if keepdim else norm.squeeze(dim)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_norm):
        x, norm = ctx.saved_tensors
        if grad_norm.dim() != norm.dim():
            grad_norm = grad_norm.unsqueeze(ctx.dim)
        log_norm = torch.log2(norm).masked_fill_(norm == 0, 0.0)  # an all-zero vector: 0 − (−inf) would be NaN
        ratio = x.abs().log2_().sub_(log_norm).mul_(ctx.p - 1).exp2_()  # (|x| / ‖x‖)^(p−1), 0 where x = 0
        return ratio.copysign_(x).mul_(grad_norm), None, None, None


def vector_p_norm(x: torch.Tensor, p: float, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """``‖x‖_p`` along ``dim`` (``torch.linalg.vector_norm(x, ord=p, dim=dim, keepdim=keepdim)``), p ≥ 1.

    A float p that is not 1, 2 or ∞ takes the exp2/log2 path with its own backward (values within a few
    float32 ulps of torch's); x must then be a floating-point tensor. Double backward is not supported.
    """
    if not p >= 1:
        raise ValueError(f"p must be >= 1 for a norm; got {p}")
    if p in (1, 2) or math.isinf(p) or not x.is_floating_point():
        return torch.linalg.vector_norm(x, ord=p, dim=dim, keepdim=keepdim)
    return _VectorPNormFn.apply(x, float(p), dim if dim >= 0 else x.dim() + dim, keepdim)
