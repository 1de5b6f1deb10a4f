"""Keep recurrence math in float32 under autocast.

Recurrence parameters, states and FFTs lose the small, long-range terms they exist for when run in
half precision (a |λ| of 0.9997 is 1.0 in bfloat16), so ops that carry them run with autocast off
and cast their inputs to float32 themselves.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["float32_math"]


def float32_math(fn):
    """Decorator: run ``fn`` with autocast disabled on the device of its first tensor argument."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        tensor = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        if tensor is None:
            return fn(*args, **kwargs)
        with torch.autocast(device_type=tensor.device.type, enabled=False):
            return fn(*args, **kwargs)

    return wrapper
