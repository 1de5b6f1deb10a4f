"""The pieces every FFT-convolution backend shares: argument checks, FFT size, circulant, DFT blocks.

A causal long convolution is the product of a circulant matrix with the zero-padded input (DLR, arXiv
2212.00768, §A.1); every backend of :func:`ssmhub.ops.fftconv.fft_conv` (``torch.fft``, the Butterfly
matmuls of :mod:`ssmhub.ops.butterfly`, the fused kernel of :mod:`ssmhub.ops.triton`) checks the same
arguments, pads to the same power-of-two size and builds the same circulant column. The Butterfly
backends factor the DFT into r×r DFT blocks and twiddle factors (long-conv paper, arXiv 2302.06646,
§3.2 and App. C.1); both are built here once, in float64 and rounded once to complex64.

This module imports nothing from ssmhub: the backends import it, and the dispatcher imports the backends.
"""

from __future__ import annotations

import math

import torch

__all__ = ["check_conv_args", "conv_circulant", "dft_matrix", "fft_size", "twiddle_matrix"]


def check_conv_args(u: torch.Tensor, kernel: torch.Tensor, kernel_backward: torch.Tensor | None) -> None:
    """Raise a ValueError naming the argument unless ``u`` is (..., H, L) with L >= 1 and each kernel is
    (H, K) with K >= 1 (``kernel_backward`` may be None)."""
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


def fft_size(length: int) -> int:
    """Smallest power of two that is at least ``length``."""
    return 1 << max(0, (length - 1).bit_length())


def conv_circulant(kernel: torch.Tensor, kernel_backward: torch.Tensor | None, n: int) -> torch.Tensor:
    """First column (H, n) float32 of the size-n circulant whose product with a zero-padded input is the
    convolution: causal taps at 0 … K−1, anti-causal taps at the end, ``c[n − 1 − m] = kernel_backward[m]``.
    Both kernels must already be cut to the sequence (``n >= L + K − 1``)."""
    circulant = torch.zeros(kernel.shape[0], n, dtype=torch.float32, device=kernel.device)  # (H, n)
    circulant[:, : kernel.shape[-1]] = kernel.float()
    if kernel_backward is not None and kernel_backward.shape[-1] > 0:
        circulant[:, n - kernel_backward.shape[-1] :] = kernel_backward.float().flip(-1)
    return circulant


def dft_matrix(size: int, inverse: bool = False, device=None) -> torch.Tensor:
    """The (size, size) complex64 DFT block ``F[j, k] = exp(∓2πi·jk/size)`` (unnormalised; + for inverse), built on
    the CPU and moved to ``device`` (default: torch's default device)."""
    j = torch.arange(size, dtype=torch.int64, device="cpu")
    phase = (j[:, None] * j[None, :]) % size  # exact integer phase, then one float64 rounding
    angle = (2 * math.pi / size) * phase.double() * (1.0 if inverse else -1.0)
    return torch.polar(torch.ones_like(angle), angle).to(torch.complex64).to(device or torch.get_default_device())


def twiddle_matrix(block: int, rest: int, device=None) -> torch.Tensor:
    """(block, rest) complex64 twiddles ``T[k₁, n₂] = exp(−2πi·k₁n₂/(block·rest))``: the diagonal D between
    the two DFT factors of a size ``block·rest`` transform (long-conv paper App. C.1's M); built on the CPU and
    moved to ``device`` (default: torch's default device)."""
    size = block * rest
    phase = (torch.arange(block, device="cpu")[:, None] * torch.arange(rest, device="cpu")[None, :]) % size
    angle = (-2 * math.pi / size) * phase.double()
    return torch.polar(torch.ones_like(angle), angle).to(torch.complex64).to(device or torch.get_default_device())
