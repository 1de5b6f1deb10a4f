"""The square Hankel operator of an FIR kernel tail, applied by FFT, and its leading eigenpairs without forming it.

Balanced truncation of the FIR system of a kernel tail ``K[1:]`` (``T`` taps) needs the leading ``r = 2N``
singular vectors of its T×T Hankel operator ``𝓗[i, j] = tail[i + j]`` (zero for ``i + j ≥ T``): LaughingHyena
(Massaroli et al. 2023, arXiv 2310.18780, §3.2) reduces long-conv filters this way. ``𝓗`` is real symmetric, so
they are its eigenvectors of largest ``|eigenvalue|``. A dense ``eigh`` costs ``O(T³)`` per channel (≈ 3 s at T 2047
on one core); ``𝓗`` applied to a vector is a cross-correlation, ``O(T log T)`` by FFT, so the leading part comes
from a randomized block Krylov space ``span{𝓗Ω, 𝓗²Ω, …}`` (Ω Gaussian, seeded) and a Rayleigh-Ritz step (Musco &
Musco 2015, arXiv 1504.05477, Algorithm 2, in its symmetric form; the range finder of Halko, Martinsson & Tropp
2011, arXiv 0909.4061, §4, with every power kept), batched over channels: large FFTs and batched matmuls,
``O(T·m²)`` per channel for a basis of m columns, instead of one eigendecomposition per channel. The basis is
built by block Lanczos with full reorthogonalisation (:func:`_lanczos_basis`), whose Gram-Schmidt coefficients
are the Rayleigh-Ritz matrix; the default basis is ``2.5·r`` columns in blocks of ``r/8`` (a Krylov degree of 20),
and on operators of at least ``10·r`` taps ``2.5·r + 96`` columns in blocks of ``r/16`` (a degree of 52 at r 128).
A kernel that is zero from tap S on (a regularized kernel's soft threshold zeroes its small taps) has ``𝓗`` zero
outside its leading S×S block, so the eigenvectors come from that block, padded with zeros
(:func:`balanced_basis`): the Krylov route on S taps, or the dense ``eigh`` where a basis would be over half of S.
The basis, its FFT products and its matmuls are float32 by default (:data:`KRYLOV_DTYPE`: twice the throughput;
the Rayleigh-Ritz ``eigh`` stays in the tail's precision, float64 in the fits, where a float32 one made a fast
decaying kernel's balanced fit 6% worse than the dense route's). Measured at T 2047, N 64, its ``best`` fits are
those of a float64 basis to 0.01% per channel and its ``balanced`` ones the same or better.

Accuracy: a Krylov space converges fast to the eigenvectors of well separated leading eigenvalues; kernels whose
Hankel singular values fall off (trained, smoothed kernels, and decaying noise kernels up to decays of ~400 taps
at T 2047, N 64) are fitted as with the dense route (within 1%: tests/ops/test_hankel.py). Kernels whose values
barely fall (decays of 1000-3000 taps at T 2047; a random init: σ_128 ≈ 0.65·σ_1) have a poorly separated leading
subspace, which a space of degree 20 does not reach: it left about half of a random-init H3's long-support
channels 1-3.3% worse than the dense route at N 64 (as much with a float64 basis as with float32); the larger
basis of higher degree on long operators (:func:`krylov_dimension`) brings them within 1% (measured in
benchmarks/results/h3_distillation_speed.md).
:func:`dense_hankel_eigvecs` is the oracle (``eigensolver="dense"`` in :func:`ssmhub.ops.modal.fit_modal_kernels`).
"""

from __future__ import annotations

import torch

from .precision import float32_matmul_precision

__all__ = [
    "EIGENSOLVERS",
    "KRYLOV_DTYPE",
    "LONG_TAPS_PER_RANK",
    "balanced_basis",
    "dense_hankel_eigvecs",
    "hankel_apply",
    "hankel_spectrum",
    "kernel_support",
    "krylov_block_size",
    "krylov_dimension",
    "leading_hankel_eigvecs",
    "square_hankel",
    "uses_krylov",
]

