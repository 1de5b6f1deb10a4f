"""Keep recurrence math in float32 under autocast; choose how float32 matmuls are computed.

Recurrence parameters, states and FFTs lose the small, long-range terms they exist for when run in
half precision (a |λ| of 0.9997 is 1.0 in bfloat16), so ops that carry them run with autocast off
and cast their inputs to float32 themselves.

:func:`float32_matmul_precision` scopes ``torch.set_float32_matmul_precision`` to a block: ``"high"``
allows TF32 on CUDA (plain float32 on CPU); on a CPU with AVX512-BF16, ``"medium"`` lets oneDNN split
each float32 matmul into bfloat16 passes, faster at close to float32 accuracy.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["MATMUL_PRECISIONS", "TINY", "float32_math", "float32_matmul_precision"]

MATMUL_PRECISIONS = ("highest", "high", "medium")
# Entries below this are noise at float32 resolution (23 orders of magnitude under the 1e-7 that a unit value
# resolves), but they and their products with weights and gradients fall into the subnormal range (< 1.2e-38),
# where a CPU multiplies 50× slower; decaying powers λ^k of a long kernel are the usual source.
TINY = 1e-30


def float32_math(fn):
    """Decorator: run ``fn`` with autocast disabled on the device of its first tensor argument (a call outside
    autocast runs ``fn`` directly: entering the context costs more than a small decode-step op)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        tensor = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        if tensor is None or not torch.is_autocast_enabled(tensor.device.type):
            return fn(*args, **kwargs)
        with torch.autocast(device_type=tensor.device.type, enabled=False):
            return fn(*args, **kwargs)

    return wrapper


@contextmanager
def float32_matmul_precision(precision: str) -> Iterator[None]:
    """``torch.set_float32_matmul_precision(precision)`` inside the block, the previous value after it."""
    if precision not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul_precision must be one of {MATMUL_PRECISIONS}; got {precision!r}")
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)
