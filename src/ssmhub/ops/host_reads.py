"""Whether reading a tensor's value back to the host is free: the one rule for code that may shortcut by a read.

On the CPU outside ``torch.compile`` a read (``.item()``, ``nonzero``, a Python branch on a value) waits for nothing,
and a shortcut it allows (skipping rows that need no work, sizing a buffer to what is used) can pay. On an
accelerator the same read is a host synchronisation, and under ``torch.compile`` a data-dependent shape or a graph
break; there such code takes its static path. :func:`static_paths` runs those paths on any device, so that a CPU can
check that they read nothing (tests/conformance/test_no_host_sync.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["are_free", "static_paths"]

_STATIC = [False]  # inside static_paths()


def are_free(tensor: torch.Tensor) -> bool:
    """True on the CPU outside ``torch.compile`` and :func:`static_paths`: reading ``tensor``'s values costs no
    device synchronisation."""
    return not _STATIC[0] and tensor.device.type == "cpu" and not torch.compiler.is_compiling()


@contextlib.contextmanager
def static_paths() -> Iterator[None]:
    """Within it, code takes the paths it takes on an accelerator (no shortcut by a host read), on any device."""
    previous, _STATIC[0] = _STATIC[0], True
    try:
        yield
    finally:
        _STATIC[0] = previous
