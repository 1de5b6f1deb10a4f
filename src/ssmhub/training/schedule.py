"""The learning-rate schedule every ssmhub training loop shares."""

from __future__ import annotations

import math

__all__ = ["lr_lambda"]


def lr_lambda(step: int, warmup_steps: int, max_steps: int, min_ratio: float) -> float:
    """Linear warmup over ``warmup_steps``, then cosine decay from 1 to ``min_ratio`` at ``max_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
