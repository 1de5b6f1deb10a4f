"""``generate`` with a model's linear maps on oneDNN's CPU matmul (:func:`ssmhub.ops.cpu_linear.cpu_linear`).

A decode step's weight products are most of its work at any batch size, and on a CPU ATen's ``addmm`` is not the
fastest product torch has (:mod:`ssmhub.ops.cpu_linear`). :func:`linears_on_cpu_gemm` gives every plain float
``nn.Linear`` of a model that product for as long as a ``with`` block runs (ssmhub's ``generate``), then hands each
its own forward back: training, ``torch.compile``, ``torch.export`` and quantized or distributed modules never see
it, and a module that already has a forward of its own (a serving engine's GEMM, an offloading hook) keeps it.
Each module keeps its weight: :func:`~ssmhub.ops.cpu_linear.cpu_linear` reads the parameter as it is at each call.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ..ops.cpu_linear import cpu_linear

__all__ = ["linears_on_cpu_gemm", "plain_linear"]


def _cpu_gemm_forward(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return cpu_linear(x, module.weight, module.bias)


def plain_linear(module: nn.Module) -> bool:
    """Whether ``module`` is an ``nn.Linear`` computing ``nn.Linear.forward`` (a subclass that only sets its initial
    values, as Mamba's ``dt_proj`` and ``out_proj``, is one; one that overrides the forward is not) on a plain
    floating-point weight (not a quantized or distributed tensor subclass), with no forward of its own on the
    instance: a module whose product another GEMM may compute."""
    own_forward = type(module).forward is not nn.Linear.forward or "forward" in module.__dict__
    if not isinstance(module, nn.Linear) or own_forward:
        return False
    return type(module.weight.data) is torch.Tensor and module.weight.is_floating_point()


def _routable(module: nn.Module) -> bool:
    """A :func:`plain_linear` on a float32 CPU weight."""
    return plain_linear(module) and module.weight.dtype == torch.float32 and module.weight.device.type == "cpu"


@contextmanager
def linears_on_cpu_gemm(model: nn.Module) -> Iterator[int]:
    """Route ``model``'s plain float32 CPU ``nn.Linear`` modules through :func:`~ssmhub.ops.cpu_linear.cpu_linear`
    inside the block (yields how many); their forwards are restored when it exits, however it exits. Re-entrant and
    harmless to a concurrent call: a module routed already is left to whoever routed it, and either path computes
    the same function."""
    routed = [module for module in model.modules() if _routable(module)]
    for module in routed:
        module.forward = _cpu_gemm_forward.__get__(module)  # an instance's forward: nn.Module.__call__ runs it
    try:
        yield len(routed)
    finally:
        for module in routed:
            module.__dict__.pop("forward", None)
