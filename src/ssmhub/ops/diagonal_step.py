"""One token of a complex diagonal linear recurrence, computed in real arithmetic.

DLR (Gupta et al., arXiv 2212.00768, Eq. 1) and the modal form of a long convolution (S4D, arXiv 2206.11893
§3; H3's distilled decode) decode with the same step on a complex state ``x ∈ C^{B×H×N}``:

    ``x_t = λ ⊙ x_{t-1} + u_t``,   ``z_t = Σ_n c_n x_t[n]``  (the caller reads out Re z_t or Im z_t).

The step works on real and imaginary planes written out, because neither ONNX nor Inductor handles complex
tensors well: with this form a decode step compiles (``torch.compile``) and exports to ONNX without a complex
kernel, and its numbers are complex64 multiplication's (λ itself is formed in float64 and then rounded).
:func:`diagonal_step_planes` takes the planes as they are (DLR keeps its state as real planes);
:func:`diagonal_step` takes a complex64 state (H3's modal state) through its real view (no copy).
"""

from __future__ import annotations

import torch

__all__ = ["diagonal_step", "diagonal_step_planes", "polar_parts"]


def polar_parts(log_modulus: torch.Tensor, phase: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Re λ, Im λ)`` float32 of ``λ = exp(log_modulus + i·phase)``, formed in float64 and then rounded
    (the values of ``torch.polar`` in float64 cast to complex64)."""
    modulus, angle = torch.exp(log_modulus.double()), phase.double()
    return (modulus * torch.cos(angle)).float(), (modulus * torch.sin(angle)).float()


def diagonal_step_planes(
    x_re: torch.Tensor,
    x_im: torch.Tensor,
    lam: tuple[torch.Tensor, torch.Tensor],
    u_t: torch.Tensor,
    weights: tuple[torch.Tensor, torch.Tensor],
    imag: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """One step on real planes: ``x_t = λ x_{t-1} + u_t``, ``z_t = Σ_n c_n x_t[n]``.

    Args:
        x_re, x_im: Re and Im of x_{t-1}, each (B, H, N) float32.
        lam: (Re λ, Im λ), each broadcastable to (H, N), float32.
        u_t: (B, H) real input, added to every mode (the input map is all ones in both recurrences).
        weights: (Re c, Im c), each (H, N) float32.
        imag: also compute Im z_t (None otherwise: a caller that reads out Re z_t alone skips its reduction).

    Returns: ``(Re z_t (B, H), Im z_t (B, H) or None, Re x_t, Im x_t (B, H, N) each)``.
    """
    lam_re, lam_im = lam
    c_re, c_im = weights
    u = u_t.float().unsqueeze(-1)  # (B, H, 1)
    new_re = lam_re * x_re - lam_im * x_im + u
    new_im = lam_re * x_im + lam_im * x_re
    z_re = (new_re * c_re - new_im * c_im).sum(-1)  # (B, H)
    z_im = (new_re * c_im + new_im * c_re).sum(-1) if imag else None
    return z_re, z_im, new_re, new_im


def diagonal_step(
    state: torch.Tensor,
    lam: tuple[torch.Tensor, torch.Tensor],
    u_t: torch.Tensor,
    weights: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`diagonal_step_planes` on a complex state x_{t-1} (B, H, N) complex64, through its real view.

    Returns: ``(Re z_t (B, H), Im z_t (B, H), x_t (B, H, N) complex64)``.
    """
    x = torch.view_as_real(state.to(torch.complex64))  # (B, H, N, 2), no copy
    z_re, z_im, new_re, new_im = diagonal_step_planes(x[..., 0], x[..., 1], lam, u_t, weights)
    return z_re, z_im, torch.view_as_complex(torch.stack([new_re, new_im], dim=-1))  # (B, H, N) complex64