EIGENSOLVERS = ("truncated", "dense")

MAX_BLOCK = 16  # most columns added to the Krylov basis per product with 𝓗 (see krylov_block_size)
LONG_TAPS_PER_RANK = 10  # from T = 10·rank on, a larger Krylov basis of higher degree (see krylov_dimension)
_SEED = 0  # the random test matrix is seeded: the same kernels always give the same basis
KRYLOV_DTYPE = torch.float32  # the default precision of the Krylov basis and its products (leading_hankel_eigvecs)
# by the basis's dtype: a QR row below this fraction of the size of the block entering its last projection is
# projected again (its rounding, ~eps·√T of that size, is magnified by the row's inverse; see _orthonormal_rows)
_SECOND_PASS = {torch.float64: 1e-3, torch.float32: 1e-1}
# by the basis's dtype: a QR row below this fraction of the image's size is a direction the basis already has
_DEFICIENT = {torch.float64: 1e-10, torch.float32: 1e-5}


def square_hankel(tail: torch.Tensor) -> torch.Tensor:
    """The dense T×T Hankel operator of the FIR tail (H, T): ``𝓗[i, j] = tail[i + j]`` for ``i + j < T``, else 0.

    (H, T, T), symmetric: its singular values are the moduli of its eigenvalues (the Hankel singular values).
    """
    taps = tail.shape[-1]
    return torch.nn.functional.pad(tail, (0, taps)).unfold(-1, taps, 1)[:, :taps]  # (H, T, T)


def dense_hankel_eigvecs(tail: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Hankel singular values (H, T), descending, and the matching eigenvectors (H, T, T) of :func:`square_hankel`.

    One dense ``eigh`` per channel, ``O(T³)``: the reference for :func:`leading_hankel_eigvecs`.
    """
    evals, evecs = torch.linalg.eigh(square_hankel(tail))  # ascending eigenvalues of the symmetric 𝓗
    order = evals.abs().argsort(dim=-1, descending=True)  # (H, T)
    sigma = torch.gather(evals.abs(), -1, order)
    return sigma, torch.gather(evecs, -1, order.unsqueeze(-2).expand_as(evecs))


def kernel_support(tail: torch.Tensor) -> torch.Tensor:
    """Each channel's support (H,) int64: its taps up to the last nonzero one (0 for a zero row).

    Beyond the support ``S`` the square Hankel operator has only zero rows and columns (``tail[i + j] = 0`` for
    ``i + j ≥ S``), so ``𝓗 = diag(𝓗_S, 0)`` exactly and its eigenvectors of nonzero eigenvalue are those of the
    S×S operator padded with zeros (:func:`balanced_basis`). A regularized kernel is zero from some tap on: its
    soft threshold sets small taps to zero (the long-conv paper, arXiv 2302.06646 §3.1).
    """
    nonzero = tail != 0  # (H, T)
    last = tail.shape[-1] - nonzero.flip(-1).to(torch.int8).argmax(-1)  # (H,): one past the last nonzero tap
    return torch.where(nonzero.any(-1), last, 0)


def uses_krylov(rank: int, taps: int) -> bool:
    """Whether ``eigensolver="truncated"`` takes the Krylov route on ``taps`` taps: when its basis
    (:func:`krylov_dimension`) is at most half of them. Below that, the dense ``eigh``: exact, and within a few
    times the Krylov route's cost (one channel's eigenvectors at rank 128, one core: 13 ms at T 320 against 22, 57
    at T 512 against 22, 74 at T 640 against 26; a whole balanced fit at T 1024: 312 ms against 42).
    """
    return 2 * krylov_dimension(rank, taps) <= taps


def balanced_basis(tail: torch.Tensor, rank: int, eigensolver: str = "truncated") -> torch.Tensor:
    """The ``rank`` leading Hankel eigenvectors (H, T, rank) of ``tail`` (H, T), by ``eigensolver``.

    ``"truncated"``: on the channels' largest support ``S`` (:func:`kernel_support`, at least ``rank``), the
    eigenvectors of the S×S operator padded with zeros (those of the T×T one: 𝓗 is zero outside it), by
    :func:`leading_hankel_eigvecs` where :func:`uses_krylov` at S, else by the dense ``eigh``;
    ``"dense"``: :func:`dense_hankel_eigvecs` of the whole T×T operator, always (the reference).
    """
    taps = tail.shape[-1]
    if eigensolver == "dense":
        return dense_hankel_eigvecs(tail)[1][..., :rank]
    support = min(taps, max(rank, int(kernel_support(tail).max())))
    head = tail[:, :support]  # (H, S): every tap from S on is zero
    if uses_krylov(rank, support):
        vectors = leading_hankel_eigvecs(head, rank)[1]  # (H, S, rank)
    else:
        vectors = dense_hankel_eigvecs(head)[1][..., :rank]
    return torch.nn.functional.pad(vectors, (0, 0, 0, taps - support))  # (H, T, rank)


def hankel_spectrum(tail: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(rfft(tail, n), n)`` with ``n ≥ 2T − 1`` a power of two: what :func:`hankel_apply` multiplies with."""
    size = 1 << max(0, 2 * tail.shape[-1] - 2).bit_length()
    return torch.fft.rfft(tail, n=size), size


