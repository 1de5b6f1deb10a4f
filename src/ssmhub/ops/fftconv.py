"""Long convolutions computed with the FFT, shared by every family.

Seed paper (DLR, arXiv 2212.00768) §A.1: a causal convolution is the product of a circulant matrix
with a zero-padded input, ``circulant(K) u = iFFT(FFT(K) * FFT(u))``. The FFT size must be at least
``L + kernel_length - 1``; anything shorter wraps the tail of the kernel around onto earlier
positions, which in a causal model leaks future tokens into the past.

Both functions compute in float32 even under autocast (half-precision FFTs lose the small kernel
taps that carry long-range information) and return the input's dtype.

``fft_conv(..., backend=...)`` picks who computes the FFTs, all giving the same numbers to float32
round-off: ``torch.fft`` (the default, what CI runs), FlashButterfly's Butterfly matmuls
(:mod:`ssmhub.ops.butterfly`, long-conv paper §3.2), the fused Triton kernel (:mod:`ssmhub.ops.triton`),
or ``"auto"``. A backend that cannot take a call hands it on (triton → butterfly → torch) with a one-time
:class:`BackendFallbackWarning`; it never returns a different answer. This module is the dispatcher above
those backends: it imports them, and they share their pieces (argument checks, FFT size, circulant, DFT
blocks) through the leaf module :mod:`ssmhub.ops.circulant`, never through this one.

The slow, obviously-correct references build the dense Toeplitz matrix and multiply: O(L^2).
"""

from __future__ import annotations

import warnings

import torch

from .butterfly import BLOCK_SIZES, butterfly_conv
from .circulant import check_conv_args, conv_circulant, fft_size
from .precision import float32_math
from .triton import can_run as triton_can_run
from .triton import triton_conv

__all__ = [
    "BACKENDS",
    "BackendFallbackWarning",
    "conv_circulant",
    "fft_conv",
    "fft_conv_continue",
    "fft_conv_ref",
    "fft_conv_tail",
    "fft_size",
    "smooth_fft_size",
]

BACKENDS = ("torch", "butterfly", "triton", "auto")


