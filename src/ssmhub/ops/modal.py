"""Distil a learned long-convolution kernel into a diagonal SSM in modal form, for O(N) decoding.

The long-conv paper (Fu et al. 2023, arXiv 2302.06646) gives no recurrent decoding mode: a length-L explicit
kernel has no finite state, so exact decoding costs O(L) per token. Its Prop. 2 (App. D.2) shows any kernel
*is* a sum of L exponentials, but through an ill-conditioned Vandermonde inverse and with state L.
Here each channel's kernel ``K ∈ R^L`` is instead *approximated* with ``N ≪ L`` modes, the post-hoc
distillation of "Laughing Hyena" (Massaroli et al. 2023, modal/Prony fitting):

    ``K̂[0] = d + Re(Σ_n c_n)``,    ``K̂[t] = Re(Σ_n c_n λ_n^t)``  for ``t ≥ 1``,

which is the kernel of the diagonal recurrence (DLR seed paper Eq. 1, with per-channel poles)
``x_t = λ ⊙ x_{t-1} + u_t``, ``y_t = Re(<c, x_t>) + d·u_t``. ``d`` is a direct (skip) term that lets the
fit match ``K[0]`` exactly and spend all N modes on ``t ≥ 1``, as in the eigensystem realization
algorithm (ERA), where ``K[0]`` is the feed-through ``D`` and the Hankel matrix starts at ``K[1]``.

Method ``"hankel"``, the reference (Kung's / ERA / ESPRIT state-space identification, then a least-squares refit):

1. Hankel matrix ``𝓗[i, j] = K[1 + i + j]`` of the tail ``K[1:]`` (length ``T = L - 1``), with ``P``
   columns (``hankel_cols``, default ``min(max(4N, 128), 256)``, capped by T) and ``M = T - P + 1``
   consecutive rows, so every tap enters. Its column space is spanned by the Vandermonde vectors
   ``(λ^i)_i`` of the poles; the leading ``r = 2N`` left singular vectors ``U`` (a real kernel needs
   a conjugate pair, two real poles, per complex mode) estimate it. For small Hankel matrices
   (``M·P ≤ 2^17``) ``U`` is an SVD; for larger ones it comes from the eigenvectors of the small P×P Gram
   matrix ``𝓗ᵀ𝓗`` (``U = 𝓗 V Σ⁻¹``), itself built in ``O(P² + M·P)`` from its Toeplitz-like structure;
   this squares the conditioning (singular values below ~1e-8·σ_max are lost), harmless for fits with
   N ≪ L but it limits exact recovery of clustered poles to ~1e-5.
2. Shift invariance (ESPRIT): ``U[1:] ≈ U[:-1] Φ``; the eigenvalues of the r×r matrix ``Φ`` are the
   poles. They come in conjugate pairs or are real; one of each pair (``Im λ ≥ 0``) and every real
   pole is a candidate mode (between N and 2N of them).
3. Residues by linear least squares over all T taps (the L2 error is linear in ``c`` given the poles),
   from normal equations whose Gram matrix has a closed form (geometric sums). The system is Jacobi-scaled
   (unit-energy columns) and solved by a truncated eigendecomposition: directions with eigenvalue below
   ``1e-7`` of the largest are combinations of nearly coincident modes, which ESPRIT returns for sparse
   (Squash-regularized) kernels; fitting along them takes residues orders of magnitude larger than the
   kernel, whose cancellation float32 decoding cannot resolve. A column's scale counts its tap 0 as well
   (``Re c_n``, which the direct term cancels): a small pole fitting an isolated tap at lag τ would otherwise
   take a residue ~K[τ]/|λ|^τ with a bounded contribution from tap 1 on (ESPRIT poles at |λ| ≈ 0.015 took
   residues 5·10⁴ times ‖K‖, and the float32 decode lost 0.6% of the output). Poles with ``|λ| < 1e-2``
   are discarded for the same reason. If there are more than N candidates, the N with the most energy
   ``‖Re(c_n λ_n^t)‖²`` are kept.
4. ``|λ| ≤ 1 - 1e-4`` is enforced by clamping the modulus (an ESPRIT pole can land on or outside the
   unit circle for kernels that do not decay); poles are rounded to the float32 storage, and the
   residues refitted in float64 for those rounded poles, so the stored fit is the one reported.

Model-order reduction (``method="balanced"``, ``"best"``, ``"refined"``; LaughingHyena, Massaroli et al. 2023,
arXiv 2310.18780, §3.2, distils long-conv filters by model-order reduction with the order chosen per filter):

- ``"balanced"``: balanced truncation of the FIR system of the tail through its T×T Hankel operator (symmetric:
  its leading ``2N`` eigenvectors are its singular vectors, its eigenvalue moduli the Hankel singular values,
  :func:`hankel_singular_values`), poles of the truncated balanced realisation (:func:`_balanced_poles`), then
  the same least-squares residues. Allows ``N ≤ T/2`` (2N real states, the size of the exact window). The
  eigenvectors come from :mod:`ssmhub.ops.hankel`: by default (``eigensolver="truncated"``) only the ``2N``
  leading ones, from a block Krylov space of the operator applied by FFT, batched over channels (``O(T·m²)``
  with a basis of ``m = max(5N, 2N + 64)`` columns, ``5N + 96`` from ``T ≥ 20N``, instead of ``O(T³)``; where
  ``m > T/2`` on a kernel's support the dense route, which is then about as cheap, see
  :func:`~ssmhub.ops.hankel.uses_krylov`); ``eigensolver="dense"`` is one ``eigh`` of the whole operator per
  channel, the reference. The two agree within 1% on kernels whose Hankel singular values fall off (trained,
  smoothed, decaying noise kernels: tests/ops/test_hankel.py) and on the random-init kernels measured in
  benchmarks/results/h3_distillation_speed.md, whose values barely fall.
- ``"best"``: per channel the smallest error among the hankel, balanced and frequency-sampling candidates
  (:func:`_circle_poles`: poles spread on a circle, which fit delays, whose own realisation is nilpotent and
  has no modal form), each with least-squares residues, so never worse than the reference, channel by channel.
- ``"refined"``: ``"best"``, then Adam on poles and residues against the L2 kernel error (each channel keeps its
  best iterate; residues refitted by least squares at the end). Measured in benchmarks/results/h3_distillation.md.

Everything is float64/complex128 (but for the truncated eigensolver's float32 Krylov basis,
:data:`ssmhub.ops.hankel.KRYLOV_DTYPE`) and batched over channels (in blocks, to bound memory).
Cost per channel: ``O(M·P² + P³ + T·N + N³)`` (Gram, eigh, right-hand side ``Σ_t K[t] λ^t``, solves) for
``"hankel"``, plus the Hankel eigenvectors for the others; the time of a whole model's distillation (truncated vs
dense eigensolver) is in benchmarks/results/h3_distillation_speed.md.

Known failure modes and limits:

- The fit only matches on ``[0, L)``. A kernel that does not decay within L (e.g. a slowly decaying
  geometric-init channel) is fitted with poles near the unit circle; beyond L the modal kernel keeps
  going while the true, length-L kernel is zero. Decoding past L therefore differs from the exact
  long conv (which truncates at L); with ``|λ| ≤ 1 - 1e-4`` the modal tail still decays, slowly.
- Kernels with much energy spread over many frequencies (white noise, a freshly ``randn``-initialised
  kernel) are not low-rank: N modes capture roughly the energy in N "directions", so the relative
  error stays large whatever the method. Trained, Squash/Smooth-regularised kernels decay and are smooth.
- Hankel/ESPRIT is near-optimal in Hankel norm, not in L2; the least-squares refit makes the residues
  L2-optimal for the chosen poles; only ``method="refined"`` moves the poles (a local descent, slow on a CPU).
- Nearly coincident poles make the Vandermonde system ill-conditioned; the truncated solve keeps every
  mode's contribution bounded, at some cost in accuracy on noise-like kernels. A channel whose stored fit
    would still be worse than no modes at all (``d`` alone) gets no modes: the error never exceeds that.
  ``relative_error`` is always recomputed from the stored float32 parameters, so it is honest.
- Trained H3 kernels under Squash are sparse (most taps exactly zero) and spread over all L taps: far
  from a few decaying modes, so their fits have large relative errors (~0.5 at N = 64 for a 4-layer
  WikiText-2 model); what matters is the perplexity of the distilled model (benchmarks/h3_distillation.py).
- ``|λ| ≤ 1 - 1e-4`` caps the slowest representable decay at a time constant of ~10⁴ steps.

Every fast function has a complex128 step-by-step reference (:func:`modal_scan_ref`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .diagonal_step import diagonal_step, polar_parts
from .fftconv import fft_conv
from .hankel import EIGENSOLVERS, balanced_basis, kernel_support, krylov_dimension, square_hankel, uses_krylov
from .precision import float32_math

__all__ = [
    "FIT_METHODS",
    "MAX_MODULUS",
    "ModalKernel",
    "fit_modal_kernel",
    "fit_modal_kernels",
    "hankel_singular_values",
    "max_modes",
    "modal_init_state",
    "modal_kernel",
    "modal_scan",
    "modal_scan_ref",
    "modal_step",
    "modal_step_coefficients",
    "modal_step_with",
]

FIT_METHODS = ("hankel", "balanced", "best", "refined")
CIRCLE_DECAYS = (1.0, 2.0, 4.0)  # s of the frequency-sampling candidates |λ| = exp(-s/N), see _circle_poles
MAX_MODULUS = 1.0 - 1e-4  # |λ| is clamped to at most this: a stable, slowly decaying mode
MIN_MODULUS = 1e-2  # ESPRIT poles smaller than this are discarded (a mode that is gone after two taps)
_TWO_PI = 2.0 * math.pi
_SVD_ELEMENTS = 1 << 17  # Hankel matrices up to this size (per channel) get an exact SVD, larger ones the Gram route
_DENSE_ELEMENTS = 1 << 24  # doubles of the square Hankel matrices of one channel block (128 MiB)
_REFINE_LR = 3e-3  # Adam step of the refined fit (poles: log-modulus and phase; residues relative to ‖K‖)
_RCOND = 1e-7  # relative eigenvalue cut-off of the (Jacobi-scaled) residue normal equations
_REAL_SIN = 1e-6  # a pole with |sin arg λ| at most this is real (no Im column in the residue fit)


@dataclass(frozen=True)
class ModalKernel:
    """A bank of H kernels in modal form, ``λ = exp(log_modulus + i·phase)`` with ``|λ| < 1``.

    ``K̂[0] = d + Re(Σ_n c_n)`` and ``K̂[t] = Re(Σ_n c_n λ_n^t)`` for ``t ≥ 1``.

    Attributes:
        log_modulus: (H, N) float32, ``log|λ| ≤ log(MAX_MODULUS) < 0``.
        phase: (H, N) float32 in ``[0, π]``.
        residues: (H, N, 2) float32, real and imaginary parts of ``c``.
        d: (H,) float32 direct term (zeros when fitted with ``direct_term=False``).
        relative_error: (H,) float32, ``‖K - K̂‖₂ / ‖K‖₂`` over the fitted length (0 for a zero kernel).
    """

    log_modulus: torch.Tensor
    phase: torch.Tensor
    residues: torch.Tensor
    d: torch.Tensor
    relative_error: torch.Tensor

    @property
    def num_channels(self) -> int:
        return self.log_modulus.shape[0]

    @property
    def num_modes(self) -> int:
        return self.log_modulus.shape[1]

    def poles(self) -> torch.Tensor:
        """``λ`` as a (H, N) complex128 tensor."""
        return torch.polar(torch.exp(self.log_modulus.double()), self.phase.double())

    def complex_residues(self) -> torch.Tensor:
        """``c`` as a (H, N) complex128 tensor."""
        return torch.complex(self.residues[..., 0].double(), self.residues[..., 1].double())

    def to(self, *args, **kwargs) -> ModalKernel:
        """Move every tensor (e.g. ``.to(device)``); dtypes stay float32."""
        return ModalKernel(*(getattr(self, f).to(*args, **kwargs) for f in self.__dataclass_fields__))

    def channels(self, index: torch.Tensor) -> ModalKernel:
        """The channels ``index`` (k,) of the bank, in that order."""
        return ModalKernel(*(getattr(self, f)[index] for f in self.__dataclass_fields__))


def max_modes(length: int, direct_term: bool = True, method: str = "hankel") -> int:
    """Largest ``num_modes`` that :func:`fit_modal_kernel` accepts for kernels of ``length`` taps.

    ``"hankel"``: ESPRIT with ``r = 2N`` needs a Hankel matrix with at least ``2N + 1`` rows and ``2N`` columns
    plus one spare tap for its shifted copy, i.e. ``T ≥ 4N + 1`` taps (``T = L - 1`` with a direct term, else L).
    ``"balanced"`` / ``"refined"``: the reduced model has ``r = 2N ≤ T`` states, i.e. ``N ≤ T/2``: as many real
    numbers as the exact window of T inputs holds (a larger N would be a larger state than exact decoding).
    """
    if method not in FIT_METHODS:
        raise ValueError(f"method must be one of {FIT_METHODS}; got {method!r}")
    taps = length - 1 if direct_term else length
    return max(0, taps - 1) // 4 if method == "hankel" else max(0, taps) // 2


# ---------------------------------------------------------------------------------------------------------------
# float64 helpers
# ---------------------------------------------------------------------------------------------------------------


def _powers64(log_modulus: torch.Tensor, phase: torch.Tensor, start: int, length: int, stride: int = 1) -> torch.Tensor:
    """``λ^t``, ``t = start + stride·k`` for ``k < length``, complex128 (..., N, length); phase mod 2π in fp64."""
    t = start + stride * torch.arange(length, device=log_modulus.device, dtype=torch.float64)
    magnitude = torch.exp(log_modulus.double().unsqueeze(-1) * t)  # (..., N, C)
    angle = torch.remainder(phase.double().unsqueeze(-1) * t, _TWO_PI)  # (..., N, C)
    return torch.polar(magnitude, angle)


def _blocked_powers(log_modulus: torch.Tensor, phase: torch.Tensor, length: int, start: int = 0):
    """``λ^(start + kS + s)`` for ``t = kS + s < length`` as two factors, ``S ≈ √length``: O(N·√length) exponentials.

    Returns ``(inner, outer)``: inner (..., N, S) = ``λ^s``, outer (..., N, K) = ``λ^(start + kS)``, K = ⌈length/S⌉;
    complex128 from float64 phases (mod 2π). Sums over t become one matmul per factor.
    """
    size = max(1, math.isqrt(length))
    blocks = -(-length // size)
    inner = _powers64(log_modulus, phase, 0, size)
    outer = _powers64(log_modulus, phase, start, blocks, stride=size)
    return inner, outer


def _geometric_sum(log_modulus: torch.Tensor, phase: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """``Σ_{t=start}^{start+count-1} a^t``, ``a = exp(log_modulus + i·phase)``, ``|a| < 1``: closed form, complex128.

    Powers are formed from the float64 exponent (phase mod 2π), not by complex ``pow``.
    """

    def power(n: int) -> torch.Tensor:
        return torch.polar(torch.exp(n * log_modulus), torch.remainder(n * phase, _TWO_PI))

    a = power(1)
    first = a if start == 1 else power(start)  # start 1 (a direct term) is the usual case: one exponential less
    return first * (1 - power(count)) / (1 - a)


def _spd_solve(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Solve symmetric positive (semi)definite ``a x = b`` by Cholesky; a failed factor gets a larger ridge.

    (Cholesky rather than LU: cheaper, and batched LU in some MKL builds fails on multi-threaded runs.)
    """
    a = 0.5 * (a + a.mT)
    scale = torch.diagonal(a, dim1=-2, dim2=-1).abs().mean(-1).clamp(min=1e-300)[..., None, None]
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    factor, info = torch.linalg.cholesky_ex(a)
    bump = 1e-12
    while bool((info > 0).any()):
        retry, retry_info = torch.linalg.cholesky_ex(a + bump * scale * eye)
        factor = torch.where((info > 0)[..., None, None], retry, factor)
        info = torch.where(info > 0, retry_info, info)
        bump *= 1e3
    return torch.cholesky_solve(b, factor)