def hankel_apply(spectrum: torch.Tensor, size: int, vectors: torch.Tensor) -> torch.Tensor:
    """``𝓗 @ vectors`` for each channel, by FFT: (H, T, k) -> (H, T, k), ``O(k·T log T)`` per channel.

    ``(𝓗x)[i] = Σ_j tail[i + j] x[j]`` is a cross-correlation: with both zero-padded to ``size ≥ 2T − 1``,
    ``irfft(conj(X)·K)[i]`` is it exactly (no index ``i + j ≤ 2T − 2`` wraps, and ``tail`` is zero from T on).
    """
    return _hankel_rows(spectrum.conj().resolve_conj(), size, vectors.mT).mT


def _hankel_rows(conj_spectrum: torch.Tensor, size: int, rows: torch.Tensor) -> torch.Tensor:
    """:func:`hankel_apply` on vectors stored as rows: (H, b, T) -> (H, b, T), ``conj_spectrum = conj(rfft(tail))``.

    Contiguous rows need no transposed copy for the FFTs; ``rows`` may also be (b, T), one set for every channel.
    """
    return _hankel_from_rfft(conj_spectrum, size, torch.fft.rfft(rows, n=size), rows.shape[-1])


def _hankel_from_rfft(conj_spectrum: torch.Tensor, size: int, columns: torch.Tensor, taps: int) -> torch.Tensor:
    """𝓗x from ``X = rfft(x, size)`` (…, b, size/2+1): ``irfft(conj(X)·K) = reverse(irfft(X·conj K))`` (a real
    signal's conjugate spectrum is its time reversal, index ``i -> −i mod size``): (H, b, T)."""
    reverse = torch.fft.irfft(columns * conj_spectrum.unsqueeze(-2), n=size)  # (H, b, n): [−i mod n] = (𝓗x)[i]
    return torch.cat([reverse[..., :1], reverse[..., size - taps + 1 :].flip(-1)], dim=-1)  # (H, b, T)


