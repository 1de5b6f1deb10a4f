"""Regularized long convolutions, long-conv paper §3.1 and Algorithm 1 (Fu et al. 2023, arXiv 2302.06646).

A long-convolution layer learns its kernel ``K ∈ R^{H×N}`` directly, one tap per position. Unregularized
kernels are noisy and fit poorly (LRA: −17.1 points), so the kernel is regularized before use:

- **Squash** (:func:`squash_kernel`): ``K̄ = sign(K) ⊙ max(|K| − λ, 0)``, soft-thresholding, one L1
  proximal step. Safari: ``relu(|k| - lam) * sign(k)``.
- **Smooth** (:func:`smooth_kernel`): average pooling of width ``2p+1`` along the taps. The paper prints
  ``K̄_k = (2p+1)⁻¹ Σ_{j=1}^{2p+1} K_{k+j−p}`` (§3.1), whose indices run from ``k−p+1`` to ``k+p+1`` (off
  by one); we implement the centred window ``k−p … k+p`` of safari's
  ``nn.AvgPool1d(2p+1, stride=1, padding=p)`` (``count_include_pad=True``): taps beyond either end are
  zeros and the sum is still divided by ``2p+1``.
- **Smooth, Freq** (:func:`smooth_kernel_frequency`, App. B.1): rfft → smooth → irfft. Safari filters
  the spectrum with a depthwise 'same' convolution whose taps are the *unnormalized* Gaussian
  ``exp(−½(i − p)²)``, ``i = 0 … 2p``; we do the same and invert with ``irfft(n=N)`` (safari's
  default ``n`` drops a tap for odd N).
- Kernel dropout: elementwise dropout of the kernel weights (training only).

Order (:func:`regularize_kernel`): Algorithm 1 applies dropout → smooth → squash (:data:`PAPER_ORDER`,
the default); safari's ``LongConvKernel.forward`` applies smooth → squash → dropout
(:data:`CODE_ORDER`). Either order, or any subset, can be asked for.

Initializations (§3.1): :func:`random_init` (``K ~ 𝒩``, the paper gives no scale; safari uses
``0.002·randn``) and :func:`geometric_decay_init` (``K^{(h)}_k = x·exp(−k N⁻¹ (H/2)^{h/H})``, x ~ 𝒩; the
paper gives no scale; safari's ``double_exp`` uses ``0.02·randn`` and 0-indexed ``h, k`` with
``⌊H/2⌋``).

The convolution itself (:func:`causal_conv`, :func:`causal_conv_step`) is the causal FFT convolution of
:mod:`ssmhub.ops.fftconv` plus the skip ``D ⊙ u`` of Algorithm 1 step 4, with the ssmhub state contract:
the state is the window of the last M inputs, so a prefill hands over to step-by-step decoding, each
step costing O(H·M).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .fftconv import fft_conv, fft_conv_continue
from .precision import float32_math

__all__ = [
    "CODE_ORDER",
    "DIRECT_TAIL_MAX",
    "GEOMETRIC_CONVENTIONS",
    "PAPER_ORDER",
    "REGULARIZERS",
    "SMOOTH_DOMAINS",
    "causal_conv",
    "causal_conv_ref",
    "causal_conv_step",
    "direct_conv_tail",
    "geometric_decay_init",
    "random_init",
    "regularize_kernel",
    "smooth_kernel",
    "smooth_kernel_frequency",
    "squash_kernel",
]

REGULARIZERS = ("dropout", "smooth", "squash")
PAPER_ORDER = ("dropout", "smooth", "squash")  # Algorithm 1, lines 1-3
CODE_ORDER = ("smooth", "squash", "dropout")  # safari long_conv_kernel.py::LongConvKernel.forward
SMOOTH_DOMAINS = ("time", "frequency")
GEOMETRIC_CONVENTIONS = ("paper", "code")


# ----------------------------------------------------------------------------- validation
def _check_kernel(k: torch.Tensor, name: str = "k") -> None:
    if not isinstance(k, torch.Tensor) or k.dim() < 1:
        raise ValueError(f"{name} must be a tensor of shape (..., L); got {type(k).__name__}")
    if k.shape[-1] < 1:
        raise ValueError(f"{name} must have kernel length >= 1; got shape {tuple(k.shape)}")


def _check_width(width_p: int, name: str = "width_p") -> None:
    if isinstance(width_p, bool) or not isinstance(width_p, int) or width_p < 0:
        raise ValueError(f"{name} (the half-width p of the 2p+1 window) must be an integer >= 0; got {width_p!r}")


def _check_lambda(lam: float, name: str = "lam") -> None:
    if not isinstance(lam, (int, float)) or isinstance(lam, bool) or not math.isfinite(lam) or lam < 0:
        raise ValueError(f"{name} (the Squash threshold λ) must be a finite number >= 0; got {lam!r}")


def _check_dropout(p: float, name: str = "dropout") -> None:
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p < 1.0:
        raise ValueError(f"{name} must be in [0, 1); got {p!r}")


def _check_size(value: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1; got {value!r}")


# ----------------------------------------------------------------------------- regularizers
def squash_kernel(k: torch.Tensor, lam: float) -> torch.Tensor:
    """Squash, §3.1: ``sign(k) ⊙ max(|k| − λ, 0)`` entrywise (soft-thresholding). ``lam = 0`` is the identity."""
    _check_kernel(k)
    _check_lambda(lam)
    if lam == 0:
        return k
    return torch.sign(k) * F.relu(k.abs() - lam)


def smooth_kernel(k: torch.Tensor, width_p: int) -> torch.Tensor:
    """Smooth, §3.1: centred moving average of width ``2p+1`` along the last axis, same length.

    ``out[..., t] = (2p+1)⁻¹ Σ_{s=t−p}^{t+p} k[..., s]`` with ``k[..., s] = 0`` outside ``0 ≤ s < L``: the
    ends are zero-padded and still divided by ``2p+1``, exactly safari's
    ``nn.AvgPool1d(2p+1, stride=1, padding=p)`` (``count_include_pad=True``), so the first and last
    ``p`` taps shrink towards zero. ``width_p = 0`` is the identity.

    Args:
        k: (..., L) kernel, L >= 1.
        width_p: p >= 0 (safari's ``ma_window_len = 7`` is p = 3).
    """
    _check_kernel(k)
    _check_width(width_p)
    if width_p == 0:
        return k
    shape = k.shape
    flat = k.reshape(-1, 1, shape[-1])  # (B·H, 1, L)
    # avg_pool1d needs padding <= kernel_size // 2 = p: always true here
    out = F.avg_pool1d(flat, kernel_size=2 * width_p + 1, stride=1, padding=width_p, count_include_pad=True)
    return out.reshape(shape)


def _gaussian_taps(width_p: int, dtype: torch.dtype, device) -> torch.Tensor:
    i = torch.arange(2 * width_p + 1, dtype=dtype, device=device)
    return torch.exp(-0.5 * (i - width_p) ** 2)  # unnormalized, as in safari (peak 1 at the centre)


def smooth_kernel_frequency(k: torch.Tensor, width_p: int) -> torch.Tensor:
    """Smooth, Freq (App. B.1): ``irfft(G ∗ rfft(k), n=L)`` with G the unnormalized Gaussian of width 2p+1.

    ``G_i = exp(−½ (i − p)²)``, ``i = 0 … 2p``, applied as a centred ('same') convolution over the rfft
    bins with zero padding beyond the first and last bin (safari's ``F.conv1d(..., padding="same")``).
    ``width_p = 0`` is the identity (G = [1]).
    """
    _check_kernel(k)
    _check_width(width_p)
    if width_p == 0:
        return k
    length = k.shape[-1]
    shape = k.shape
    spectrum = torch.fft.rfft(k.reshape(-1, length), dim=-1)  # (B·H, L//2 + 1) complex
    parts = torch.view_as_real(spectrum).permute(0, 2, 1).reshape(-1, 1, spectrum.shape[-1])  # (B·H·2, 1, F)
    taps = _gaussian_taps(width_p, parts.dtype, parts.device).view(1, 1, -1)
    smoothed = F.conv1d(parts, taps, padding=width_p)  # symmetric taps: correlation == convolution
    smoothed = smoothed.reshape(-1, 2, spectrum.shape[-1]).permute(0, 2, 1).contiguous()
    out = torch.fft.irfft(torch.view_as_complex(smoothed), n=length, dim=-1)
    return out.reshape(shape)


def regularize_kernel(
    k: torch.Tensor,
    order: tuple[str, ...] | list[str] = PAPER_ORDER,
    *,
    squash_lambda: float = 0.0,
    smooth_width: int = 0,
    smooth_domain: str = "time",
    dropout: float = 0.0,
    training: bool = False,
) -> torch.Tensor:
    """Apply the regularizers named in ``order``, in that order (Algorithm 1 by default).

    Args:
        k: (..., L) kernel.
        order: a sequence of distinct names from :data:`REGULARIZERS`. :data:`PAPER_ORDER` (Algorithm 1:
            dropout, smooth, squash) or :data:`CODE_ORDER` (safari: smooth, squash, dropout). A name left
            out is not applied; a regularizer whose strength is 0 is the identity anyway.
        squash_lambda: λ >= 0 of :func:`squash_kernel`.
        smooth_width: p >= 0 of :func:`smooth_kernel` (window 2p+1).
        smooth_domain: ``"time"`` (§3.1) or ``"frequency"`` (App. B.1, :func:`smooth_kernel_frequency`).
        dropout: elementwise kernel-dropout probability in [0, 1), applied only when ``training``.
        training: whether dropout is active.
    """
    _check_kernel(k)
    _check_lambda(squash_lambda, "squash_lambda")
    _check_width(smooth_width, "smooth_width")
    _check_dropout(dropout)
    if smooth_domain not in SMOOTH_DOMAINS:
        raise ValueError(f"smooth_domain must be one of {SMOOTH_DOMAINS}; got {smooth_domain!r}")
    order = tuple(order)
    unknown = [name for name in order if name not in REGULARIZERS]
    if unknown or len(set(order)) != len(order):
        raise ValueError(f"order must list distinct names from {REGULARIZERS}; got {order!r}")
    smooth = smooth_kernel if smooth_domain == "time" else smooth_kernel_frequency
    for name in order:
        if name == "dropout":
            if training and dropout > 0:
                k = F.dropout(k, p=dropout, training=True)
        elif name == "smooth":
            k = smooth(k, smooth_width)
        else:
            k = squash_kernel(k, squash_lambda)
    return k


# ----------------------------------------------------------------------------- initializations
def random_init(
    num_channels: int,
    length: int,
    std: float = 0.002,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Random init, §3.1: ``K_i ~ 𝒩(0, std²)``, shape (H, L). The paper gives no scale; ``std = 0.002`` is
    safari's ``randn * 0.002``."""
    _check_size(num_channels, "num_channels")
    _check_size(length, "length")
    return torch.randn(num_channels, length, generator=generator, dtype=dtype) * std


def geometric_decay_init(
    num_channels: int,
    length: int,
    std: float = 0.02,
    convention: str = "paper",
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Geometric decay init ("Exp"/"Geom" in the tables), §3.1, shape (H, N) with H = num_channels, N = length.

    ``convention="paper"``: ``K[h−1, k−1] = x·exp(−k N⁻¹ (H/2)^{h/H})`` for 1 ≤ k ≤ N, 1 ≤ h ≤ H.
    ``convention="code"`` (safari ``double_exp``): ``K[i, j] = x·exp(−(j/N) ⌊H/2⌋^{i/H})``, 0-indexed
    (so tap 0 is undecayed, and ``⌊H/2⌋^0 = 1`` even for H = 1).
    ``x ~ 𝒩(0, std²)`` elementwise; the paper gives no scale, ``std = 0.02`` is safari's.
    Each channel h decays at its own rate ``(H/2)^{h/H}`` per sequence length: from about 1 (slow,
    long memory) to H/2 (fast, local).
    """
    _check_size(num_channels, "num_channels")
    _check_size(length, "length")
    if convention not in GEOMETRIC_CONVENTIONS:
        raise ValueError(f"convention must be one of {GEOMETRIC_CONVENTIONS}; got {convention!r}")
    x = torch.randn(num_channels, length, generator=generator, dtype=torch.float64) * std
    if convention == "paper":
        h = torch.arange(1, num_channels + 1, dtype=torch.float64)
        k = torch.arange(1, length + 1, dtype=torch.float64)
        base = torch.tensor(num_channels / 2, dtype=torch.float64)
    else:
        h = torch.arange(num_channels, dtype=torch.float64)
        k = torch.arange(length, dtype=torch.float64)
        base = torch.tensor(float(num_channels // 2), dtype=torch.float64)
    rate = base ** (h / num_channels)  # (H,)
    decay = torch.exp(-(k / length)[None, :] * rate[:, None])  # (H, N)
    return (x * decay).to(dtype)


# ----------------------------------------------------------------------------- convolution with state
def _check_conv(u: torch.Tensor, kernel: torch.Tensor, skip: torch.Tensor | None, state: torch.Tensor | None) -> None:
    if u.dim() < 2:
        raise ValueError(f"u must have shape (..., H, L); got {tuple(u.shape)}")
    channels = u.shape[-2]
    if kernel.dim() != 2 or kernel.shape[0] != channels or kernel.shape[-1] < 1:
        raise ValueError(f"kernel must have shape (H, K) with H = {channels}, K >= 1; got {tuple(kernel.shape)}")
    if skip is not None and skip.shape != (channels,):
        raise ValueError(f"skip must have shape ({channels},); got {tuple(skip.shape)}")
    if state is not None and (state.dim() != u.dim() or state.shape[:-1] != u.shape[:-1]):
        raise ValueError(f"initial_state must have shape {(*u.shape[:-1], 'M')}; got {tuple(state.shape)}")


@float32_math
def causal_conv(
    u: torch.Tensor,
    kernel: torch.Tensor,
    skip: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
    state_length: int | None = None,
    backend: str = "torch",
    block_size: int = 16,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Causal long convolution with skip, Algorithm 1 step 4, continuing from a window of past inputs.

    ``y[..., h, t] = Σ_j kernel[h, j] · w[..., h, t − j] + skip[h] · u[..., h, t]`` where ``w`` is the
    input stream: the state's M past inputs (oldest first, zeros if no state) followed by ``u``. Inputs
    before the window count as zero, so the result is exact when ``kernel`` has no taps beyond index M.

    Args:
        u: (..., H, L) new inputs.
        kernel: (H, K) taps; shorter than needed = zero beyond K.
        skip: optional (H,) ``D``.
        initial_state: optional (..., H, M) window of the last M inputs before ``u``.
        return_final_state: also return the window of the last M inputs after ``u``.
        state_length: M when no ``initial_state`` is given (required then, with ``return_final_state``).
        backend, block_size: who computes the FFT convolution (``"torch"``, ``"butterfly"`` for
            FlashButterfly's Butterfly matmuls with block size r = ``block_size``, ``"triton"``, ``"auto"``),
            see :func:`ssmhub.ops.fftconv.fft_conv`; the same numbers either way.

    Returns:
        ``(y, final_state)``: y (..., H, L) float32; final_state (..., H, M) float32 or None.
    """
    _check_conv(u, kernel, skip, initial_state)
    u = u.float()
    if initial_state is not None:
        history = initial_state.float()
    else:
        if return_final_state and state_length is None:
            raise ValueError("state_length is required with return_final_state when there is no initial_state")
        history = None
    continued = history is not None and history.shape[-1] > 0
    if continued and backend == "torch" and u.shape[-1] > DIRECT_TAIL_MAX:
        y, stream = fft_conv_continue(history, u, kernel.float())  # (..., H, L) by overlap-save; (..., H, M + L)
    else:
        stream = None if history is None else torch.cat([history, u], dim=-1)  # (..., H, M + L)
        if continued and backend == "torch":
            y = direct_conv_tail(stream, kernel.float(), u.shape[-1])  # (..., H, L), a few new tokens
        elif continued:
            y = fft_conv(stream, kernel.float(), backend=backend, block_size=block_size)[..., history.shape[-1] :]
        else:
            y = fft_conv(u, kernel.float(), backend=backend, block_size=block_size)  # (..., H, L)
    if skip is not None:
        y = y + skip.float()[:, None] * u
    if not return_final_state:
        return y, None
    window = history.shape[-1] if history is not None else state_length
    if stream is None:  # no history: zeros before u, where u is shorter than the window
        missing = max(0, window - u.shape[-1])
        stream = torch.cat([u.new_zeros(*u.shape[:-1], missing), u], dim=-1) if missing else u
    final = stream[..., stream.shape[-1] - window :]  # (..., H, M); M = 0 gives an empty window
    return y, final.contiguous()


DIRECT_TAIL_MAX = 32  # new tokens up to which a continuation convolves directly (see direct_conv_tail)


def direct_conv_tail(stream: torch.Tensor, kernel: torch.Tensor, num_outputs: int) -> torch.Tensor:
    """The last ``num_outputs`` outputs of the causal convolution of ``stream`` with ``kernel``, directly: a
    depthwise ``conv1d`` over the last L + K' − 1 inputs (K' = the taps that reach them; zeros before the stream).

    For a continuation of a few tokens (a decode step's neighbours: assisted decoding's verification, its
    replay) this O(H·L·K') sum costs less than the FFT of ≥ M + L points :func:`fft_conv_tail` needs.

    Args: stream (..., H, M + L); kernel (H, K); num_outputs: L, 1 <= L <= M + L.
    Returns: (..., H, L) float32.
    """
    total, channels = stream.shape[-1], stream.shape[-2]
    if not 1 <= num_outputs <= total:
        raise ValueError(f"num_outputs must be in [1, {total}] (the stream's length); got {num_outputs}")
    taps = min(kernel.shape[-1], total)  # K': no output reaches further back than the stream's start
    needed = num_outputs + taps - 1
    window = stream.float()[..., max(0, total - needed) :]
    window = F.pad(window, (needed - window.shape[-1], 0))  # zeros before the stream, where K' > M + 1
    weight = kernel[:, :taps].float().flip(-1)[:, None, :]  # (H, 1, K'): conv1d correlates, so flip the taps
    y = F.conv1d(window.reshape(-1, channels, needed), weight, groups=channels)  # (N, H, L)
    return y.reshape(*stream.shape[:-1], num_outputs)


@float32_math
def causal_conv_step(
    u_t: torch.Tensor,
    state: torch.Tensor,
    kernel: torch.Tensor,
    skip: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of :func:`causal_conv`: O(H·M) work, no FFT.

    Args:
        u_t: (..., H) the new input. state: (..., H, M) the last M inputs, oldest first.
        kernel: (H, K) taps (only the first M + 1 are used). skip: optional (H,).

    Returns:
        ``(y_t (..., H) float32, new_state (..., H, M) float32)``.
    """
    window_len = state.shape[-1] + 1
    channels = u_t.shape[-1]
    if kernel.dim() != 2 or kernel.shape[0] != channels:
        raise ValueError(f"kernel must have shape (H, K) with H = {channels}; got {tuple(kernel.shape)}")
    if state.shape[:-1] != u_t.shape:
        raise ValueError(f"state must have shape {(*u_t.shape, 'M')}; got {tuple(state.shape)}")
    u_t = u_t.float()
    taps = kernel.float()[:, :window_len]
    if taps.shape[-1] < window_len:
        taps = F.pad(taps, (0, window_len - taps.shape[-1]))
    window = torch.cat([state.float(), u_t.unsqueeze(-1)], dim=-1)  # (..., H, M + 1), newest last
    y_t = (window * taps.flip(-1)).sum(-1)  # tap j meets the input j steps back
    if skip is not None:
        y_t = y_t + skip.float() * u_t
    return y_t, window[..., 1:].contiguous()


def causal_conv_ref(
    u: torch.Tensor,
    kernel: torch.Tensor,
    skip: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference for :func:`causal_conv`: a direct double loop in float64 (O(L·K) per channel)."""
    _check_conv(u, kernel, skip, initial_state)
    u = u.double()
    history = initial_state.double() if initial_state is not None else u[..., :0]
    stream = torch.cat([history, u], dim=-1)
    offset = history.shape[-1]
    kernel = kernel.double()
    y = torch.zeros_like(u)
    for t in range(u.shape[-1]):
        for j in range(min(kernel.shape[-1], offset + t + 1)):
            y[..., t] += kernel[:, j] * stream[..., offset + t - j]
    if skip is not None:
        y = y + skip.double()[:, None] * u
    return y
