"""Long convolutions computed with the FFT, shared by every family.

Seed paper (DLR, arXiv 2212.00768) §A.1: a causal convolution is the product of a circulant matrix
with a zero-padded input, ``circulant(K) u = iFFT(FFT(K) * FFT(u))``. The FFT size must be at least
``L + kernel_length - 1``; anything shorter wraps the tail of the kernel around onto earlier
positions, which in a causal model leaks future tokens into the past.

Both functions compute in float32 even under autocast (half-precision FFTs lose the small kernel
taps that carry long-range information) and return the input's dtype.

The slow, obviously-correct references build the dense Toeplitz matrix and multiply: O(L^2).
"""

from __future__ import annotations

import torch

from .precision import float32_math

__all__ = ["fft_conv", "fft_conv_ref", "fft_size"]


def fft_size(length: int) -> int:
    """Smallest power of two that is at least ``length``."""
    return 1 << max(0, (length - 1).bit_length())


def _check_conv_args(u: torch.Tensor, kernel: torch.Tensor, kernel_backward: torch.Tensor | None) -> None:
    if u.dim() < 2:
        raise ValueError(f"u must have shape (..., H, L); got {tuple(u.shape)}")
    if u.shape[-1] == 0:
        raise ValueError("u has sequence length 0; a convolution needs at least one position")
    for name, k in (("kernel", kernel), ("kernel_backward", kernel_backward)):
        if k is None:
            continue
        if k.dim() != 2 or k.shape[0] != u.shape[-2]:
            raise ValueError(f"{name} must have shape (H, K) with H = {u.shape[-2]}; got {tuple(k.shape)}")
        if k.shape[-1] == 0:
            raise ValueError(f"{name} has length 0")


@float32_math
def fft_conv(
    u: torch.Tensor,
    kernel: torch.Tensor,
    kernel_backward: torch.Tensor | None = None,
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

    Returns:
        (..., H, L) in ``u.dtype``.
    """
    _check_conv_args(u, kernel, kernel_backward)
    seq_len = u.shape[-1]
    kernel = kernel[:, :seq_len]
    if kernel_backward is not None:
        kernel_backward = kernel_backward[:, : seq_len - 1]
    longest = max(kernel.shape[-1], 0 if kernel_backward is None else kernel_backward.shape[-1])
    n = fft_size(seq_len + longest)  # >= L + K - 1: no circular wrap-around onto real outputs

    circulant = torch.zeros(kernel.shape[0], n, dtype=torch.float32, device=u.device)  # (H, n)
    circulant[:, : kernel.shape[-1]] = kernel.float()
    if kernel_backward is not None and kernel_backward.shape[-1] > 0:
        # anti-causal taps sit at the end of the circulant's first column: c[n - 1 - m] = K<-[m]
        circulant[:, n - kernel_backward.shape[-1] :] = kernel_backward.float().flip(-1)
    kernel_f = torch.fft.rfft(circulant, n=n)  # (H, n//2 + 1)
    u_f = torch.fft.rfft(u.float(), n=n)  # (..., H, n//2 + 1)
    y = torch.fft.irfft(u_f * kernel_f, n=n)[..., :seq_len]  # (..., H, L)
    return y.to(u.dtype)


def fft_conv_ref(
    u: torch.Tensor,
    kernel: torch.Tensor,
    kernel_backward: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference for :func:`fft_conv`: dense Toeplitz matrix times ``u`` (O(L^2) memory and time)."""
    _check_conv_args(u, kernel, kernel_backward)
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