def _orthonormal_rows(
    block: torch.Tensor, rows: torch.Tensor, scale: torch.Tensor, entering: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """Orthonormal rows (H, b, T) spanning ``block`` (H, b, T), already projected off the basis ``rows`` (H, m, T).

    Householder QR. The last projection pass left components of about ``eps·√T·entering`` on the basis
    (``entering`` (H,): the size of the block that entered that pass; ``eps`` of the block's dtype); a row of the
    QR whose diagonal is small against ``entering`` (below ``_SECOND_PASS``) has them magnified by its inverse, so
    in those channels only the QR's rows, whose components on the basis are then at most ``eps·√T/_SECOND_PASS``,
    are projected off the basis once more ("twice is enough", the criterion of Daniel, Gragg, Kaufman & Stewart
    1976) and orthonormalised again (measured at T 2047, m 320: orthonormal to 3e-10 in float64, 4e-5 in float32).
    A row whose diagonal is at most ``_DEFICIENT·scale`` (``scale`` (H,): the size of the image before any
    projection) is (numerically) in the span of the basis and the block's earlier rows (a converged Krylov space, a
    kernel of low Hankel rank, a zero kernel): it is replaced by a seeded random one first, so the basis stays
    orthonormal and only grows beyond the Krylov space.
    """
    q, r = torch.linalg.qr(block.mT)  # (H, T, b), (H, b, b)
    q = q.mT  # (H, b, T)
    diagonal = torch.diagonal(r, dim1=-2, dim2=-1).abs()  # (H, b)
    deficient = diagonal <= _DEFICIENT[block.dtype] * scale.unsqueeze(-1)  # (H, b)
    second = deficient | (diagonal <= _SECOND_PASS[block.dtype] * entering.unsqueeze(-1))  # (H, b)
    channels = second.any(-1).nonzero().squeeze(-1)  # (h,)
    if channels.numel():
        channels = slice(None) if channels.numel() == q.shape[0] else channels  # every channel: no gathered copy
        redo = q[channels]  # (h, b, T)
        if bool(deficient.any()):
            noise = torch.randn(block.shape[-2:], generator=generator, dtype=block.dtype, device=block.device)
            redo = torch.where(deficient[channels].unsqueeze(-1), noise, redo)  # (h, b, T)
        basis = rows[channels]  # (h, m, T)
        redo = redo - (redo @ basis.mT) @ basis  # (h, b, T): the second pass
        q[channels] = torch.linalg.qr(redo.mT).Q.mT
    return q


def _long(rank: int, taps: int) -> bool:
    """Whether an operator of ``taps`` taps is long for ``rank`` eigenpairs (at least :data:`LONG_TAPS_PER_RANK`·rank
    taps): there a kernel whose Hankel singular values barely fall needs a Krylov space of higher degree."""
    return taps >= LONG_TAPS_PER_RANK * rank


def krylov_dimension(rank: int, taps: int) -> int:
    """Default size of the Krylov basis for ``rank`` eigenpairs, at most T: ``2.5·rank`` (at least ``rank + 64``),
    and on long operators (:func:`_long`) ``2.5·rank + 96``.

    At N = 64 (rank 128, T 2047) a basis of 320 columns in blocks of 16 kept the ``best`` fits of decaying noise
    kernels within 1% of the dense route's, where 256 columns (or blocks of 32) did not (up to +7.5%). On kernels
    whose values barely fall (a random-init H3's, support ≥ 1280 taps) it left 16 of 32 channels 1-3.3% worse;
    416 columns in blocks of 8 (a degree of 52) kept all 32 within +0.63% (N = 32: 256 columns in blocks of 4,
    +0.61%, where 160 in blocks of 8 left 18 of 32 up to +3.3%). Below 10·rank taps (T 640-1279 at N = 64) the
    smaller basis already matched the dense fits (within +0.01%, 32 random-init channels).
    """
    size = 5 * rank // 2 + 96 if _long(rank, taps) else max(5 * rank // 2, rank + 64)
    return min(taps, size)


def krylov_block_size(rank: int, taps: int) -> int:
    """Default columns per Krylov block for ``rank`` eigenpairs: ``rank/8`` within [4, MAX_BLOCK], ``rank/16``
    (at least 4) on long operators (:func:`_long`).

    With :func:`krylov_dimension` that is a Krylov degree (products with 𝓗) of about 20 whatever the rank, and on
    long operators 52 at N = 64, 64 at N = 32: on decaying noise kernels the fits at N = 32 (rank 64, 160 columns)
    needed blocks of 8, at N = 64 blocks of 16 (blocks of 16 at N = 32 and of 32 at N = 64 left fits up to 5% worse
    than the dense route's); random-init kernels of long support need the higher degree (:func:`krylov_dimension`).
    """
    return max(4, min(MAX_BLOCK, rank // (16 if _long(rank, taps) else 8)))


def leading_hankel_eigvecs(
    tail: torch.Tensor,
    rank: int,
    dimension: int | None = None,
    block_size: int | None = None,
    krylov_dtype: torch.dtype | None = KRYLOV_DTYPE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``rank`` leading Hankel singular values (H, rank), descending, and eigenvectors (H, T, rank) of ``tail``.

    The same quantities as the first ``rank`` columns of the dense ``eigh`` of :func:`square_hankel`, from a
    randomized block Krylov space ``span{𝓗Ω, 𝓗²Ω, …}`` of ``dimension`` columns (default
    :func:`krylov_dimension`) grown ``block_size`` columns at a time (default :func:`krylov_block_size`) from a
    seeded Gaussian ``Ω``, and a Rayleigh-Ritz step; every product with 𝓗 goes through the FFT (see the module
    docstring). The basis is built by block Lanczos with full reorthogonalisation (:func:`_lanczos_basis`), which
    also yields the projected matrix ``Qᵀ𝓗Q``. An eigenvector's sign is arbitrary, as with a dense ``eigh``.

    ``krylov_dtype`` (default :data:`KRYLOV_DTYPE`, float32; ``None``: the tail's dtype) is the precision of the
    basis, its products with 𝓗 and the Ritz vectors' product; the ``eigh`` of ``Qᵀ𝓗Q`` is in the tail's. float32
    gives the singular values and vectors to ~1e-5·σ₁ (float64: ~1e-12·σ₁), and the fits of
    :func:`ssmhub.ops.modal.fit_modal_kernels` within 1% of the dense route's where float64 did (tests/ops/
    test_hankel.py; benchmarks/results/h3_distillation_speed.md).
    """
    channels, taps = tail.shape
    _check_solver_arguments(rank, dimension, block_size, taps)
    dimension = krylov_dimension(rank, taps) if dimension is None else dimension
    block_size = min(dimension, krylov_block_size(rank, taps) if block_size is None else block_size)
    with float32_matmul_precision("highest"):  # a float32 basis needs float32 products, not TF32 or bfloat16 passes
        rows, projected = _lanczos_basis(tail, dimension, block_size, krylov_dtype)  # (H, m, T), (H, m, m)
        evals, evecs = torch.linalg.eigh(projected.to(tail.dtype))
        order = evals.abs().argsort(dim=-1, descending=True)[..., :rank]  # (H, r)
        sigma = torch.gather(evals.abs(), -1, order)
        ritz = torch.gather(evecs, -1, order.unsqueeze(-2).expand(channels, dimension, rank))  # (H, m, r)
        vectors = (ritz.mT.to(rows.dtype) @ rows).to(tail.dtype)  # (H, r, T): rows, the faster product layout
    return sigma, vectors.mT  # (H, r), (H, T, r)


def _lanczos_basis(
    tail: torch.Tensor, dimension: int, block_size: int, dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """An orthonormal basis ``Qᵀ`` (H, m, T) of the block Krylov space of 𝓗 from ``𝓗Ω`` and ``Qᵀ𝓗Q`` (H, m, m).

    Block Lanczos with full reorthogonalisation (Golub & Van Loan, Matrix Computations, 4th ed., §10.3.6 and
    §10.3.8): the image ``𝓗Q_j`` of each block loses its components on the last two blocks (the three-term
    recurrence: in exact arithmetic it has no others), then one classical Gram-Schmidt pass against the whole basis
    removes what rounding left there, then QR gives the next block (:func:`_orthonormal_rows`, which projects again
    only the channels where that was not enough). Half the work of Gram-Schmidt twice against the whole basis, and
    the coefficients of both passes are the row ``Q_jᵀ𝓗Q_{≤j}`` of the projected matrix, which therefore costs no
    ``T·m²`` product of its own. Rows are stored as (H, m, T), the layout in which the FFTs need no transposed copy.

    ``dtype`` (default: the tail's): the precision of the basis, the FFT products and the Gram-Schmidt matmuls (the
    tail's spectrum is taken in the tail's precision and rounded once). float32 halves their cost (twice the
    AVX2 throughput, half the memory traffic) and gives ``Qᵀ𝓗Q`` to ~1e-5·‖𝓗‖ (the basis's orthogonality, see
    :func:`_orthonormal_rows`) instead of ~1e-14·‖𝓗‖.
    """
    channels, taps = tail.shape
    dtype = tail.dtype if dtype is None else dtype
    spectrum, size = hankel_spectrum(tail)
    conj_spectrum = spectrum.conj().resolve_conj().to(dtype.to_complex())
    generator = torch.Generator(device=tail.device).manual_seed(_SEED)
    probes = torch.randn(taps, block_size, generator=generator, dtype=tail.dtype, device=tail.device).mT.to(dtype)
    # the probes are the same for every channel: one FFT of them serves all
    image = _hankel_from_rfft(conj_spectrum, size, torch.fft.rfft(probes, n=size), taps)  # (H, b, T)
    rows = tail.new_empty(channels, dimension, taps, dtype=dtype)  # (H, m, T): Qᵀ, filled block by block
    projected = tail.new_zeros(channels, dimension, dimension, dtype=dtype)  # (H, m, m): Qᵀ𝓗Q
    scale = image.norm(dim=-1).amax(-1)  # (H,)
    rows[:, :block_size] = _orthonormal_rows(image, rows[:, :0], scale, scale, generator)
    for start in range(0, dimension, block_size):
        stop = min(dimension, start + block_size)
        image = _hankel_rows(conj_spectrum, size, rows[:, start:stop])  # (H, b, T): (𝓗Q_j)ᵀ
        scale = image.norm(dim=-1).amax(-1)  # (H,)
        near = max(0, start - block_size)  # the last two blocks: Q_{j-1}, Q_j
        local = image @ rows[:, near:stop].mT  # (H, b, ≤2b)
        image = torch.baddbmm(image, local, rows[:, near:stop], alpha=-1)  # image − local·Q_near (one pass)
        entering = image.norm(dim=-1).amax(-1)  # (H,): the size the last pass's rounding is relative to
        coefficients = image @ rows[:, :stop].mT  # (H, b, stop): what rounding left on the whole basis
        image = torch.baddbmm(image, coefficients, rows[:, :stop], alpha=-1)
        coefficients[..., near:stop] += local  # Q_jᵀ𝓗Q_{≤j}
        projected[:, start:stop, :stop] = coefficients
        projected[:, :start, start:stop] = coefficients[..., :start].mT
        if stop < dimension:
            following = min(dimension, stop + block_size) - stop
            block = _orthonormal_rows(image, rows[:, :stop], scale, entering, generator)  # (H, b, T)
            rows[:, stop : stop + following] = block[:, :following]
    return rows, 0.5 * (projected + projected.mT)


def _check_solver_arguments(rank, dimension, block_size, taps: int) -> None:
    """ValueError naming the bad argument of :func:`leading_hankel_eigvecs`, before any work."""
    for name, value in (("rank", rank), ("block_size", 1 if block_size is None else block_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int; got {value!r}")
    if rank > taps:
        raise ValueError(f"rank must be at most the number of taps T = {taps}; got {rank}")
    if dimension is not None and (
        isinstance(dimension, bool) or not isinstance(dimension, int) or not rank <= dimension <= taps
    ):
        raise ValueError(f"dimension must be an int in [rank, T] = [{rank}, {taps}] or None; got {dimension!r}")
