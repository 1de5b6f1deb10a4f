"""Weights of several same-shaped modules stacked along a leading dim, for a decode step that runs them at once.

A decode step is hundreds of small tensor ops, whose number, not their arithmetic, sets its cost on a CPU; modules
of one shape (SeRpEnt's resampling branches and their Mambas) run a step together when their weights are stacked
(R, ...) and their matmuls batched. Stacking copies the weights, so :func:`kept_stack` keeps the stack between
steps and makes it again only when a weight changed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from torch import nn

from .memo import can_keep, kept

__all__ = ["batched_linear", "kept_stack", "linear_maps", "row_linear", "stack"]

Stacked = TypeVar("Stacked")


def stack(tensors: Sequence[torch.Tensor | None], *, transpose: bool = False, middle: bool = False):
    """The tensors stacked along a new dim 0, (R, ...), or None if the first is None (an absent bias).

    ``transpose``: 2-d weights (out, in) as (R, in, out), the right operand of a batched matmul; ``middle``:
    (R, 1, ...), broadcasting over the batch rows of a (R, B, ...) activation."""
    if tensors[0] is None:
        return None
    tensors = [t.t() if transpose else t for t in tensors]
    stacked = tensors[0].unsqueeze(0) if len(tensors) == 1 else torch.stack(tensors)  # one: a view, no copy
    return stacked.unsqueeze(1) if middle else stacked


def _weight_versions(modules: Sequence[nn.Module]) -> tuple:
    """(storage, version, dtype) of every parameter under ``modules``, by a plain walk of their ``_modules`` and
    ``_parameters`` (three times cheaper than ``parameters()``, which a decode step would pay per token)."""
    versions, pending = [], list(modules)
    while pending:
        module = pending.pop()
        versions += [(p.data_ptr(), p._version, p.dtype) for p in module._parameters.values() if p is not None]
        pending += module._modules.values()
    return tuple(versions)


def kept_stack(owner: nn.Module, modules: Sequence[nn.Module], build: Callable[[], Stacked]) -> Stacked:
    """``build()``, kept on ``owner`` between decode steps and made again when a weight of ``modules`` changed (its
    version counter, storage or dtype: an optimizer step, a load, a ``.to``), when gradients are on (the stack
    must carry them) or under ``torch.compile`` (which cannot check versions: there a module runs on its own weights,
    :func:`stack` of one module being views)."""
    if not can_keep():
        return build()
    return kept(owner, "_kept_stack", _weight_versions(modules), build)


def batched_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Each module's ``x W + b`` at once: x (R, B, in), weight (R, in, out) and bias (R, 1, out) or None, as
    :func:`stack` lays them out -> (R, B, out). A stack of one module (R = 1) serves any number of leading rows
    N, x (N, B, in): its weight is broadcast (a view), not copied.

    A batched matmul rather than ``F.linear``: with one row per matrix (B = 1, a decode step) Inductor lowers it on
    a CPU to a multiply-and-sum that it fuses with the ops around it, where a 2-d ``mm`` stays an external call with
    its own buffers (:func:`row_linear`)."""
    weight = weight.to(x.dtype).expand(x.shape[0], *weight.shape[1:])
    if bias is None:
        return torch.bmm(x, weight)
    return torch.baddbmm(bias.to(x.dtype).expand(x.shape[0], *bias.shape[1:]), x, weight)


def row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for x (..., in), weight (out, in), as one batched matmul of every row of x,
    (1, rows, in): in eager the same product, under ``torch.compile`` on a CPU a single row (a decode step's) is
    fused with its neighbours instead of running as an external ``mm`` (:func:`batched_linear`)."""
    rows = x.reshape(1, -1, x.shape[-1])  # (1, rows, in)
    y = batched_linear(rows, weight.t().unsqueeze(0), None if bias is None else bias.view(1, 1, -1))
    return y.view(*x.shape[:-1], weight.shape[0])


def linear_maps(linears: Sequence[nn.Module]) -> Callable[[torch.Tensor], torch.Tensor]:
    """Each of R linear modules on its own slice at once, x (R, B, in) -> (R, B, out) (one module: any number of
    leading rows, x (N, B, in) -> (N, B, out)). Plain float ``nn.Linear`` s
    are stacked (:func:`stack`) into one batched matmul; any other linear module (a quantized one: torchao's int8
    weight tensor, ``quantize_dynamic``'s packed weights, whose ``weight`` is a method; one given a forward of its
    own, a serving engine's GEMM) runs as itself, so that a decode step never reads a weight it cannot use or goes
    around the product it was given."""
    if all(_plain_linear(m) for m in linears):
        weight = stack([m.weight for m in linears], transpose=True)  # (R, in, out)
        return functools.partial(batched_linear, weight=weight, bias=stack([m.bias for m in linears], middle=True))
    return functools.partial(_each_module, list(linears))


def _plain_linear(module: nn.Module) -> bool:
    """An ``nn.Linear`` with a plain tensor weight and the class's own forward."""
    plain = isinstance(module, nn.Linear) and type(module.weight.data) is torch.Tensor
    return plain and "forward" not in module.__dict__


def _each_module(linears: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    if len(linears) == 1:  # one module: every leading row, x (N, B, in) -> (N, B, out)
        return linears[0](x)
    return torch.stack([linear(x_r) for linear, x_r in zip(linears, x)])  # (R, B, out)
