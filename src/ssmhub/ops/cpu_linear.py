"""A linear map on a CPU through oneDNN's matmul instead of ATen's ``addmm``.

On a CPU, ``torch.nn.functional.linear`` in float32 runs ATen's ``addmm``, which calls the BLAS torch was built with
(MKL in the official wheels). oneDNN, which torch also ships (``torch.backends.mkldnn``), has its own JIT-generated
matmul kernels, and torch exposes it as one op, ``torch.ops.mkldnn._linear_pointwise`` (what Inductor's CPU backend
calls for a linear layer). On a dense weight it needs no copy or reordering of it: the weight stays the parameter,
so an update to it is seen at the next call. Where the BLAS does not pick its fastest kernels for the processor (MKL
on an AMD one), oneDNN's product is the faster one at a decode step's few rows and at a prefill's many; the whole
decode step before and after: ``benchmarks/results/serving_generate_floor.md``.

:func:`cpu_linear` takes that path only where it computes the same function as ``F.linear``, to float32 round-off,
and is paid back: float32 tensors on a CPU, no gradient asked for (the op has no backward), not under
``torch.compile`` (Inductor chooses its own products), plain tensors (not a quantized or distributed weight), and a
product of at least :data:`MIN_MULTIPLY_ADDS` (the op's fixed cost per call, a few microseconds, would outweigh the
gain on the tiny products of a test-sized model). Anything else goes to ``F.linear``.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

__all__ = ["MIN_MULTIPLY_ADDS", "cpu_linear", "onednn_linear_fits"]

MIN_MULTIPLY_ADDS = 1 << 20  # rows × in × out below which F.linear's lower fixed cost wins


@functools.cache
def _onednn_linear():
    """torch's oneDNN linear op, or None where this torch build has no oneDNN (or no such op)."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        return None


def _plain(t: torch.Tensor | None) -> bool:
    return t is None or type(t) in (torch.Tensor, torch.nn.Parameter)


def onednn_linear_fits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether :func:`cpu_linear` runs ``x @ weight.T + bias`` on oneDNN (see the module's docstring)."""
    if torch.compiler.is_compiling():  # first: nothing below is traced
        return False
    if x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32 or x.dim() < 1:
        return False
    if not (_plain(x) and _plain(weight) and _plain(bias)) or weight.dim() != 2 or _onednn_linear() is None:
        return False
    if bias is not None and bias.dtype != torch.float32:
        return False
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return False
    if x.shape[-1] != weight.shape[1]:
        return False
    rows = x.numel() // max(1, x.shape[-1])
    return rows * weight.numel() >= MIN_MULTIPLY_ADDS


def cpu_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: x (..., in), weight (out, in), bias (out,) or None -> (..., out), on oneDNN's
    matmul where :func:`onednn_linear_fits`, else ``F.linear`` itself."""
    if not onednn_linear_fits(x, weight, bias):
        return F.linear(x, weight, bias)
    return _onednn_linear()(x.contiguous(), weight.contiguous(), bias, "none", [], "")
