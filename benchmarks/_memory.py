"""Peak resident memory of a block of code, measured by the kernel (Linux only).

torch's CPU allocator takes its memory from the C library, so the process's resident set is what a
block really occupies. Linux tracks its high-water mark (``VmHWM`` in ``/proc/self/status``) and resets
it to the current resident size when ``5`` is written to ``/proc/self/clear_refs``
(Documentation/filesystems/proc.rst). :func:`peak_rss_above_baseline` uses that to measure what a block
adds on top of what was resident before it:

1. hand freed heap memory back to the kernel (``gc.collect()``, glibc's ``malloc_trim(0)``) and take the
   resident size as the baseline;
2. run ``setup()`` (e.g. prefill a cache), hand freed memory back again and reset the high-water mark,
   so the transient memory of the setup does not count but what it leaves resident does;
3. run ``block(setup_result)``; the peak is the high-water mark minus the baseline.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable
from typing import Any

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def _libc():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


_LIBC = _libc()


def _status_kib(field: str) -> int:
    with open(_STATUS, encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{_STATUS} has no {field} line")


def peak_rss_available() -> bool:
    """Whether this process can read and reset its resident-memory high-water mark."""
    try:
        _status_kib("VmHWM")
        with open(_CLEAR_REFS, "w", encoding="ascii") as f:
            f.write("5")
    except (OSError, RuntimeError):
        return False
    return True


def release_freed_memory() -> None:
    """Collect garbage and return the C heap's free pages to the kernel (glibc; elsewhere a no-op)."""
    gc.collect()
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)


def peak_rss_above_baseline(setup: Callable[[], Any], block: Callable[[Any], Any]) -> tuple[int, Any]:
    """``(bytes, setup_result)``: the peak resident memory during ``block(setup())`` above the memory
    resident before ``setup`` ran. The setup's transient memory is excluded, what it keeps is included.

    Raises RuntimeError where the high-water mark cannot be read or reset (see :func:`peak_rss_available`).
    """
    if not peak_rss_available():
        raise RuntimeError("peak resident memory needs Linux's /proc/self/status and /proc/self/clear_refs")
    release_freed_memory()
    baseline_kib = _status_kib("VmRSS")
    state = setup()
    release_freed_memory()
    with open(_CLEAR_REFS, "w", encoding="ascii") as f:
        f.write("5")  # VmHWM := current VmRSS
    block(state)
    return 1024 * (_status_kib("VmHWM") - baseline_kib), state
