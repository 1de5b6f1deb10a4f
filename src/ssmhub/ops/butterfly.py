"""FlashButterfly: the FFT convolution written as Butterfly (Monarch) matrix products.

Long-conv paper (Fu et al. 2023, arXiv 2302.06646) §3.2 and Appendices C-D.

**Butterfly decomposition (§3.2, App. C.1).** For ``N = N₁N₂`` the N-point DFT factors as

    ``F_N = P (I_{N₂} ⊗ F_{N₁}) Pᵀ D (I_{N₁} ⊗ F_{N₂}) P``,

P the reshape-to-(N₁, N₂)-and-transpose permutation, D the diagonal of twiddle factors
``M_{j,k} = exp(−2πi·jk/N)``. Applied recursively with N₁ = r (the *block size*) the whole DFT becomes
``log N / log r`` rounds of batched r×r matmuls, each followed by an elementwise twiddle: O(N r log N / log r)
FLOPs, all in matrix multiplications (Tensor Cores on a GPU; MKL's batched complex GEMM here). No
``torch.fft`` call is made anywhere in this module.

We run the recursion in *decimation-in-frequency* order (Gentleman–Sande). For a size ``N_s = f·R`` stage
(``f`` the block, ``R`` the rest) the input index is ``n = R·n₁ + n₂`` and the output index ``k = k₁ + f·k₂``:

    ``X[k₁ + f k₂] = Σ_{n₂} ω_R^{n₂k₂} · [ω_{N_s}^{n₂k₁} · Σ_{n₁} ω_f^{n₁k₁} x[R n₁ + n₂]]``

so a stage is: view the signal as (…, a, f, R), multiply by the f×f DFT block along the f axis (the
``I ⊗ F_f ⊗ I`` factor), multiply by the (f, R) twiddle matrix (D), and recurse on the last axis. No
permutation is ever materialised: the spectrum comes out in mixed-radix *digit-reversed* order
(:attr:`ButterflyPlan.natural_index`), which is all a convolution needs, because the pointwise product
with the kernel's spectrum (in the same order) does not care, and the inverse, run as the stages in reverse
(conjugate blocks, conjugate twiddles: F_f⁻¹ = F̄_f / f), takes digit-reversed input back to natural order.
:func:`butterfly_fft` adds the one final permutation for callers who want the natural order.

**Real input (App. C.2).** A real length-n signal is viewed as a complex signal of length M = n/2
(``z[j] = x[2j] + i·x[2j+1]``, a free ``view_as_complex``), transformed, and untangled with the partner
bin ``Z[(M − k) mod M]``: ``X[k] = E[k] − Q[k]`` with ``E = ½(Z[k] + Z̄[M−k])`` and
``Q = ½·i·ω_n^k·(Z[k] − Z̄[M−k])``. In the convolution the untangle, the product with the kernel's
spectrum and the re-tangle for the inverse fold into one elementwise step, ``Z_y = Z·γ + Z̄[M−k]·δ``,
with γ, δ computed once from the kernel (:func:`butterfly_kernel_spectrum`). So a real convolution of FFT
size n costs two complex Butterfly transforms of size n/2.

**Three-pass algorithm (§3.2, Algorithm 2, App. D.1).** A fused kernel keeps a whole sequence on chip
only up to some length l (8K on an A100). Longer sequences split as ``N = m·l``: pass 1 is a Butterfly
matrix ``B`` whose m×m blocks are *diagonal* l×l matrices (it mixes the elements ``u[j·l + τ]``,
``j = 0 … m−1``, that share an offset τ: one read and one write of u); pass 2 is m independent size-l FFT
convolutions, one per contiguous chunk; pass 3 applies the inverse Butterfly matrix. In the
decimation-in-frequency order above this is exactly the first stages (the factors of m, with twiddles of
the full size N: they compose to the paper's ``B`` with ``D_{k,j}[τ] = exp(−2πi·k(jl+τ)/N)``) followed by
the stages of the factors of l, which stay inside each chunk. :func:`butterfly_conv` with
``chunk_size=l`` runs it in that shape (:class:`ButterflyPlan` ``outer_stages``); the paper's scale factors
(``N·P⁻¹(I_m ⊗ lF_l)B̄⁻¹``) are replaced by the single 1/M of the inverse, checked numerically against
``torch.fft`` in the tests. The real-input untangle pairs bin k with M − k, which lies in chunk
``(m − k₁) mod m``: on a GPU each SM of pass 2 would hold a chunk pair, not a single chunk.

**Learned Butterfly (§3.2.1).** Every function here accepts, per transform, per-head blocks in place of the
fixed DFT blocks (:class:`ButterflyBlocks`, initialised by :func:`dft_blocks`): the r×r matrices become
parameters, the twiddles stay fixed, the FLOPs are unchanged, and at initialisation the result is the FFT
convolution. The nn.Module that owns them is :class:`ssmhub.layers.longconv.LearnedButterflyConv`.

Everything runs in float32 / complex64 with autocast disabled (:func:`~ssmhub.ops.precision.float32_math`),
twiddles and DFT blocks computed in float64 and rounded once.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .circulant import check_conv_args, conv_circulant, dft_matrix, fft_size, twiddle_matrix
from .precision import float32_math

__all__ = [
    "BLOCK_SIZES",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_CHUNK_SIZE",
    "TRANSFORMS",
    "ButterflyBlocks",
    "ButterflyPlan",
    "butterfly_conv",
    "butterfly_factors",
    "butterfly_fft",
    "butterfly_ifft",
    "butterfly_irfft",
    "butterfly_kernel_spectrum",
    "butterfly_plan",
    "butterfly_rfft",
    "check_block_size",
    "dft_blocks",
    "dft_matrix",
    "is_power_of_two",
]

BLOCK_SIZES = (2, 4, 8, 16, 32, 64, 128, 256)  # the paper's Table 3 sweep (r = 2 ... 256)
DEFAULT_BLOCK_SIZE = 16  # one 16×16 Tensor Core MMA tile (§3.2)
DEFAULT_CHUNK_SIZE = 8192  # l, real samples: "length 8K or shorter on A100" fits in SRAM (§3.2)
TRANSFORMS = ("input", "kernel", "output")


# ----------------------------------------------------------------------------- validation
def is_power_of_two(value: int) -> bool:
    """True for 1, 2, 4, 8, ... (an int, not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1 and value & (value - 1) == 0


def check_block_size(block_size: int, name: str = "block_size") -> None:
    """Raise a ValueError naming ``name`` unless it is a power of two in [2, 256] (Table 3)."""
    if not is_power_of_two(block_size) or not BLOCK_SIZES[0] <= block_size <= BLOCK_SIZES[-1]:
        raise ValueError(f"{name} must be a power of two in {list(BLOCK_SIZES)}; got {block_size!r}")


def _check_size(size: int, name: str) -> None:
    if not is_power_of_two(size):
        raise ValueError(f"{name} must be a power of two >= 1; got {size!r}")


# ----------------------------------------------------------------------------- plans
def butterfly_factors(size: int, block_size: int = DEFAULT_BLOCK_SIZE) -> tuple[int, ...]:
    """Factor ``size = r^p · rest`` (powers of two) into stage sizes ``(r, …, r, rest)``, rest < r.

    ``size = 1`` has no stages: ``()``.
    """
    _check_size(size, "size")
    check_block_size(block_size)
    factors = []
    while size >= block_size:
        factors.append(block_size)
        size //= block_size
    if size > 1:
        factors.append(size)
    return tuple(factors)


@dataclass(frozen=True)
class _Stage:
    block: int  # f: the DFT block of this stage
    outer: int  # a: independent (…, a, f, R) groups in front
    rest: int  # R: the size of the sub-problem behind (1 for the last stage)
    dft: torch.Tensor  # (f, f) complex64, F_f
    dft_conj: torch.Tensor  # (f, f) complex64, F̄_f (stored, so the inverse never resolves a conjugate bit)
    twiddle: torch.Tensor | None  # (f, R) complex64 or None when R == 1
    twiddle_conj: torch.Tensor | None


@dataclass(frozen=True)
class ButterflyPlan:
    """Everything about one transform size that does not depend on the data (cached per size and device).

    Attributes:
        size: M, the complex transform length.
        factors: stage sizes, outermost first (see :func:`butterfly_factors`).
        outer_stages: how many leading stages form the three-pass algorithm's pass 1 (0: single pass).
        stages: the stage constants.
        natural_index: (M,) the natural frequency of each stored (digit-reversed) position.
        storage_index: (M,) the stored position of each natural frequency (inverse permutation).
        partner: (M,) the stored position of frequency ``(M − k) mod M`` for the stored frequency k.
        pack_twiddle: (M,) complex64 ``ω_{2M}^k`` per stored position (real-input untangle, App. C.2).
    """

    size: int
    factors: tuple[int, ...]
    outer_stages: int
    stages: tuple[_Stage, ...]
    natural_index: torch.Tensor
    storage_index: torch.Tensor
    partner: torch.Tensor
    pack_twiddle: torch.Tensor


@functools.lru_cache(maxsize=64)
def _plan_cached(factors: tuple[int, ...], outer_stages: int, device: torch.device) -> ButterflyPlan:
    # normal tensors even when the first call comes from torch.inference_mode(): cached inference tensors
    # could never be saved for a later backward pass
    with torch.inference_mode(False):
        return _make_plan(factors, outer_stages, device)


def _make_plan(factors: tuple[int, ...], outer_stages: int, device: torch.device) -> ButterflyPlan:
    size = math.prod(factors)
    stages, outer = [], 1
    for block in factors:
        rest = size // (outer * block)
        twiddle = twiddle_matrix(block, rest, device) if rest > 1 else None
        dft = dft_matrix(block, device=device)
        conj = None if twiddle is None else twiddle.conj().resolve_conj()
        stages.append(_Stage(block, outer, rest, dft, dft.conj().resolve_conj(), twiddle, conj))
        outer *= block
    # digits (d₁, …, d_p) of a stored position (d₁ most significant) hold frequency d₁ + f₁d₂ + f₁f₂d₃ + …
    natural = torch.zeros(1, dtype=torch.int64, device="cpu")  # index tables on the CPU, moved to ``device`` below
    stride = 1
    for block in factors:
        natural = (natural[:, None] + stride * torch.arange(block, device="cpu")[None, :]).reshape(-1)
        stride *= block
    storage = torch.empty_like(natural)
    storage[natural] = torch.arange(size, device="cpu")
    partner = storage[(size - natural) % size]
    angle = (-math.pi / size) * natural.double()  # ω_{2M}^k = exp(−2πi·k/(2M))
    pack_twiddle = torch.polar(torch.ones_like(angle), angle).to(torch.complex64)
    return ButterflyPlan(
        size=size,
        factors=factors,
        outer_stages=outer_stages,
        stages=tuple(stages),
        natural_index=natural.to(device),
        storage_index=storage.to(device),
        partner=partner.to(device),
        pack_twiddle=pack_twiddle.to(device),
    )


def butterfly_plan(
    size: int, block_size: int = DEFAULT_BLOCK_SIZE, chunk_size: int | None = None, device=None
) -> ButterflyPlan:
    """The plan of a size-``size`` complex Butterfly transform with block size r = ``block_size``.

    With ``chunk_size = l`` (complex elements) and ``size > l`` the stages are ordered for the
    three-pass algorithm: the factors of m = size / l first (pass 1 / pass 3), then those of l (pass 2).
    Its tables live on ``device`` (default: torch's default device, as for a tensor factory).
    """
    _check_size(size, "size")
    check_block_size(block_size)
    device = torch.get_default_device() if device is None else torch.device(device)
    if chunk_size is not None:
        _check_size(chunk_size, "chunk_size")
    if chunk_size is None or size <= chunk_size:
        return _plan_cached(butterfly_factors(size, block_size), 0, device)
    outer = butterfly_factors(size // chunk_size, block_size)
    return _plan_cached(outer + butterfly_factors(chunk_size, block_size), len(outer), device)


# ----------------------------------------------------------------------------- learned blocks
@dataclass
class ButterflyBlocks:
    """Per-head r×r blocks replacing the fixed DFT blocks of one or more transforms (§3.2.1).

    Each field maps a block size f to a complex (H, f, f) tensor, or is None for the fixed DFT:
    ``input`` replaces F_f in the forward transform of u, ``kernel`` in the forward transform of the
    kernel, ``output`` replaces the conjugate block F̄_f of the inverse transform. A block is shared by
    every stage of its size (as in safari's ``BlockFFT``), so a transform adds H·Σ_f f² complex numbers.
    """

    input: dict[int, torch.Tensor] | None = None
    kernel: dict[int, torch.Tensor] | None = None
    output: dict[int, torch.Tensor] | None = None


def dft_blocks(num_heads: int, factors: tuple[int, ...], inverse: bool = False) -> dict[int, torch.Tensor]:
    """Initial learned blocks: one copy of F_f (F̄_f if ``inverse``) per head and distinct stage size f."""
    return {f: dft_matrix(f, inverse).expand(num_heads, f, f).clone() for f in sorted(set(factors))}


def _block(stage: _Stage, blocks: dict[int, torch.Tensor] | None, inverse: bool) -> torch.Tensor:
    if blocks is None:
        return stage.dft_conj if inverse else stage.dft
    try:
        return blocks[stage.block]
    except KeyError:
        raise ValueError(f"learned blocks have sizes {sorted(blocks)}; this transform needs {stage.block}") from None


def _mix(v: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """Multiply the block axis of ``v`` (…, a, f, R) by ``matrix``: (f, f) shared or (H, f, f) per head.

    With per-head blocks the head axis is the one in front of ``a`` (``v`` is (…, H, a, f, R)).
    """
    if v.shape[-1] == 1:  # last stage: (…, [H,] a, f) @ Fᵀ is a GEMM instead of many matrix-vector products
        return torch.matmul(v.squeeze(-1), matrix.transpose(-1, -2)).unsqueeze(-1)
    if matrix.dim() == 3:
        matrix = matrix[:, None]  # (H, 1, f, f): broadcast over the a groups
    return torch.matmul(matrix, v)


def _forward_stages(z: torch.Tensor, stages, blocks=None) -> torch.Tensor:
    """Natural-order (…, M) -> digit-reversed spectrum (…, M): per stage, block matmul then twiddle."""
    lead = z.shape[:-1]
    for stage in stages:
        v = z.reshape(*lead, stage.outer, stage.block, stage.rest)  # (…, a, f, R)
        v = _mix(v, _block(stage, blocks, inverse=False))  # (I_a ⊗ F_f ⊗ I_R)
        if stage.twiddle is not None:
            v.mul_(stage.twiddle)  # D: (f, R) twiddles, broadcast over (…, a); in place on the fresh matmul output
        z = v.reshape(*lead, -1)  # (…, M)
    return z


def _inverse_stages(z: torch.Tensor, stages, blocks=None) -> torch.Tensor:
    """Digit-reversed (…, M) -> natural order, unnormalised (M × the inverse DFT): stages reversed, conjugated."""
    lead = z.shape[:-1]
    for stage in reversed(stages):
        v = z.reshape(*lead, stage.outer, stage.block, stage.rest)  # (…, a, f, R)
        if stage.twiddle is not None:
            v = v * stage.twiddle_conj
        v = _mix(v, _block(stage, blocks, inverse=True))  # (I_a ⊗ F̄_f ⊗ I_R)
        z = v.reshape(*lead, -1)
    return z


# ----------------------------------------------------------------------------- plain transforms
@float32_math
def butterfly_fft(x: torch.Tensor, block_size: int = DEFAULT_BLOCK_SIZE) -> torch.Tensor:
    """``torch.fft.fft(x)`` along the last axis (a power-of-two length) by Butterfly matmuls; complex64."""
    plan = butterfly_plan(x.shape[-1], block_size, device=x.device)
    spectrum = _forward_stages(x.to(torch.complex64), plan.stages)
    return spectrum[..., plan.storage_index]  # digit-reversed -> natural order


@float32_math
def butterfly_ifft(x: torch.Tensor, block_size: int = DEFAULT_BLOCK_SIZE) -> torch.Tensor:
    """``torch.fft.ifft(x)`` along the last axis (a power-of-two length) by Butterfly matmuls; complex64."""
    plan = butterfly_plan(x.shape[-1], block_size, device=x.device)
    stored = x.to(torch.complex64)[..., plan.natural_index]  # natural -> digit-reversed order
    return _inverse_stages(stored, plan.stages) / plan.size


def _pack_real(x: torch.Tensor, n: int) -> torch.Tensor:
    """Real (…, L) zero-padded to n, viewed as complex (…, n/2): ``z[j] = x[2j] + i·x[2j+1]`` (App. C.2)."""
    x = F.pad(x.float(), (0, n - x.shape[-1])).contiguous()  # (…, n)
    return torch.view_as_complex(x.reshape(*x.shape[:-1], n // 2, 2))  # (…, n/2)


def _unpack_real(z: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_pack_real` without the padding: complex (…, M) -> real (…, 2M)."""
    return torch.view_as_real(z.contiguous()).reshape(*z.shape[:-1], 2 * z.shape[-1])


def _untangle(a: torch.Tensor, plan: ButterflyPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """From the packed spectrum Z (stored order) to E, Q with ``X[k] = E − Q``, ``X̄[M−k] = E + Q`` (App. C.2)."""
    partner = a[..., plan.partner].conj()  # Z̄[(M − k) mod M]
    even = 0.5 * (a + partner)
    odd = (0.5j * plan.pack_twiddle) * (a - partner)
    return even, odd


@float32_math
def butterfly_rfft(x: torch.Tensor, n: int | None = None, block_size: int = DEFAULT_BLOCK_SIZE) -> torch.Tensor:
    """``torch.fft.rfft(x, n)`` along the last axis by the real-input trick of App. C.2; (…, n//2 + 1) complex64.

    ``n`` (default: the input length) must be a power of two >= 2 and at least the input length.
    """
    n = x.shape[-1] if n is None else n
    if not is_power_of_two(n) or n < 2 or n < x.shape[-1]:
        raise ValueError(f"n must be a power of two >= max(2, input length {x.shape[-1]}); got {n!r}")
    plan = butterfly_plan(n // 2, block_size, device=x.device)
    a = _forward_stages(_pack_real(x, n), plan.stages)  # (…, M) stored order
    even, odd = _untangle(a, plan)
    half = (even - odd)[..., plan.storage_index]  # X[0 … M−1] in natural order
    z0 = a[..., plan.storage_index[0]]
    nyquist = (z0.real - z0.imag).to(torch.complex64)  # X[M] = Re Z[0] − Im Z[0]
    return torch.cat([half, nyquist[..., None]], dim=-1)


@float32_math
def butterfly_irfft(spectrum: torch.Tensor, n: int, block_size: int = DEFAULT_BLOCK_SIZE) -> torch.Tensor:
    """``torch.fft.irfft(spectrum, n)`` for a (…, n//2 + 1) half spectrum; real float32 (…, n), n a power of two."""
    if not is_power_of_two(n) or n < 2 or spectrum.shape[-1] != n // 2 + 1:
        raise ValueError(f"n must be a power of two >= 2 with n//2 + 1 = {spectrum.shape[-1]} bins; got {n!r}")
    plan = butterfly_plan(n // 2, block_size, device=spectrum.device)
    half = n // 2
    y = spectrum.to(torch.complex64)
    # Hermitian symmetry: Y[k + M] = Ȳ[M − k]; re-tangle Z_y[k] = ½(Y[k] + Ȳ[M−k]) + ½·i·ω_n^{−k}(Y[k] − Ȳ[M−k])
    low = y[..., :half]  # Y[k], k = 0 … M−1
    mirror = y[..., 1 : half + 1].flip(-1).conj()  # Ȳ[M − k], k = 0 … M−1
    k = torch.arange(half, device=y.device, dtype=torch.float64)
    back = torch.polar(torch.ones_like(k), math.pi * k / half).to(torch.complex64)  # ω_n^{−k}
    packed = 0.5 * (low + mirror) + (0.5j * back) * (low - mirror)  # natural order
    z = _inverse_stages(packed[..., plan.natural_index], plan.stages) / half
    return _unpack_real(z)


# ----------------------------------------------------------------------------- convolution
def butterfly_kernel_spectrum(
    circulant: torch.Tensor, plan: ButterflyPlan, blocks: dict[int, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """γ, δ (H, M) complex64 of a real (H, n = 2M) circulant, so that ``Z_y = Z·γ + Z̄[M−k]·δ``.

    ``Z`` is the packed input spectrum, ``Z_y`` the packed spectrum of the convolution (both in stored
    order). With the kernel spectrum K (and ``K_c[k] = K̄[M−k]``): ``Y = (E − Q)·K``, ``Ȳ[M−k] = (E + Q)·K_c``,
    then re-tangled as in :func:`butterfly_irfft`; collecting the terms of Z and Z̄[M−k] gives
    ``γ = ½(K + K_c) + ¼·i(ω̄ − ω)(K − K_c)`` and ``δ = ¼·i(ω̄ + ω)(K − K_c)``, ω = ω_n^k.
    """
    a = _forward_stages(_pack_real(circulant, circulant.shape[-1]), plan.stages, blocks)  # (H, M)
    even, odd = _untangle(a, plan)
    spec, spec_c = even - odd, even + odd  # K[k], K̄[M − k]
    w = plan.pack_twiddle
    diff = spec - spec_c
    gamma = 0.5 * (spec + spec_c) + (0.25j * (w.conj() - w)) * diff
    delta = (0.25j * (w.conj() + w)) * diff
    return gamma, delta


def _resolve_fft_size(needed: int, n: int | None) -> int:
    if n is None:
        return max(2, fft_size(needed))
    if not is_power_of_two(n) or n < max(2, needed):
        raise ValueError(
            f"n (the FFT size) must be a power of two >= L + K - 1 = {needed} (and >= 2); got {n!r}: "
            "a shorter FFT would wrap the kernel's tail onto earlier outputs"
        )
    return n


@float32_math
def butterfly_conv(
    u: torch.Tensor,
    kernel: torch.Tensor,
    kernel_backward: torch.Tensor | None = None,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    chunk_size: int | None = DEFAULT_CHUNK_SIZE,
    n: int | None = None,
    blocks: ButterflyBlocks | None = None,
) -> torch.Tensor:
    """:func:`~ssmhub.ops.fftconv.fft_conv` computed by Butterfly matmuls (FlashButterfly, §3.2, Algorithm 2).

    Same semantics as ``fft_conv``: causal ``y[…, h, k] = Σ_{j ≤ k} kernel[h, k − j]·u[…, h, j]``, plus the
    anti-causal ``kernel_backward`` taps if given; taps past L are ignored; no skip term (add ``D ⊙ u``
    yourself, as :func:`~ssmhub.ops.longconv.causal_conv` does). Zero padding to an FFT size n >= L + K − 1,
    so nothing wraps around.

    Args:
        u: (…, H, L) input.
        kernel: (H, K) causal kernel. kernel_backward: optional (H, K') anti-causal kernel.
        block_size: r, the size of the DFT blocks (a power of two, 2 … 256).
        chunk_size: l in real samples; FFT sizes above it run as the three-pass algorithm (Algorithm 2) with
            m = n / l chunks. None: always a single pass. The result is the same either way.
        n: FFT size (a power of two >= L + K − 1); default the smallest. Learned blocks fix it.
        blocks: learned per-head blocks (:class:`ButterflyBlocks`) for the learned Butterfly (§3.2.1);
            None: the fixed DFT (an exact FFT convolution).

    Returns:
        (…, H, L) in ``u.dtype``.
    """
    check_conv_args(u, kernel, kernel_backward)
    check_block_size(block_size)
    if chunk_size is not None and (not is_power_of_two(chunk_size) or chunk_size < 2):
        raise ValueError(f"chunk_size must be a power of two >= 2 or None; got {chunk_size!r}")
    seq_len = u.shape[-1]
    kernel = kernel[:, :seq_len]
    if kernel_backward is not None:
        kernel_backward = kernel_backward[:, : seq_len - 1]
    longest = max(kernel.shape[-1], 0 if kernel_backward is None else kernel_backward.shape[-1])
    n = _resolve_fft_size(seq_len + longest, n)
    circulant = conv_circulant(kernel, kernel_backward, n)  # (H, n)
    half = n // 2
    blocks = blocks or ButterflyBlocks()
    plan = butterfly_plan(half, block_size, None if chunk_size is None else chunk_size // 2, u.device)
    gamma, delta = butterfly_kernel_spectrum(circulant, plan, blocks.kernel)  # (H, M) each: D'_K of Eq. 3
    outer, inner = plan.stages[: plan.outer_stages], plan.stages[plan.outer_stages :]
    z = _pack_real(u, n)  # (…, H, M) complex
    # pass 1 (Algorithm 2 line 3, u ← B̄⁻¹u): mix the m chunks at each offset τ; nothing when single-pass
    z = _forward_stages(z, outer, blocks.input)
    # pass 2 (line 4): m independent size-l FFT convolutions, (I_m ⊗ F̄_l) D'_K (I_m ⊗ F_l)
    z = _forward_stages(z, inner, blocks.input)  # (…, H, M) packed spectrum, stored order
    # untangle · K · re-tangle (App. C.2) in one step, Z_y = Z·γ + Z̄[M−k]·δ, the 1/M of the inverse folded in
    partner = z[..., plan.partner].conj_physical_()  # Z̄[(M − k) mod M], a fresh tensor
    z = (z * (gamma / half)).addcmul_(partner, delta / half)
    z = _inverse_stages(z, inner, blocks.output)
    # pass 3 (line 5, y ← B̄u)
    z = _inverse_stages(z, outer, blocks.output)
    y = _unpack_real(z)[..., :seq_len]  # (…, H, L)
    return y.to(u.dtype)
