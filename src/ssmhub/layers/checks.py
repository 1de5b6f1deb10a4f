"""Input checks every token mixer runs before any work (the mixer protocol of ssmhub.layers)."""

from __future__ import annotations

import torch

__all__ = ["check_mixer_inputs"]


def check_mixer_inputs(x: torch.Tensor, mask: torch.Tensor | None, hidden_size: int) -> None:
    """Raise a ValueError unless x is (B, L, hidden_size) and mask is None or (B, L)."""
    if x.dim() != 3 or x.shape[-1] != hidden_size:
        raise ValueError(f"x must have shape (B, L, {hidden_size}); got {tuple(x.shape)}")
    if mask is not None and mask.shape != x.shape[:2]:
        raise ValueError(f"mask must have shape {tuple(x.shape[:2])}; got {tuple(mask.shape)}")
