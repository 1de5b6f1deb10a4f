"""The fused FlashButterfly convolution as a Triton kernel (long-conv paper §3.2, "kernel fusion").

:func:`triton_conv` computes ``fft_conv(u, kernel, kernel_backward) + skip ⊙ u`` in one kernel per pair of
rows and head: load (zero padding past L), forward FFT as two Butterfly matmul rounds, pointwise product
with the kernel's spectrum, inverse FFT, skip term, store; the whole FFT of size N = N1·N2 stays on chip
(see :mod:`ssmhub.ops.triton._kernels`). The backward pass is custom: ``du`` is the same fused kernel with
the conjugate spectrum (the adjoint of a convolution is a correlation) plus ``skip ⊙ dy``; the circulant's
gradient comes from a second kernel that accumulates ``conj(FFT(u))·FFT(dy)`` over the batch (``dskip`` is
a plain ``Σ u·dy``).

Sizes: the FFT size is ``max(256, fft_size(L + K − 1))`` up to :data:`MAX_FFT_SIZE` (a 64×64 tile; the
paper's A100 kernel held up to 8K in SRAM; this limit is not tuned on a GPU). Longer sequences are the
three-pass algorithm's job (:func:`ssmhub.ops.butterfly.butterfly_conv`); ``fft_conv(backend="triton")``
hands them on with a one-time warning.

Where it runs: CUDA tensors, or CPU tensors when the environment has ``TRITON_INTERPRET=1`` before the
first Triton call (the kernels are decorated, interpreted or compiled, when :mod:`._kernels` is first
imported; the interpreter runs the same kernel code with numpy: that is how the tests check it on a
CPU-only machine). Triton itself is optional: without it :func:`can_run` says so and
``fft_conv`` falls back.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os
import sys

import torch

from ..circulant import check_conv_args, conv_circulant, dft_matrix, fft_size, twiddle_matrix
from ..precision import float32_math

__all__ = [
    "MAX_FFT_SIZE",
    "MIN_FFT_SIZE",
    "can_run",
    "interpreting",
    "kernel_support",
    "kernels_installed",
    "launch_device",
    "pick_triton",
    "triton_available",
    "triton_conv",
]

MIN_FFT_SIZE = 256  # 16 × 16: tl.dot needs tiles of at least 16 (a shorter FFT is padded: still exact)
MAX_FFT_SIZE = 4096  # 64 × 64 complex tile per program


@functools.cache
def triton_available() -> bool:
    """True when the ``triton`` package can be imported."""
    return importlib.util.find_spec("triton") is not None


def interpreting(kernels_module: str) -> bool:
    """Whether the kernels of ``kernels_module`` run (or will run, once imported) in Triton's CPU interpreter."""
    kernels = sys.modules.get(kernels_module)
    if kernels is not None:
        return kernels.INTERPRETED
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


@functools.cache
def kernels_installed(kernels_module: str) -> bool:
    """True when ``kernels_module`` can be imported: not from a model folder's flattened remote code, which
    has no copy of the kernels (a caller then falls back to its torch path instead of failing)."""
    try:
        return importlib.util.find_spec(kernels_module) is not None
    except ImportError:  # the ssmhub package itself is not installed
        return False


def kernel_support(kernels_module: str, device: torch.device | str) -> tuple[bool, str]:
    """Whether the Triton kernels of ``kernels_module`` can run on ``device``: ``(True, "")`` or
    ``(False, "key: why")``. Every Triton op of ssmhub asks this first, then adds its own size limits."""
    device = torch.device(device)
    if not triton_available():
        return False, "triton unavailable: the triton package is not installed"
    if not kernels_installed(kernels_module):
        return False, "kernels unavailable: the Triton kernels come with the installed ssmhub package"
    if device.type == "cpu" and not interpreting(kernels_module):
        return False, "cpu: Triton runs CPU tensors only with TRITON_INTERPRET=1 set before the first import"
    if device.type not in ("cpu", "cuda"):
        return False, f"device: no Triton kernel for {device.type} tensors"
    return True, ""


def pick_triton(choice: str, tensor: torch.Tensor, support, fallback: str, option: str) -> str:
    """The scan a layer option ``choice`` runs on ``tensor``: ``"auto"`` is ``"triton"`` on CUDA tensors that are
    not float64 (the kernels compute in float32) where ``support()`` (a ``kernel_support``-style check) allows it,
    else ``fallback``; ``"triton"`` raises a ValueError naming ``option`` where it cannot run; anything else is
    itself."""
    if choice == "auto":
        usable = tensor.is_cuda and tensor.dtype != torch.float64 and support()[0]
        return "triton" if usable else fallback
    if choice == "triton":
        usable, reason = support()
        if not usable:
            raise ValueError(f"{option}='triton' cannot run here ({reason}); use scan='auto'")
    return choice


