"""The transition normalisation of the block-diagonal LRNN's code, fused, with its own backward.

Fan, Chi & Rudnicky (arXiv 2309.07412) bound every column of every b×b transition block in the
p-norm (Eq. 6, §3.3). The authors' code (github.com/tinghanf/RegluarLRNN, ``BlockModel`` in
``block_model.py``), which reproduces their Table 2, does it differently, per block: where Eq. 6 rescales
each column on its own and only when its norm exceeds 1, the code centres every column and divides the whole
block by its largest column's norm::

    C = G − mean_i G            # centre each column over its rows: columns sum to 0
    A = C / (max_j ‖C[:, j]‖_p + eps)

so the largest column ends with p-norm exactly 1 (eps = 0). Autograd through that composition takes
about a dozen full-size passes in the backward, the p-norm's backward over every column among them,
although only the largest column's norm reaches the output. The backward here is, with
``s = max_j ‖C[:, j]‖_p + eps``, ``t = Σ_ij ∂L/∂A_ij · A_ij`` and j* the largest column:

    ∂L/∂C = ∂L/∂A / s − (t / s) · e_{j*}ᵀ ⊗ ∂‖C[:, j*]‖_p/∂C[:, j*]
    ∂‖c‖_p/∂c_i = sign(c_i) · (|c_i| / ‖c‖_p)^(p−1)       (scale-free: evaluated on A's column)
    ∂L/∂G = ∂L/∂C − mean_i ∂L/∂C                           (the centring is a projection)

Ties for the largest column (a measure-zero event for learned blocks) send the gradient to the
first of them, where autograd's ``amax`` would split it.
"""

from __future__ import annotations

import torch

from .pnorm import vector_p_norm

__all__ = ["normalize_by_largest_column", "normalize_by_largest_column_ref"]


class _NormalizeByLargestColumnFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, G, p, eps):
        centred = G - G.mean(dim=-2, keepdim=True)  # (..., b, b): every column sums to 0
        largest, column = vector_p_norm(centred, p, dim=-2).max(dim=-1)  # (...,): max_j ‖C[:, j]‖_p and its j
        scale = largest + eps if eps else largest
        A = centred.div_(scale[..., None, None])  # (..., b, b)
        ctx.save_for_backward(A, scale, largest, column)
        ctx.p = p
        return A

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_A):
        A, scale, largest, column = ctx.saved_tensors
        rows = A.shape[-2]
        t = torch.einsum("...ij,...ij->...", grad_A, A)  # (...,): Σ ∂L/∂A ⊙ A
        index = column[..., None, None].expand(*column.shape, rows, 1)  # (..., b, 1): column j* of each block
        a = A.gather(-1, index)  # (..., b, 1): the largest column, scaled by 1/s
        a_norm = (largest / scale)[..., None, None]  # (..., 1, 1): ‖a‖_p (1 when eps = 0)
        d_norm = a.abs().div_(a_norm).pow_(ctx.p - 1).copysign_(a)  # (..., b, 1): ∂‖c‖_p/∂c, scale-free
        d_norm.masked_fill_(a == 0, 0.0)  # sign(0) = 0, also for p = 1 where 0^0 = 1
        grad_centred = grad_A / scale[..., None, None]  # (..., b, b)
        grad_centred.scatter_add_(-1, index, d_norm.mul_(-(t / scale)[..., None, None]))
        return grad_centred - grad_centred.mean(dim=-2, keepdim=True), None, None


def normalize_by_largest_column(G: torch.Tensor, p: float, eps: float = 0.0) -> torch.Tensor:
    """``C / (max_j ‖C[:, j]‖_p + eps)`` with ``C = G − mean_i G``, per block G (..., b, b) [row i, col j].

    The authors' normalisation of the transition blocks (see the module docstring), with a fused
    backward; values and gradients match :func:`normalize_by_largest_column_ref`. Needs p ≥ 1, eps ≥ 0
    and a floating-point G; double backward is not supported.
    """
    if not p >= 1:
        raise ValueError(f"p must be >= 1 for a norm; got {p}")
    if not eps >= 0:
        raise ValueError(f"eps must be non-negative; got {eps}")
    if G.dim() < 2 or G.shape[-1] != G.shape[-2]:
        raise ValueError(f"G must have shape (..., b, b); got {tuple(G.shape)}")
    return _NormalizeByLargestColumnFn.apply(G, float(p), float(eps))


def normalize_by_largest_column_ref(G: torch.Tensor, p: float, eps: float = 0.0) -> torch.Tensor:
    """Reference: the same formula composed from torch ops (``torch.linalg.vector_norm``) under autograd."""
    centred = G - G.mean(dim=-2, keepdim=True)
    largest = torch.linalg.vector_norm(centred, ord=p, dim=-2).amax(dim=-1)  # (...,)
    return centred / (largest + eps)[..., None, None]
