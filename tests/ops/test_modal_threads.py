"""ops/modal_threads.py: a bank fitted in threads is fitted as one call fits it, and torch's thread count survives."""

import dataclasses

import pytest
import torch

from ssmhub.ops import modal_threads
from ssmhub.ops.modal import ModalKernel, fit_modal_kernels, modal_kernel
from ssmhub.ops.modal_threads import concat_modal_kernels, fit_modal_kernels_threaded


def _decaying_noise(channels, length, seed=0):
    """Noise under exponential envelopes of 5-200 taps: kernels whose Hankel singular values fall off."""
    g = torch.Generator().manual_seed(seed)
    decay = torch.logspace(torch.log10(torch.tensor(5.0)), torch.log10(torch.tensor(200.0)), channels)
    envelope = torch.exp(-torch.arange(length)[None] / decay[:, None])  # (H, L)
    return torch.randn(channels, length, generator=g) * envelope


@pytest.fixture
def two_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("method", ["balanced", "best"])
def test_threaded_fits_are_the_one_call_fits_channel_by_channel(method, two_threads):
    """Each channel's fit does not depend on which others share its call: what may differ is the rounding of ops
    batched over other channels, so the (float32) errors agree within 1e-5 relative and the fitted kernels within
    1e-5 of the kernel's norm (a hundred float32 ulps; a different fit would differ by the error itself, ≥ 1e-3)."""
    kernel = _decaying_noise(40, 256)
    whole = fit_modal_kernels(kernel, [4, 8], method)
    threaded = fit_modal_kernels_threaded(kernel, [4, 8], method, workers=2)
    assert torch.get_num_threads() == 2
    for a, b in zip(whole, threaded):
        torch.testing.assert_close(b.relative_error, a.relative_error, rtol=1e-5, atol=1e-7)
        scale = kernel.norm(dim=-1, keepdim=True)
        torch.testing.assert_close(modal_kernel(b, 256) / scale, modal_kernel(a, 256) / scale, rtol=0, atol=1e-5)


def test_a_small_bank_is_one_call(monkeypatch, two_threads):
    """Fewer than MIN_CHANNELS_PER_THREAD channels per thread: the plain call, bit for bit, no thread started."""
    monkeypatch.setattr(modal_threads, "ThreadPoolExecutor", None)  # a pool would fail
    kernel = _decaying_noise(modal_threads.MIN_CHANNELS_PER_THREAD + 3, 128)
    (threaded,) = fit_modal_kernels_threaded(kernel, [4], "balanced")
    (whole,) = fit_modal_kernels(kernel, [4], "balanced")
    for field in dataclasses.fields(ModalKernel):
        assert torch.equal(getattr(threaded, field.name), getattr(whole, field.name)), field.name


def test_thread_count_and_matmul_precision_come_back_after_an_error(two_threads):
    kernel = _decaying_noise(40, 128)
    before = torch.get_float32_matmul_precision()
    with pytest.raises(ValueError, match="method"):
        fit_modal_kernels_threaded(kernel, [4], "no-such-method", workers=2)
    assert torch.get_num_threads() == 2 and torch.get_float32_matmul_precision() == before


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_workers_must_be_a_positive_int(workers):
    with pytest.raises(ValueError, match="workers"):
        fit_modal_kernels_threaded(_decaying_noise(40, 64), [2], workers=workers)


def test_concat_keeps_the_channel_order():
    (fit,) = fit_modal_kernels(_decaying_noise(6, 64), [2], "balanced")
    parts = [ModalKernel(**{f.name: getattr(fit, f.name)[s] for f in dataclasses.fields(ModalKernel)})
             for s in (slice(0, 2), slice(2, 6))]  # fmt: skip
    joined = concat_modal_kernels(parts)
    for field in dataclasses.fields(ModalKernel):
        assert torch.equal(getattr(joined, field.name), getattr(fit, field.name)), field.name
