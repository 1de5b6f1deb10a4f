"""The end of a script that ``accelerate launch`` or ``torchrun`` started on several processes."""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["end_process_group"]


def end_process_group() -> None:
    """Wait for every process, then destroy the default process group; a no-op in a single process.

    A launched script must do this before it exits (PyTorch's distributed docs, "Shutdown"): otherwise the
    process group outlives ``main`` and gloo's worker threads meet interpreter shutdown, where a process can
    abort with "terminate called without an active exception" (SIGABRT) after its work is done, and the
    launcher reports the whole run failed. transformers' ``Trainer`` leaves the group in place.
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
