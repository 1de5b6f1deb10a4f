"""A served model's linear maps on the engine's own CPU GEMM: what vLLM does with the weights of the models it writes.

On a CPU, vLLM does not run a linear layer through ``torch.nn.functional.linear``: after loading, it hands each weight
to ``dispatch_cpu_unquantized_gemm``, which prepares it once for the fastest product the build has (a oneDNN
matmul primitive on a reordered copy of the weight, zentorch on AMD Zen builds, packed kernels for small bfloat16
weights) and runs every later product through it. At a decode step's few rows that product is several times faster
than ATen's ``addmm`` on the same weight, and it is most of a step's work. :func:`use_engine_gemm` gives an ssmhub
model's ``nn.Linear`` modules the same path: each keeps its weight (the module's own code, ``state_dict`` and ties
still see it) and its forward becomes the engine's product. This module imports vLLM.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
from vllm.platforms import current_platform

from ..models.cpu_linears import plain_linear

__all__ = ["use_engine_gemm"]


def _engine_forward(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """x (..., in) -> (..., out) by the engine's product of ``module``'s prepared weight (``cpu_linear``), also
    inside a compiled decode step, except for one input feature there (an outer product, which Inductor fuses): the
    engine's product wants its operand's last stride 1, and Inductor keeps no stride for a dimension of size 1 (a
    (1, 1) operand came with strides (9, 9))."""
    if module.in_features == 1 and torch.compiler.is_compiling():
        return F.linear(x, module.weight, module.bias)
    return module.cpu_linear(x.contiguous(), module.weight, module.bias)


def use_engine_gemm(model: nn.Module) -> int:
    """Route every plain float ``nn.Linear`` of ``model`` (:func:`~ssmhub.models.cpu_linears.plain_linear`: its
    subclasses that keep ``nn.Linear.forward`` included) on a CPU through vLLM's CPU GEMM dispatch, in place, once its
    weights are loaded (the engine prepares a weight once: a later change to it is not seen). Returns how many
    modules it routed; 0 on any other platform, where vLLM's own products are ``F.linear``'s."""
    if not current_platform.is_cpu():
        return 0
    routed = 0
    for module in model.modules():
        if not plain_linear(module):
            continue
        dispatch_cpu_unquantized_gemm(module, remove_weight=False)
        module.forward = _engine_forward.__get__(module)  # an instance's forward: nn.Module.__call__ runs it
        routed += 1
    return routed