def _front(mask: torch.Tensor) -> torch.Tensor:
    """Indices (H, k) that put the True entries of ``mask`` (H, n) first (stably), ``k`` the most True in a row."""
    count = max(1, int(mask.sum(-1).max()))
    return torch.argsort((~mask).to(torch.int8), dim=-1, stable=True)[..., :count]


def _fit_residues(
    kernel: torch.Tensor,
    log_modulus: torch.Tensor,
    phase: torch.Tensor,
    valid: torch.Tensor,
    start: int,
    shared: bool = False,
) -> torch.Tensor:
    """Least-squares ``c`` minimising ``Σ_{t≥start} (K[t] - Re Σ_n c_n λ_n^t)²`` (complex128 (H, N)).

    Only the valid poles enter (moved to the front, :func:`_front`; invalid modes get zero residues), so the
    system is as small as the largest number of valid poles in the block. ``shared``: every channel has the poles
    of the first one (the frequency-sampling candidates), whose system is then built and factored once.
    """
    kept = _front(valid)  # (H, k)
    lm, ph, ok = (torch.gather(x, -1, kept) for x in (log_modulus, phase, valid))  # (H, k)
    system = slice(0, 1) if shared else slice(None)
    solve = _residue_solver(lm[system], ph[system], ok[system], start, kernel.shape[-1] - start)
    c = solve(_z_transform(kernel[:, start:], lm, ph, start))  # (H, k); its invalid entries are zero
    return torch.zeros_like(log_modulus, dtype=torch.complex128).scatter(-1, kept, c)


