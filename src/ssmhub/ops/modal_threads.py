"""Modal fits of a bank of channels on every CPU core (:func:`fit_modal_kernels_threaded`).

A truncated fit (:func:`~ssmhub.ops.modal.fit_modal_kernels`, the distillation of H3's long convolutions, arXiv
2302.06646 §3.3 and docs/families/h3.md) spends about half its time in LAPACK calls on small matrices: the Ritz
step's ``eigh``, ESPRIT's and the balanced poles' ``eigvals``, the residue systems' Cholesky factors. torch runs
a batch of those one matrix after another on one core, whatever its thread count, so on a 2-core CPU the second
core idles through half of the fit. Channels are fitted independently of each other, so this deals the bank
out to Python threads (torch's ops release the GIL), every op on one core; a channel's cost grows with its support
(the taps before its trailing zeros), so the channels are dealt in order of support, one to each thread in turn.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import torch

from .hankel import kernel_support
from .modal import ModalKernel, fit_modal_kernels
from .precision import float32_matmul_precision

__all__ = ["MIN_CHANNELS_PER_THREAD", "concat_modal_kernels", "fit_modal_kernels_threaded"]

MIN_CHANNELS_PER_THREAD = 16  # fewer channels per thread than this: one call, on torch's threads


def concat_modal_kernels(parts: list[ModalKernel]) -> ModalKernel:
    """Banks of channels (the same number of modes) -> one bank, channels in the order of ``parts``."""
    fields = [f.name for f in dataclasses.fields(ModalKernel)]
    return ModalKernel(**{name: torch.cat([getattr(part, name) for part in parts]) for name in fields})


def fit_modal_kernels_threaded(
    kernel: torch.Tensor, orders: list[int], method: str = "balanced", workers: int | None = None, **options
) -> list[ModalKernel]:
    """:func:`~ssmhub.ops.modal.fit_modal_kernels` of ``kernel`` (H, L) in ``workers`` threads (default: torch's
    intra-op thread count), each fitting every ``workers``-th channel in order of support with every op on one core.

    A channel's fit is the one :func:`fit_modal_kernels` gives it, up to the rounding of batched ops over other
    channel blocks (and, where a Krylov basis runs out of directions, which seeded random row fills it). While the
    threads run, ``torch.get_num_threads()`` is 1 in the whole process (torch has one intra-op setting); it is set
    back after. Runs as one call where a thread would get fewer than :data:`MIN_CHANNELS_PER_THREAD` channels, on an
    accelerator, or with one worker. ``options``: the other arguments of :func:`fit_modal_kernels`.
    """
    threads = torch.get_num_threads()
    workers = threads if workers is None else workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int (threads); got {workers!r}")
    workers = min(workers, kernel.shape[0] // MIN_CHANNELS_PER_THREAD)
    if workers <= 1 or kernel.device.type != "cpu":
        return fit_modal_kernels(kernel, orders, method, **options)
    by_support = kernel_support(kernel.detach()).argsort(stable=True)  # (H,)
    dealt = [by_support[i::workers] for i in range(workers)]  # channel indices per thread, sizes within one
    parts = [kernel[index] for index in dealt]
    # the fits scope the matmul precision themselves; scoped here too, each thread's restore finds this value
    # (restores from threads that overlap would otherwise leave the process at another thread's setting)
    with float32_matmul_precision("highest"):
        torch.set_num_threads(1)
        try:
            with ThreadPoolExecutor(workers) as pool:
                fits = list(pool.map(lambda part: fit_modal_kernels(part, orders, method, **options), parts))
        finally:
            torch.set_num_threads(threads)
    channel_order = torch.cat(dealt).argsort()  # (H,): where each of the kernel's channels went
    return [concat_modal_kernels([fit[i] for fit in fits]).channels(channel_order) for i in range(len(orders))]
