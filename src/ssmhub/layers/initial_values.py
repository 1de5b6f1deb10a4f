"""Fresh parameter values, written once for every module of :mod:`ssmhub.layers` that has a recipe for them."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["fill_initial_values"]


@torch.no_grad()
def fill_initial_values(module: nn.Module) -> None:
    """Copy ``module.initial_parameter_values()`` (a ``{name: tensor}`` recipe) into its parameters.

    Modules call it at the end of ``__init__``; the model tier calls the same recipe through
    ``transformers.initialization``, which skips weights loaded from a checkpoint.
    """
    for name, value in module.initial_parameter_values().items():
        module.get_parameter(name).copy_(value)
