"""Values derived from a module's tensors, kept between calls until one of those tensors changes.

A decode step must not redo work whose inputs did not change since the last token (DLR-prod's Kronecker
recurrence, a long convolution's regularized kernel, the stacked weights of SeRpEnt's branches, a distilled H3's
head groups) and must not read tensor values back to the host to find out. Every such value is kept here once,
keyed on what identifies its tensors without reading them: storage address, version counter (bumped by every
in-place update: an optimizer step, ``load_state_dict``, ``copy_``), device and dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

__all__ = ["can_keep", "kept", "tensor_versions"]

T = TypeVar("T")


def tensor_versions(tensors: Iterable[torch.Tensor]) -> tuple:
    """What changes when any of ``tensors`` does (storage, version counter, device, dtype), without reading them."""
    return tuple((t.data_ptr(), t._version, t.device, t.dtype) for t in tensors)


def can_keep(needs_grad: bool = True) -> bool:
    """Whether a value may be kept now: not while torch.compile or torch.export traces (a traced step has no data
    pointers to key on, and computes the value in its graph) and, when ``needs_grad``, not while gradients are on
    (a kept value would carry a stale graph)."""
    return not torch.compiler.is_compiling() and not (needs_grad and torch.is_grad_enabled())


def kept(owner: Any, slot: str, key: tuple, build: Callable[[], T]) -> T:
    """``build()``, kept in ``owner.__dict__[slot]`` (a plain attribute: never a buffer or in a state dict) and
    built again when ``key`` differs from the one it was built for."""
    entry = owner.__dict__.get(slot)
    if entry is None or entry[0] != key:
        entry = (key, build())
        owner.__dict__[slot] = entry
    return entry[1]