def _residue_gram(lm: torch.Tensor, ph: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """The Gram matrix (h, 2N, 2N) of the residue fit's real columns ``(Re λ_m^t, −Im λ_m^t)``, t = start ..
    start + count − 1, for poles ``λ = exp(lm + i·ph)`` (h, N), in closed form from geometric sums."""
    lm_sum = lm.unsqueeze(-1) + lm.unsqueeze(-2)  # (h, N, N): log|λ_m λ_n|
    s_prod = _geometric_sum(lm_sum, ph.unsqueeze(-1) + ph.unsqueeze(-2), start, count)  # Σ (λ_m λ_n)^t
    s_cross = _geometric_sum(lm_sum, ph.unsqueeze(-1) - ph.unsqueeze(-2), start, count)  # Σ (λ_m λ̄_n)^t
    # Σ Re a_m Re a_n = ½ Re(S(λmλn) + S(λmλ̄n));  Σ Im a_m Im a_n = ½ Re(S(λmλ̄n) - S(λmλn))
    # Σ Re a_m Im a_n = ½ Im(S(λmλn) - S(λmλ̄n))
    g_rr = 0.5 * (s_prod + s_cross).real
    g_ii = 0.5 * (s_cross - s_prod).real
    g_ri = 0.5 * (s_prod - s_cross).imag  # (h, N, N): Σ Re a_m Im a_n
    return torch.cat([torch.cat([g_rr, -g_ri], dim=-1), torch.cat([-g_ri.mT, g_ii], dim=-1)], dim=-2)


def _residue_solver(log_modulus: torch.Tensor, phase: torch.Tensor, valid: torch.Tensor, start: int, count: int):
    """The factored normal equations of the residue fit for these poles (h, N): a function ``Σ_t K[t] λ^t`` (H, N)
    -> ``c`` (H, N) complex128 (``h`` is H, or 1 for poles shared by every channel).

    Real unknowns ``z = (Re c, Im c)``; ``Re(c λ^t) = Re c·Re λ^t - Im c·Im λ^t``. The Gram matrix of the
    columns ``(Re λ_m^t, -Im λ_m^t)`` has a closed form from ``Re z Re w = ½ Re(zw + z w̄)`` and geometric
    sums; the right-hand side ``Σ_t K[t] λ_m^t`` comes from :func:`_z_transform`. Invalid modes (``valid``
    False) and the Im columns of real poles are left out of the system (:func:`_front`), and get zero residues: the
    2N eigenvalues of a realisation (conjugate pairs counted once) make at most 2N real unknowns, not 4N.
    """
    lm = torch.where(valid, log_modulus.double(), math.log(0.5))  # (h, N); invalid columns are masked below
    ph = phase.double()
    gram = _residue_gram(lm, ph, start, count)  # (h, 2N, 2N) for columns (Re a, -Im a)
    is_complex = ph.sin().abs() > _REAL_SIN  # a real pole (phase 0 or π) has no Im column
    n = log_modulus.shape[-1]
    mask = torch.cat([valid, valid & is_complex], dim=-1)  # (h, 2N)
    # a column's size is its energy over the fitted taps plus, with a direct term, its tap 0 (Re λ⁰ = 1 for a Re
    # column): Re c_n also enters d = K[0] − Σ Re c_n, where the decode cancels it
    tap0 = (torch.arange(2 * n, device=lm.device) < n).double() if start > 0 else 0.0  # (2N,)
    size = torch.diagonal(gram, dim1=-2, dim2=-1) + tap0  # (h, 2N)
    columns = _front(mask)  # (h, p), p ≤ 2N: the unknowns that exist
    active = torch.gather(mask, -1, columns).double()  # (h, p): 0 for padding
    gram = torch.gather(
        torch.gather(gram, -2, columns.unsqueeze(-1).expand(-1, -1, 2 * n)),
        -1,
        columns.unsqueeze(-2).expand(-1, columns.shape[-1], -1),
    )  # (h, p, p)
    size = torch.gather(size, -1, columns) * active
    # Jacobi scaling (columns of unit size), then a truncated eigen-solve: directions of the scaled Gram matrix
    # with eigenvalue below _RCOND·max are combinations of modes that nearly cancel (clustered poles, which
    # ESPRIT returns for sparse, squashed kernels); fitting along them needs residues far larger than the
    # kernel, whose cancellation float32 decoding cannot resolve. Dropping them bounds every mode's contribution.
    col_scale = torch.where(size > 0, size.clamp(min=1e-300).rsqrt(), 0.0)  # (h, p); padding columns: 0
    scaled = gram * col_scale.unsqueeze(-1) * col_scale.unsqueeze(-2)  # (h, p, p), diagonal ≤ 1
    evals, evecs = torch.linalg.eigh(scaled)  # ascending
    keep = evals > _RCOND * evals[..., -1:].clamp(min=1e-300)
    inv = torch.where(keep, 1.0 / evals.clamp(min=1e-300), 0.0)  # (h, p)

    def solve(rhs: torch.Tensor) -> torch.Tensor:
        b = torch.gather(torch.cat([rhs.real, -rhs.imag], dim=-1), -1, columns.expand(rhs.shape[0], -1))  # (H, p)
        projected = (evecs.mT @ (b * col_scale).unsqueeze(-1)).squeeze(-1)  # (H, p)
        z = (evecs @ (inv * projected).unsqueeze(-1)).squeeze(-1) * col_scale  # (H, p)
        z = b.new_zeros(b.shape[0], 2 * n).scatter(-1, columns.expand(rhs.shape[0], -1), z)
        return torch.complex(z[..., :n], z[..., n:])  # (H, N)

    return solve


def _z_transform(taps: torch.Tensor, log_modulus: torch.Tensor, phase: torch.Tensor, start: int) -> torch.Tensor:
    """``Σ_t taps[t] λ^(start+t)`` (H, N) complex128, in blocks: ``Σ_b λ^(start+bS) Σ_s taps[bS+s] λ^s``.

    Only ``O(N·√T)`` complex exponentials (all from float64 phases mod 2π) and one batched matmul.
    """
    channels, length = taps.shape
    inner, outer = _blocked_powers(log_modulus, phase, length, start)  # (H, N, S): λ^s; (H, N, nb): λ^(start+bS)
    size, blocks = inner.shape[-1], outer.shape[-1]
    padded = torch.nn.functional.pad(taps.double(), (0, blocks * size - length)).view(channels, blocks, size)
    partial = padded.to(torch.complex128) @ inner.mT  # (H, nb, N)
    return (partial * outer.mT).sum(-2)  # (H, N)


def _hankel_gram(tail: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``𝓗ᵀ𝓗`` (H, Q, Q) for ``𝓗[i, j] = tail[i + j]``, ``i < rows``, ``j < cols``, in O(Q² + rows·Q) per channel.

    First row by a direct product; then down the diagonals, ``G[j, k] = G[j-1, k-1] + a_j a_k - b_j b_k`` with
    ``a_j = tail[rows-1+j]`` (the row that enters) and ``b_j = tail[j-1]`` (the row that leaves).
    """
    channels = tail.shape[0]
    first = torch.einsum("hm,hmq->hq", tail[:, :rows], tail.unfold(-1, cols, 1)[:, :rows])  # (H, Q): G[0, δ]
    zeros = torch.zeros(channels, 1, dtype=tail.dtype, device=tail.device)
    a = torch.cat([zeros, tail[:, rows : rows + cols - 1]], dim=-1)  # (H, Q): a_0 = 0
    b = torch.cat([zeros, tail[:, : cols - 1]], dim=-1)  # (H, Q): b_0 = 0
    pad = torch.zeros(channels, cols, dtype=tail.dtype, device=tail.device)
    a_shift = torch.cat([a, pad], dim=-1).unfold(-1, cols, 1)[:, :cols]  # (H, Q, Q): [s, δ] = a_{s+δ}
    b_shift = torch.cat([b, pad], dim=-1).unfold(-1, cols, 1)[:, :cols]
    steps = (a.unsqueeze(-1) * a_shift - b.unsqueeze(-1) * b_shift).cumsum(dim=-2)  # (H, Q, Q): [j, δ]
    j = torch.arange(cols, device=tail.device)
    delta = j[None, :] - j[:, None]  # (Q, Q): k - j
    upper = delta >= 0
    idx = delta.clamp(min=0)
    gram = first[:, idx] + torch.gather(steps, -1, idx.expand(channels, cols, cols))  # (H, Q, Q), valid k ≥ j
    gram = torch.where(upper, gram, 0.0)
    return gram + gram.mT - torch.diag_embed(torch.diagonal(gram, dim1=-2, dim2=-1))


def _esprit_poles(tail: torch.Tensor, order: int, cols: int) -> torch.Tensor:
    """ESPRIT poles (H, order) complex128 from the Hankel matrix of ``tail`` (H, T) with ``cols`` columns.

    With ``U = 𝓗 W`` (``W = V Σ⁻¹``, the leading eigenpairs of ``𝓗ᵀ𝓗``), the shift-invariance normal equations
    need only ``U[:-1]ᵀU[:-1] = Wᵀ 𝓗[:-1]ᵀ𝓗[:-1] W`` and ``U[:-1]ᵀU[1:] = Wᵀ 𝓗[:-1]ᵀ𝓗[1:] W``: both are blocks of
    the Gram matrix of the (rows-1)×(cols+1) Hankel matrix, so ``U`` (rows × r) is never formed.
    """
    rows = tail.shape[-1] - cols  # 𝓗 is rows × cols; one spare tap for the shifted copy
    eye = 1e-14 * torch.eye(order, dtype=tail.dtype, device=tail.device)
    if rows * cols <= _SVD_ELEMENTS:
        # small: the SVD of 𝓗 itself, which keeps singular values the Gram matrix would square away
        left = torch.linalg.svd(tail.unfold(-1, cols, 1)[:, :rows], full_matrices=False)[0][..., :order]  # (H, M, r)
        up, down = left[:, :-1], left[:, 1:]
        return torch.linalg.eigvals(_spd_solve(up.mT @ up + eye, up.mT @ down))  # (H, r)
    ext = _hankel_gram(tail, rows - 1, cols + 1)  # (H, P+1, P+1) over rows 0 .. M-2
    last = tail[:, rows - 1 : rows + cols]  # (H, P+1): row M-1 of the extended Hankel matrix
    top = ext[:, :cols, :cols]  # 𝓗[:-1]ᵀ𝓗[:-1]
    gram = top + last[:, :cols].unsqueeze(-1) * last[:, :cols].unsqueeze(-2)  # 𝓗ᵀ𝓗
    shifted = ext[:, :cols, 1:]  # 𝓗[:-1]ᵀ𝓗[1:]
    evals, evecs = torch.linalg.eigh(gram)  # ascending
    evals, evecs = evals.flip(-1)[..., :order], evecs.flip(-1)[..., :order]  # (H, r), (H, P, r)
    sigma = evals.clamp(min=0).sqrt()
    floor = (sigma[..., :1] * 1e-12).clamp(min=1e-300)
    w = evecs / torch.maximum(sigma, floor).unsqueeze(-2)  # (H, P, r)
    phi = _spd_solve(w.mT @ top @ w + eye, w.mT @ shifted @ w)  # (H, r, r): U[1:] ≈ U[:-1] Φ
    return torch.linalg.eigvals(phi)  # (H, r) conjugate pairs or real


@float32_math
def hankel_singular_values(kernel: torch.Tensor, direct_term: bool = True) -> torch.Tensor:
    """The Hankel singular values ``σ_1 ≥ σ_2 ≥ …`` of each row of ``kernel`` (H, L): (H, T) float32.

    They are those of the FIR system ``K[1:]`` (``T = L - 1``; with ``direct_term=False`` all of ``K``): a fit
    of order ``r = 2N`` real states (N complex modes) has an H∞ error of at least ``σ_{r+1}`` (Adamjan-Arov-Krein)
    and balanced truncation at most ``2 Σ_{k>r} σ_k`` (Enns; Glover 1984), so where they fall off tells how
    many modes a kernel needs. LaughingHyena (Massaroli et al. 2023, arXiv 2310.18780, §3.2) reads the order
    of a Hyena filter from the same spectrum.
    """
    if not isinstance(kernel, torch.Tensor) or kernel.dim() != 2 or kernel.is_complex():
        raise ValueError(f"kernel must be a real 2-D (H, L) tensor; got {getattr(kernel, 'shape', type(kernel))}")
    tail = kernel.detach().double()[:, 1 if direct_term else 0 :]
    if tail.shape[-1] < 1:
        raise ValueError("kernel is too short: it has no taps after the direct term")
    block = max(1, _DENSE_ELEMENTS // tail.shape[-1] ** 2)
    return (
        torch.cat(
            [torch.linalg.eigvalsh(square_hankel(tail[h : h + block])).abs() for h in range(0, tail.shape[0], block)]
        )
        .sort(dim=-1, descending=True)
        .values.float()
    )


def _balanced_poles(basis: torch.Tensor, order: int) -> torch.Tensor:
    """Poles (H, r) of the balanced truncation to ``r = order`` states of the FIR system of the tail.

    Shift-register realisation of the tail: state ``x_t[i] = u_{t-1-i}``, ``A`` the down-shift, ``B = e_0``,
    ``C = tail``. Its controllability Gramian is ``I``, its observability Gramian ``𝓗ᵀ𝓗 = 𝓗²`` (𝓗 the square
    Hankel operator), so the balancing transform is ``Σ^{1/2} Vᵀ`` with ``V`` the singular (here eigen-)vectors
    of 𝓗; the truncated ``A_r = Σ_r^{1/2} V_rᵀ A V_r Σ_r^{-1/2}`` has the eigenvalues of
    ``V_rᵀ A V_r = V_r[1:]ᵀ V_r[:-1]``. Discrete balanced truncation keeps them strictly stable (Pernebo &
    Silverman 1982) with ``‖G − G_r‖_∞ ≤ 2 Σ_{k>r} σ_k``; model-order reduction of long-conv filters as in
    LaughingHyena (arXiv 2310.18780, §3.2).
    """
    v = basis[..., :order]  # (H, T, r): leading Hankel singular vectors
    return torch.linalg.eigvals(v[:, 1:].mT @ v[:, :-1])  # (H, r) conjugate pairs or real


def _circle_poles(channels: int, num_modes: int, decay: float, device) -> tuple[torch.Tensor, ...]:
    """Frequency-sampling poles ``λ_k = ρ·exp(iπ(k + ½)/N)``, ``k < N``, ``ρ = exp(−decay/N)`` ((H, N) each).

    With their conjugates they are ρ times the 2N-th roots of −1, so ``Σ_k c_k λ_k^t`` spans every sequence
    ``ρ^t·p[t]`` with ``p`` anti-periodic of period 2N: a delay ``δ[t − τ]`` with ``τ < 2N`` is fitted up to its
    alias ``ρ^{2N}δ[t − τ − 2N] = e^{−2·decay}·…``. A delay's own realisation is nilpotent (every pole at 0),
    which the Hankel methods cannot store in modal form (poles below MIN_MODULUS are dropped); these poles,
    with least-squares residues, can. (The modal form of a DFT, long-conv paper arXiv 2302.06646 App. D.2.)
    """
    log_modulus = torch.full((channels, num_modes), -decay / num_modes, dtype=torch.float64, device=device)
    phase = ((torch.arange(num_modes, dtype=torch.float64, device=device) + 0.5) * math.pi / num_modes).expand(
        channels, num_modes
    )
    return log_modulus, phase.clone(), torch.ones(channels, num_modes, dtype=torch.bool, device=device)


def _refine_poles(k64: torch.Tensor, fit: ModalKernel, start: int, steps: int, channel_block: int):
    """Gradient refinement of ``fit``'s poles and residues on ``Σ_h ‖K_h[t≥start] − K̂_h‖² / ‖K_h‖²`` (Adam, fp64).

    The kernel error is smooth in ``(log|λ|, arg λ, c)``; the Hankel fits are near-optimal in Hankel norm, not
    in L2, so a local descent from them lowers the L2 error (the rational-fit refinement that LaughingHyena,
    arXiv 2310.18780 §3.2, runs on its filters). ``|λ| ≤ MAX_MODULUS`` through ``log|λ| = log(MAX) − softplus(ρ)``.
    Padding modes (zero residue) take part and may become useful. Each channel keeps its best iterate.
    Returns ``(log_modulus, phase, valid)`` (H, N) for :func:`_finish_fit` (residues are refitted there).
    """
    out = []
    for h0 in range(0, k64.shape[0], channel_block):
        sl = slice(h0, h0 + channel_block)
        target = k64[sl, start:]  # (h, T)
        norm = target.norm(dim=-1, keepdim=True).clamp(min=1e-300)  # (h, 1)
        t = torch.arange(start, k64.shape[-1], dtype=torch.float64, device=k64.device)
        top = math.log(MAX_MODULUS)
        rho = (top - fit.log_modulus[sl].double()).clamp(min=1e-9).expm1().clamp(min=1e-12).log()
        phase = fit.phase[sl].double()
        c = fit.complex_residues()[sl] / norm  # (h, N)
        params = [p.clone().requires_grad_() for p in (rho, phase, c.real, c.imag)]
        optimizer = torch.optim.Adam(params, lr=_REFINE_LR)
        best = torch.full((target.shape[0],), math.inf, dtype=torch.float64, device=k64.device)
        best_lm, best_phase = fit.log_modulus[sl].double().clone(), phase.clone()
        for _ in range(steps + 1):
            log_modulus = top - torch.nn.functional.softplus(params[0])  # (h, N)
            magnitude = torch.exp(log_modulus.unsqueeze(-1) * t)  # (h, N, T): |λ|^t
            angle = params[1].unsqueeze(-1) * t  # (h, N, T): t·arg λ
            # Re(c λ^t) = |λ|^t (Re c·cos(t·arg λ) − Im c·sin(t·arg λ)), real arithmetic (cheaper autograd)
            waves = params[2].unsqueeze(-1) * torch.cos(angle) - params[3].unsqueeze(-1) * torch.sin(angle)
            fitted = (magnitude * waves).sum(-2)  # (h, T)
            error = (target / norm - fitted).pow(2).sum(-1)  # (h,): relative squared error
            better = error.detach() < best
            best = torch.where(better, error.detach(), best)
            best_lm = torch.where(better[:, None], log_modulus.detach(), best_lm)
            best_phase = torch.where(better[:, None], params[1].detach(), best_phase)
            optimizer.zero_grad()
            error.sum().backward()
            optimizer.step()
        # a pole and its conjugate give the same real kernel: store the upper half plane, phase in [0, π]
        out.append((best_lm, torch.atan2(best_phase.sin(), best_phase.cos()).abs()))
    log_modulus, phase = (torch.cat(x) for x in zip(*out))
    return log_modulus, phase, log_modulus >= math.log(MIN_MODULUS)


def _select_modes(poles: torch.Tensor, tail_kernel: torch.Tensor, num_modes: int, start: int):
    """From ESPRIT poles (H, r), keep one of each conjugate pair and the real ones, then the N strongest."""
    # torch.linalg.eigvals does not promise Im λ = 0 exactly for a real eigenvalue (LAPACK's geev gives it, other
    # backends need not), and Im λ = −1e-17 would drop it as the lower half of a pair: what the residue fit treats
    # as real is made real
    poles = torch.where(poles.imag.abs() <= _REAL_SIN * poles.abs(), poles.real.to(poles.dtype), poles)
    modulus = poles.abs().clamp(min=1e-30, max=MAX_MODULUS)
    log_modulus = modulus.log()
    phase = poles.angle()
    # upper half plane (real poles have phase 0 or π); near-zero poles are dropped: they only shape the first
    # taps, and only through residues ~1/|λ| that cancel against the direct term in float32
    valid = (phase >= 0) & (modulus >= MIN_MODULUS)
    phase = phase.clamp(min=0)
    num_valid = valid.sum(-1)
    if bool((num_valid <= num_modes).all()):
        order_idx = torch.argsort((~valid).to(torch.int8), dim=-1, stable=True)[..., :num_modes]  # valid first
    else:
        residues = _fit_residues(tail_kernel, log_modulus, phase, valid, start)  # (H, r)
        span = tail_kernel.shape[-1] - start
        energy = residues.abs() ** 2 * _geometric_sum(2 * log_modulus, torch.zeros_like(phase), start, span).real
        energy = torch.where(valid, energy, -1.0)
        order_idx = torch.argsort(energy, dim=-1, descending=True)[..., :num_modes]
    return tuple(torch.gather(x, -1, order_idx) for x in (log_modulus, phase, valid))


def _check_fit_arguments(kernel, num_modes, method, direct_term, channel_block, eigensolver="truncated") -> None:
    """Every argument of :func:`fit_modal_kernel` checked before any fitting (ValueError naming the bad one)."""
    if not isinstance(kernel, torch.Tensor) or kernel.dim() != 2:
        raise ValueError(f"kernel must be a 2-D (H, L) tensor; got {getattr(kernel, 'shape', type(kernel))}")
    if kernel.is_complex() or not kernel.is_floating_point():
        raise ValueError(f"kernel must be a real floating-point tensor; got {kernel.dtype}")
    if method not in FIT_METHODS:
        raise ValueError(f"method must be one of {FIT_METHODS}; got {method!r}")
    if isinstance(num_modes, bool) or not isinstance(num_modes, int) or num_modes < 1:
        raise ValueError(f"num_modes must be a positive int; got {num_modes!r}")
    length = kernel.shape[-1]
    limit = max_modes(length, direct_term, method)
    if num_modes > limit:
        needed = 4 * num_modes + 1 if method == "hankel" else 2 * num_modes
        raise ValueError(
            f"num_modes={num_modes} is too large for kernels of length {length} with method {method!r}: at most "
            f"{limit} (the fit needs {needed + int(direct_term)} taps)"
        )
    if isinstance(channel_block, bool) or not isinstance(channel_block, int) or channel_block < 1:
        raise ValueError(f"channel_block must be a positive int; got {channel_block!r}")
    if eigensolver not in EIGENSOLVERS:
        raise ValueError(f"eigensolver must be one of {EIGENSOLVERS}; got {eigensolver!r}")
    if not bool(torch.isfinite(kernel).all()):
        raise ValueError("kernel has non-finite entries")


@float32_math
def fit_modal_kernel(
    kernel: torch.Tensor,
    num_modes: int,
    method: str = "hankel",
    direct_term: bool = True,
    hankel_cols: int | None = None,
    channel_block: int = 64,
    refine_steps: int = 300,
    eigensolver: str = "truncated",
) -> ModalKernel:
    """Fit each row of ``kernel`` (H, L) with ``num_modes`` complex exponentials (see the module docstring).

    Args:
        kernel: (H, L) real kernel, one row per channel (e.g. a long-conv ``K`` after Squash/Smooth).
        num_modes: N, the number of complex modes (state size per channel), ``1 ≤ N ≤ max_modes(L, method=...)``.
        method: ``"hankel"`` (ESPRIT poles from a rectangular Hankel matrix, least-squares residues: the reference
            fit), ``"balanced"`` (balanced truncation of the whole Hankel operator, least-squares residues),
            ``"best"`` (per channel the smallest error of hankel, balanced and the frequency-sampling poles of
            :func:`_circle_poles`, each with least-squares residues: never worse than any of them) or
            ``"refined"`` (``"best"``, then its poles refined by gradient descent on the kernel's L2 error,
            ``refine_steps`` Adam steps; never worse than ``"best"``, channel by channel).
        direct_term: fit ``K[0]`` with a separate skip ``d`` (default) instead of with the modes.
        hankel_cols: columns P of the ``"hankel"`` method's matrix (``2N ≤ P ≤ T - 2N - 1``); default
            ``min(max(4N, 128), 256)`` capped to the length. More columns: more averaging, ``O(M·P²)`` per channel.
        channel_block: channels fitted together (bounds memory).
        refine_steps: Adam steps of the ``"refined"`` method.
        eigensolver: how the balanced-truncation candidates get the leading Hankel eigenvectors: ``"truncated"``
            (default: the ``2N`` leading ones from a block Krylov space on the FFT-applied operator,
            :func:`ssmhub.ops.hankel.leading_hankel_eigvecs`, where its basis is at most T/4, else dense) or
            ``"dense"`` (one ``eigh`` of the whole T×T operator per channel, ``O(T³)``: the reference).

    Returns:
        :class:`ModalKernel` on ``kernel.device``, every tensor float32.
    """
    _check_fit_arguments(kernel, num_modes, method, direct_term, channel_block, eigensolver)
    return fit_modal_kernels(
        kernel, [num_modes], method, direct_term, hankel_cols, channel_block, refine_steps, eigensolver
    )[0]


@float32_math
def fit_modal_kernels(
    kernel: torch.Tensor,
    orders: list[int],
    method: str = "balanced",
    direct_term: bool = True,
    hankel_cols: int | None = None,
    channel_block: int = 64,
    refine_steps: int = 300,
    eigensolver: str = "truncated",
) -> list[ModalKernel]:
    """:func:`fit_modal_kernel` at several orders at once (one :class:`ModalKernel` per entry of ``orders``).

    The balanced method's Hankel eigenvectors, the costly part, are computed once for every order (the
    ``2·max(orders)`` leading ones, by ``eigensolver``), in blocks of channels of about the same support (the
    taps before a kernel's trailing zeros, :func:`~ssmhub.ops.hankel.kernel_support`), each block's on its own
    support (:func:`~ssmhub.ops.hankel.balanced_basis`); the fits come back in the kernel's channel order.
    """
    for order in orders:
        _check_fit_arguments(kernel, order, method, direct_term, channel_block, eigensolver)
    start = 1 if direct_term else 0
    by_support = kernel_support(kernel.detach()[:, start:]).argsort(stable=True)  # (H,)
    k64 = kernel.detach().double()[by_support]  # (H, L): channels of shorter support first
    taps = k64.shape[-1] - start
    rank = 2 * max(orders)
    krylov = eigensolver == "truncated" and uses_krylov(rank, taps)
    per_channel = 2 * taps * krylov_dimension(rank, taps) if krylov else taps * taps  # doubles of the basis
    # the bases bound the channels fitted together; the residue fits (small per channel) keep channel_block
    basis_block = max(1, min(channel_block, _DENSE_ELEMENTS // max(1, per_channel)))
    poles = {(m, n): [] for m in ("hankel", "balanced") for n in orders}
    for h0 in range(0, k64.shape[0], basis_block):
        block = k64[h0 : h0 + basis_block]
        basis = balanced_basis(block[:, start:], rank, eigensolver) if method != "hankel" else None  # (h, T, 2N)
        for n in orders:
            if method != "balanced" and n <= max_modes(k64.shape[-1], direct_term, "hankel"):
                cols = min(max(4 * n, 128), 256) if hankel_cols is None else hankel_cols
                cols = max(2 * n, min(cols, taps - 2 * n - 1))
                poles["hankel", n].append(_select_modes(_esprit_poles(block[:, start:], 2 * n, cols), block, n, start))
            if basis is not None:
                poles["balanced", n].append(_select_modes(_balanced_poles(basis, 2 * n), block, n, start))
    fits = []
    for n in orders:
        found = [
            _finish_fit(k64, *(torch.cat(parts) for parts in zip(*poles[m, n])), direct_term, channel_block)
            for m in ("hankel", "balanced")
            if poles[m, n]
        ]
        if method in ("best", "refined"):
            found += [
                _finish_fit(
                    k64, *_circle_poles(k64.shape[0], n, s, k64.device), direct_term, channel_block, shared=True
                )
                for s in CIRCLE_DECAYS
            ]
        best = found[0] if len(found) == 1 else _best_per_channel(*found)
        if method == "refined":
            refined = _refine_poles(k64, best, start, refine_steps, basis_block)  # (h, N, L) autograd tensors
            best = _best_per_channel(best, _finish_fit(k64, *refined, direct_term, channel_block))
        fits.append(best)
    channel_order = by_support.argsort()  # (H,): where each of the kernel's channels went
    return [fit.channels(channel_order) for fit in fits]


def _finish_fit(
    k64, log_modulus, phase, valid, direct_term: bool, channel_block: int, shared: bool = False
) -> ModalKernel:
    """Poles rounded to float32, least-squares residues (float64) for exactly those poles, ``d``, honest error.

    ``log_modulus``, ``phase``, ``valid``: (H, N); ``shared``: the same poles in every channel (their residue
    system is factored once, :func:`_fit_residues`). A channel whose stored fit would be worse than no modes at all
    (``d`` alone) gets no modes.
    """
    channels, length = k64.shape
    start = 1 if direct_term else 0
    # unused (padding) modes: a harmless pole with zero residue
    log_modulus = torch.where(valid, log_modulus, math.log(0.5)).clamp(max=math.log(MAX_MODULUS)).float()
    phase = torch.where(valid, phase, 0.0).float()
    residues = torch.empty(channels, log_modulus.shape[-1], dtype=torch.complex128, device=k64.device)
    for h0 in range(0, channels, channel_block):
        sl = slice(h0, h0 + channel_block)
        residues[sl] = _fit_residues(k64[sl], log_modulus[sl], phase[sl], valid[sl], start, shared)
    residues = residues * valid
    d = (
        (k64[:, 0] - residues.real.sum(-1))
        if direct_term
        else torch.zeros(channels, dtype=torch.float64, device=k64.device)
    )
    partial = ModalKernel(
        log_modulus=log_modulus,
        phase=phase,
        residues=torch.stack([residues.real, residues.imag], dim=-1).float(),
        d=d.float().to(k64.device),
        relative_error=torch.zeros(channels, dtype=torch.float32, device=k64.device),
    )
    fitted = modal_kernel(partial, length).double()
    norm = k64.norm(dim=-1)
    error = (k64 - fitted).norm(dim=-1)
    # safeguard: a channel whose stored fit is worse than no modes at all (only ``d``, or nothing) gets no modes
    k_direct = k64[:, 0].float().double() if direct_term else torch.zeros_like(norm)
    no_modes_error = torch.cat([(k64[:, :1] - k_direct[:, None]), k64[:, 1:]], dim=-1).norm(dim=-1)
    worse = ~(error <= no_modes_error)  # also catches NaN
    residues_out, d_out = partial.residues, partial.d
    if bool(worse.any()):
        residues_out = torch.where(worse[:, None, None], 0.0, residues_out)
        d_out = torch.where(worse, k_direct.float(), d_out)
        error = torch.where(worse, no_modes_error, error)
    relative = torch.where(norm > 0, error / norm.clamp(min=1e-300), error)
    return ModalKernel(partial.log_modulus, partial.phase, residues_out, d_out, relative.float())


def _best_per_channel(*fits: ModalKernel) -> ModalKernel:
    """Channel by channel, the fit with the smallest ``relative_error`` (the first on ties)."""
    best = fits[0]
    for other in fits[1:]:
        better = other.relative_error < best.relative_error  # (H,)
        best = ModalKernel(
            *(
                torch.where(better.view(-1, *[1] * (getattr(best, f).dim() - 1)), getattr(other, f), getattr(best, f))
                for f in best.__dataclass_fields__
            )
        )
    return best


@float32_math
def modal_kernel(modal: ModalKernel, length: int) -> torch.Tensor:
    """The (H, length) float32 kernel ``K̂`` that ``modal`` stands for; phases formed in float64 (mod 2π)."""
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be a positive int; got {length!r}")
    c = modal.complex_residues()  # (H, N)
    # K̂[bS + s] = Re Σ_n (c_n λ_n^{bS}) λ_n^s: O(N·√L) exponentials and one batched matmul
    inner, outer = _blocked_powers(modal.log_modulus, modal.phase, length)  # (H, N, S): λ^s; (H, N, nb): λ^(bS)
    size, blocks = inner.shape[-1], outer.shape[-1]
    outer = outer * c.unsqueeze(-1)  # (H, N, nb): c·λ^(bS)
    kernel = (outer.mT @ inner).real.reshape(modal.num_channels, blocks * size)[:, :length]  # (H, L)
    kernel[:, 0] += modal.d.double()
    return kernel.float()


def modal_init_state(modal: ModalKernel, batch_size: int, device=None) -> torch.Tensor:
    """A zero (B, H, N) complex64 state."""
    return torch.zeros(
        batch_size, modal.num_channels, modal.num_modes, dtype=torch.complex64, device=device or modal.phase.device
    )


def _check_state(state: torch.Tensor, batch: int, channels: int, modes: int, name: str) -> None:
    expected = (batch, channels, modes)
    if tuple(state.shape) != expected:
        raise ValueError(f"{name} must have shape (B, H, N) = {expected}; got {tuple(state.shape)}")


def modal_step_coefficients(modal: ModalKernel) -> dict[str, torch.Tensor]:
    """What every :func:`modal_step` reads that the fit alone fixes, as contiguous float32 planes: ``lambda_re``,
    ``lambda_im`` (H, N), λ formed in float64 and then rounded (:func:`~ssmhub.ops.diagonal_step.polar_parts`),
    ``residue_re``, ``residue_im`` (H, N) and ``d`` (H,). Formed once for many steps (a serving engine's decode
    rows), they keep a compiled step from recomputing λ's float64 exp/cos/sin for every row it fuses them into."""
    lam_re, lam_im = polar_parts(modal.log_modulus, modal.phase)
    residues = modal.residues.float()
    return {
        "lambda_re": lam_re,
        "lambda_im": lam_im,
        "residue_re": residues[..., 0].contiguous(),
        "residue_im": residues[..., 1].contiguous(),
        "d": modal.d.float(),
    }


@float32_math
def modal_step(u_t: torch.Tensor, state: torch.Tensor, modal: ModalKernel) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step, O(H·N): ``x_t = λ ⊙ x_{t-1} + u_t``, ``y_t = Re(Σ_n c_n x_t[n]) + d·u_t``.

    Args: u_t (B, H) real; state (B, H, N) complex64 (``x_{t-1}``; zeros before the first token).
    Returns: y_t (B, H) float32 and the new state (B, H, N) complex64.
    """
    return modal_step_with(u_t, state, modal_step_coefficients(modal))


@float32_math
def modal_step_with(
    u_t: torch.Tensor, state: torch.Tensor, coefficients: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`modal_step` from its :func:`modal_step_coefficients` (the same numbers: the same operations)."""
    channels, modes = coefficients["lambda_re"].shape
    if u_t.dim() != 2 or u_t.shape[-1] != channels:
        raise ValueError(f"u_t must have shape (B, H={channels}); got {tuple(u_t.shape)}")
    _check_state(state, u_t.shape[0], channels, modes, "state")
    lam = (coefficients["lambda_re"], coefficients["lambda_im"])  # (H, N) each
    residues = (coefficients["residue_re"], coefficients["residue_im"])  # (H, N) each
    z_re, _, new_state = diagonal_step(state, lam, u_t, residues)  # (B, H), (B, H, N)
    return z_re + coefficients["d"] * u_t.float(), new_state


@float32_math
def modal_scan(
    u: torch.Tensor,
    modal: ModalKernel,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The recurrence of :func:`modal_step` over a whole sequence in parallel (FFT conv + Vandermonde blocks).

    Args:
        u: (B, H, T) real input.
        modal: the fitted :class:`ModalKernel`.
        initial_state: optional (B, H, N) complex state ``x_{-1}`` carried over from earlier tokens.
        return_final_state: also return ``x_{T-1}`` (to hand a prefill over to :func:`modal_step`).

    Returns:
        ``y`` (B, H, T) float32 and the final state (B, H, N) complex64, or ``None``.
    """
    if u.dim() != 3 or u.shape[1] != modal.num_channels or u.shape[-1] == 0:
        raise ValueError(f"u must have shape (B, H={modal.num_channels}, T ≥ 1); got {tuple(u.shape)}")
    if initial_state is not None:
        _check_state(initial_state, u.shape[0], modal.num_channels, modal.num_modes, "initial_state")
    seq_len = u.shape[-1]
    u = u.float()
    y = fft_conv(u, modal_kernel(modal, seq_len))  # (B, H, T)
    c = modal.complex_residues().to(torch.complex64)  # (H, N)
    batch, channels = u.shape[0], modal.num_channels
    # λ^t for t < T as λ^(kS) · λ^s (t = kS + s, S ≈ √T): O(N·√T) exponentials, not O(N·T)
    inner, outer = (p.to(torch.complex64) for p in _blocked_powers(modal.log_modulus, modal.phase, seq_len))
    size, blocks = inner.shape[-1], outer.shape[-1]  # inner (H, N, S): λ^s; outer (H, N, K): λ^(kS)
    if initial_state is not None:
        # y_t += Re(Σ_n c_n λ_n^{t+1} x_{-1,n}): unrolling the recurrence back to x_{-1}
        lam = torch.polar(torch.exp(modal.log_modulus.double()), modal.phase.double()).to(torch.complex64)
        weighted = c * lam * initial_state.to(torch.complex64)  # (B, H, N): c λ x_{-1}
        carried = torch.einsum("bhn,hnk,hns->bhks", weighted, outer, inner)  # (B, H, K, S): t = kS + s
        y = y + carried.reshape(batch, channels, blocks * size)[..., :seq_len].real  # (B, H, T)
    final_state = None
    if return_final_state:
        # x_{T-1} = λ^T x_{-1} + Σ_m λ^m u_{T-1-m}: the inputs reversed, in blocks m = kS + s
        reversed_u = torch.nn.functional.pad(u.flip(-1), (0, blocks * size - seq_len))  # (B, H, K·S)
        reversed_u = reversed_u.view(batch, channels, blocks, size).to(torch.complex64)  # (B, H, K, S)
        partial = torch.einsum("bhks,hns->bhkn", reversed_u, inner)  # (B, H, K, N)
        final_state = torch.einsum("bhkn,hnk->bhn", partial, outer)  # (B, H, N)
        if initial_state is not None:
            lam_t = _powers64(modal.log_modulus, modal.phase, seq_len, 1)[..., 0].to(torch.complex64)  # (H, N)
            final_state = final_state + lam_t * initial_state.to(torch.complex64)
    return y, final_state


def modal_scan_ref(
    u: torch.Tensor,
    modal: ModalKernel,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reference for :func:`modal_scan` / :func:`modal_step`: the recurrence one token at a time, complex128."""
    lam = modal.poles()  # (H, N)
    c = modal.complex_residues()  # (H, N)
    d = modal.d.double()
    batch, channels, seq_len = u.shape
    state = torch.zeros(batch, channels, modal.num_modes, dtype=torch.complex128, device=u.device)
    if initial_state is not None:
        state = state + initial_state.to(torch.complex128)
    outputs = []
    for t in range(seq_len):
        u_t = u[..., t].double()  # (B, H)
        state = lam * state + u_t.unsqueeze(-1)
        outputs.append((state * c).sum(-1).real + d * u_t)
    y = torch.stack(outputs, dim=-1).float()
    return y, (state.to(torch.complex64) if return_final_state else None)
