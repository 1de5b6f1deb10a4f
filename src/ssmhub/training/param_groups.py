"""Optimizer parameter groups for any model the trainers build: an ssmhub model's own, else one group."""

from __future__ import annotations

from torch import nn

__all__ = ["param_groups"]


def param_groups(
    model: nn.Module, weight_decay: float, lr: float | None = None, recurrence_lr: float | None = None
) -> list[dict]:
    """``model.optimizer_param_groups(...)`` for an ssmhub model (no weight decay on recurrences, norms,
    biases and embeddings; the recurrence parameters at their own learning rate); for any other model
    (transformers' GPT-2 as a baseline) one group of its trainable parameters, decayed."""
    if hasattr(model, "optimizer_param_groups"):
        return model.optimizer_param_groups(weight_decay=weight_decay, lr=lr, recurrence_lr=recurrence_lr)
    return [{"params": [p for p in model.parameters() if p.requires_grad], "weight_decay": weight_decay}]