def launch_device(t: torch.Tensor):
    """A context that makes ``t``'s GPU current (Triton launches on the current CUDA device); a no-op on CPU."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


KERNELS_MODULE = "ssmhub.ops.triton._kernels"  # by absolute name: a remote-code bundle does not carry it


def can_run(device: torch.device, n: int) -> tuple[bool, str]:
    """Whether :func:`triton_conv` can take an FFT of size ``n`` on ``device``; if not, ``"key: why"``."""
    usable, reason = kernel_support(KERNELS_MODULE, device)
    if usable and n > MAX_FFT_SIZE:
        return False, f"fft size: FFT size {n} exceeds the fused kernel's on-chip limit {MAX_FFT_SIZE}"
    return usable, reason


def _split(n: int) -> tuple[int, int]:
    """n = N1·N2 with N1 <= N2 powers of two (the Butterfly decomposition's two factors)."""
    n1 = 1 << (int(math.log2(n)) // 2)
    return n1, n // n1


@functools.lru_cache(maxsize=32)
def _tables(n1: int, n2: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """F_{N1}, F_{N2} and the (N1, N2) twiddles T[k1, n2] = ω_N^{k1·n2}, as float32 (real, imag) pairs."""
    out = []
    with torch.inference_mode(False):  # cached: must not be inference tensors (see butterfly._plan_cached)
        for matrix in (dft_matrix(n1), dft_matrix(n2), twiddle_matrix(n1, n2, "cpu")):
            out += [matrix.real.contiguous().to(device), matrix.imag.contiguous().to(device)]
    return tuple(out)


def _load_kernels():
    return importlib.import_module(KERNELS_MODULE)


def _launch_spectrum(circulant: torch.Tensor, n1: int, n2: int) -> tuple[torch.Tensor, torch.Tensor]:
    heads = circulant.shape[0]
    spec_r = torch.empty(heads, n1, n2, dtype=torch.float32, device=circulant.device)
    spec_i = torch.empty_like(spec_r)
    _load_kernels().spectrum_kernel[(heads,)](
        circulant, spec_r, spec_i, *_tables(n1, n2, circulant.device), N1=n1, N2=n2
    )
    return spec_r, spec_i


def _launch_conv(u, spec_r, spec_i, skip, n1, n2) -> torch.Tensor:
    rows, heads, length = u.shape
    y = torch.empty_like(u)
    _load_kernels().conv_kernel[((rows + 1) // 2, heads)](
        u,
        y,
        spec_r,
        spec_i,
        u if skip is None else skip,  # a dummy pointer when HAS_SKIP is off
        *_tables(n1, n2, u.device),
        rows,
        heads,
        length,
        HAS_SKIP=skip is not None,
        N1=n1,
        N2=n2,
    )
    return y


class _FusedConv(torch.autograd.Function):
    """y = conv(u, circulant) + skip ⊙ u on (rows, H, L) float32, forward and backward by the fused kernels."""

    @staticmethod
    def forward(ctx, u, circulant, skip):
        n1, n2 = _split(circulant.shape[-1])
        spec_r, spec_i = _launch_spectrum(circulant, n1, n2)
        ctx.save_for_backward(u, spec_r, spec_i, skip)
        ctx.split = (n1, n2)
        return _launch_conv(u, spec_r, spec_i, skip, n1, n2)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y):
        u, spec_r, spec_i, skip = ctx.saved_tensors
        n1, n2 = ctx.split
        grad_y = grad_y.contiguous()
        grad_u = grad_c = grad_skip = None
        if ctx.needs_input_grad[0]:  # adjoint: correlation = product with the conjugate spectrum, + skip·dy
            grad_u = _launch_conv(grad_y, spec_r, -spec_i, skip, n1, n2)
        if ctx.needs_input_grad[1]:
            rows, heads, length = u.shape
            grad_c = torch.empty(heads, n1 * n2, dtype=torch.float32, device=u.device)
            _load_kernels().kernel_grad_kernel[(heads,)](
                u, grad_y, grad_c, *_tables(n1, n2, u.device), rows, heads, length, N1=n1, N2=n2
            )
        if skip is not None and ctx.needs_input_grad[2]:
            grad_skip = (u * grad_y).sum(dim=(0, 2))  # (H,)
        return grad_u, grad_c, grad_skip


@float32_math
def triton_conv(
    u: torch.Tensor,
    kernel: torch.Tensor,
    kernel_backward: torch.Tensor | None = None,
    skip: torch.Tensor | None = None,
) -> torch.Tensor:
    """``fft_conv(u, kernel, kernel_backward) + skip ⊙ u`` by the fused Triton kernel (same semantics, float32).

    Args:
        u: (…, H, L). kernel: (H, K) causal taps. kernel_backward: optional (H, K') anti-causal taps.
        skip: optional (H,) ``D`` of Algorithm 1 step 4.

    Returns:
        (…, H, L) in ``u.dtype``. Raises ValueError when the FFT size exceeds :data:`MAX_FFT_SIZE` or the
        device cannot run Triton (``fft_conv(backend="triton")`` falls back instead).
    """
    check_conv_args(u, kernel, kernel_backward)
    heads, seq_len = u.shape[-2], u.shape[-1]
    if skip is not None and tuple(skip.shape) != (heads,):
        raise ValueError(f"skip must have shape ({heads},); got {tuple(skip.shape)}")
    kernel = kernel[:, :seq_len]
    if kernel_backward is not None:
        kernel_backward = kernel_backward[:, : seq_len - 1]
    longest = max(kernel.shape[-1], 0 if kernel_backward is None else kernel_backward.shape[-1])
    n = max(MIN_FFT_SIZE, fft_size(seq_len + longest))
    usable, reason = can_run(u.device, n)
    if not usable:
        raise ValueError(f"triton_conv cannot run this call: {reason}")
    circulant = conv_circulant(kernel, kernel_backward, n)  # (H, n)
    rows = u.float().reshape(-1, heads, seq_len).contiguous()  # (B·…, H, L)
    y = _FusedConv.apply(rows, circulant, None if skip is None else skip.float().contiguous())
    return y.reshape(u.shape).to(u.dtype)