def smooth_fft_size(length: int) -> int:
    """Smallest ``2^a · 3^b · 5^c`` that is at least ``length``: a size torch's FFTs (pocketfft, MKL) compute
    as fast per point as a power of two, up to 1.8× fewer points than :func:`fft_size` (1152 instead of
    2048 for a 576-long input and kernel)."""
    best = fft_size(length)
    power5 = 1
    while power5 < best:
        power35 = power5
        while power35 < best:
            candidate = power35 * fft_size(-(-length // power35))  # the smallest 2^a · power35 >= length
            best = min(best, candidate)
            power35 *= 3
        power5 *= 5
    return best


def _check_backend_args(backend: str, block_size: int) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 2:
        raise ValueError(f"block_size (the Butterfly block r) must be an integer >= 2; got {block_size!r}")


_WARNED: set[tuple[str, str]] = set()


class BackendFallbackWarning(UserWarning):
    """A requested ``fft_conv`` backend cannot take this call; the next backend computes it instead."""


def _fall_back(backend: str, reason_key: str, message: str) -> None:
    """Warn once per (backend, reason) that ``backend`` hands this call on to the next one."""
    if (backend, reason_key) not in _WARNED:
        _WARNED.add((backend, reason_key))
        warnings.warn(message, BackendFallbackWarning, stacklevel=5)


def _select_backend(backend: str, block_size: int, n: int, device: torch.device) -> str:
    """The backend that will compute this call: the requested one, or the next in triton → butterfly →
    torch that can take it (each hand-over warned once).

    ``auto`` is ``torch.fft`` everywhere for now: on a CPU MKL's FFT beats matmul Butterflies
    (benchmarks/results/fftconv.md), and the fused Triton kernel has not yet been compiled or timed on a GPU
    (it is tested in Triton's CPU interpreter); once a GPU benchmark shows it ahead, ``auto`` should pick it
    on CUDA where ``triton.can_run`` says it fits."""
    if backend == "auto":
        return "torch"
    if backend == "triton":
        usable, reason = triton_can_run(device, n)
        if usable:
            return "triton"
        _fall_back("triton", reason.split(":")[0], f"fft_conv(backend='triton'): {reason}; using 'butterfly'")
        backend = "butterfly"
    if backend == "butterfly":
        if block_size in BLOCK_SIZES:
            return "butterfly"
        _fall_back(
            "butterfly",
            f"block_size={block_size}",
            f"fft_conv(backend='butterfly'): block_size={block_size} is not a power of two in {list(BLOCK_SIZES)}; "
            "using 'torch'",
        )
    return "torch"


@float32_math
def fft_conv(
    u: torch.Tensor,
    kernel: torch.Tensor,
    kernel_backward: torch.Tensor | None = None,
    backend: str = "torch",
    block_size: int = 16,
) -> torch.Tensor:
    """Depthwise long convolution of ``u`` with ``kernel`` along the last axis, via the FFT.

    Causal (``kernel_backward is None``), seed paper Eq. 4:
        ``y[..., h, k] = sum_{j <= k} kernel[h, k - j] * u[..., h, j]``

    Bidirectional, seed paper Eq. 6 (the current token is counted once, by ``kernel[:, 0]``):
        ``y[..., h, k] += sum_{j > k} kernel_backward[h, j - k - 1] * u[..., h, j]``

    Args:
        u: (..., H, L) input.
        kernel: (H, K) causal kernel; taps past L are ignored, a shorter kernel is zero beyond K.
        kernel_backward: optional (H, K') anti-causal kernel.
        backend: who computes the FFTs, all giving the same numbers to float32 round-off:
            ``"torch"`` (default, ``torch.fft``), ``"butterfly"`` (FlashButterfly's Butterfly matmuls,
            :func:`ssmhub.ops.butterfly.butterfly_conv`, long-conv paper §3.2), ``"triton"`` (the fused
            Triton kernel of :mod:`ssmhub.ops.triton`; CUDA, or CPU tensors under ``TRITON_INTERPRET=1``),
            ``"auto"`` (for now always torch, see ``_select_backend``). A backend that cannot take a call
            (Triton missing or the FFT size too large for its on-chip kernel, a block size that is not a
            power of two in 2 … 256) hands it to the next one, triton → butterfly → torch, with a one-time
            :class:`BackendFallbackWarning`.
        block_size: r, the Butterfly block size (``"butterfly"`` only; an integer >= 2).

    Returns:
        (..., H, L) in ``u.dtype``.
    """
    check_conv_args(u, kernel, kernel_backward)
    _check_backend_args(backend, block_size)
    seq_len = u.shape[-1]
    if backend != "torch":
        backward_taps = 0 if kernel_backward is None else min(kernel_backward.shape[-1], seq_len - 1)
        needed = seq_len + max(min(kernel.shape[-1], seq_len), backward_taps)
        backend = _select_backend(backend, block_size, fft_size(needed), u.device)
    if backend == "butterfly":
        return butterfly_conv(u, kernel, kernel_backward, block_size=block_size)
    if backend == "triton":
        return triton_conv(u, kernel, kernel_backward)

    kernel = kernel[:, :seq_len]
    if kernel_backward is not None:
        kernel_backward = kernel_backward[:, : seq_len - 1]
    longest = max(kernel.shape[-1], 0 if kernel_backward is None else kernel_backward.shape[-1])
    n = smooth_fft_size(seq_len + longest)  # >= L + K - 1: no circular wrap-around onto real outputs
    circulant = conv_circulant(kernel, kernel_backward, n)  # (H, n)
    return _CirculantConv.apply(u.float(), circulant).to(u.dtype)


def fft_conv_tail(stream: torch.Tensor, kernel: torch.Tensor, num_outputs: int) -> torch.Tensor:
    """The last ``num_outputs`` outputs of the causal convolution ``fft_conv(stream, kernel)``, by overlap-save
    (see :func:`fft_conv_continue`, which this splits ``stream`` for).

    Args: stream (..., H, M + L); kernel (H, K); num_outputs: L, 1 <= L <= M + L.
    Returns: (..., H, L) float32 (torch.fft).
    """
    check_conv_args(stream, kernel, None)
    total = stream.shape[-1]
    if not 1 <= num_outputs <= total:
        raise ValueError(f"num_outputs must be in [1, {total}] (the stream's length); got {num_outputs}")
    past = total - num_outputs
    return fft_conv_continue(stream[..., :past], stream[..., past:], kernel)[0]


def fft_conv_continue(
    history: torch.Tensor, u: torch.Tensor, kernel: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The outputs at ``u`` of the causal convolution of the stream ``[history ; u]`` with ``kernel``, by
    overlap-save, and that stream.

    A stream that continues from M earlier inputs (a window of history, then L new ones) needs only the outputs
    at the new ones. A circular convolution of ``n >= L + max(M, K − 1)`` points is exact there (the wrap-around
    lands only on the M discarded positions), against ``n >= M + L + K − 1`` for the whole linear convolution:
    L = K new tokens after an M = K − 1 history cost an FFT of 2K points, not 3K (what stateful evaluation of a
    long convolution pays per window), the size a zero-state forward of the L tokens already pays. The stream is
    written once, straight into the zero-padded n-point FFT input, so the history costs one read, no extra pass.

    Args: history (..., H, M), M >= 0; u (..., H, L), L >= 1; kernel (H, K).
    Returns: ``(y, stream)``: y (..., H, L) float32 (torch.fft); stream (..., H, M + L) float32, a view of the FFT
    input (callers take their next window from it).
    """
    check_conv_args(u, kernel, None)
    if history.shape[:-1] != u.shape[:-1]:
        raise ValueError(f"history must have shape {(*u.shape[:-1], 'M')}; got {tuple(history.shape)}")
    past, seq_len = history.shape[-1], u.shape[-1]
    kernel = kernel[:, : past + seq_len]
    n = smooth_fft_size(seq_len + max(past, kernel.shape[-1] - 1))  # >= M + L: the padding is n − M − L zeros
    zeros = u.new_zeros(*u.shape[:-1], n - past - seq_len, dtype=torch.float32)
    padded = torch.cat([history.float(), u.float(), zeros], dim=-1)  # (..., H, n)
    y = _CirculantConv.apply(padded, conv_circulant(kernel, None, n))[..., past : past + seq_len]
    return y, padded[..., : past + seq_len]


class _CirculantConv(torch.autograd.Function):
    """``y = (circulant ⊛ pad_n(u))[..., :L]`` by real FFTs, with a backward made of real FFTs too.

    Forward (seed paper §A.1): ``y = irfft(rfft(u, n) · C)[..., :L]`` with ``C = rfft(c)``.
    Backward, with ``G = rfft(grad_y, n)`` (``grad_y`` zero-padded to n):

    - ``grad_u = irfft(G · conj(C))[..., :L]``: the circular cross-correlation ``Σ_k grad_y[k] c[k − j]``;
    - ``grad_c = irfft(Σ_batch G · conj(U))``: ``Σ_k grad_y[k] u[k − m]``, summed over the batch *before*
      the inverse FFT, which is then one (H, n) transform.

    Autograd through ``torch.fft.rfft`` computes the same gradient with a complex FFT of the full
    length over a zero-filled spectrum, twice the work of a real one; this backward costs two
    batch-sized real FFTs (``G`` and ``grad_u``). Both are exact for ``n >= L + K − 1`` (no wrap-around).
    """

    @staticmethod
    def forward(ctx, u: torch.Tensor, circulant: torch.Tensor) -> torch.Tensor:
        seq_len, n = u.shape[-1], circulant.shape[-1]
        u_f = torch.fft.rfft(u, n=n)  # (..., H, n//2 + 1)
        kernel_f = torch.fft.rfft(circulant, n=n)  # (H, n//2 + 1)
        ctx.save_for_backward(u_f, kernel_f)
        ctx.seq_len, ctx.n = seq_len, n
        return torch.fft.irfft(u_f * kernel_f, n=n)[..., :seq_len]  # (..., H, L)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y: torch.Tensor):
        u_f, kernel_f = ctx.saved_tensors
        n = ctx.n
        grad_f = torch.fft.rfft(grad_y, n=n)  # (..., H, n//2 + 1)
        grad_u = grad_circulant = None
        if ctx.needs_input_grad[0]:
            grad_u = torch.fft.irfft(grad_f * kernel_f.conj(), n=n)[..., : ctx.seq_len]  # (..., H, L)
        if ctx.needs_input_grad[1]:
            heads, bins = kernel_f.shape
            spectrum = (grad_f * u_f.conj()).reshape(-1, heads, bins).sum(0)  # (H, n//2 + 1)
            grad_circulant = torch.fft.irfft(spectrum, n=n)  # (H, n)
        return grad_u, grad_circulant


def fft_conv_ref(
    u: torch.Tensor,
    kernel: torch.Tensor,
    kernel_backward: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference for :func:`fft_conv`: dense Toeplitz matrix times ``u`` (O(L^2) memory and time)."""
    check_conv_args(u, kernel, kernel_backward)
    seq_len = u.shape[-1]
    pos = torch.arange(seq_len, device=u.device)
    lag = pos[:, None] - pos[None, :]  # (L, L): output index k minus input index j

    def toeplitz(taps: torch.Tensor, offsets: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        padded = torch.zeros(taps.shape[0], seq_len, dtype=taps.dtype, device=taps.device)
        padded[:, : min(seq_len, taps.shape[-1])] = taps[:, :seq_len]
        return torch.where(valid, padded[:, offsets.clamp(0, seq_len - 1)], 0.0)  # (H, L, L)

    matrix = toeplitz(kernel.double(), lag, lag >= 0)
    if kernel_backward is not None:
        matrix = matrix + toeplitz(kernel_backward.double(), -lag - 1, lag < 0)
    y = torch.einsum("hkj,...hj->...hk", matrix, u.double())
    return y.to(u.dtype)
