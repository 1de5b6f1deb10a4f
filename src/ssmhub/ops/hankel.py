"""The square Hankel operator of an FIR kernel tail, applied by FFT, and its leading eigenpairs without forming it.

Balanced truncation of the FIR system of a kernel tail ``K[1:]`` (``T`` taps) needs the leading ``r = 2N``
singular vectors of its T×T Hankel operator ``𝓗[i, j] = tail[i + j]`` (zero for ``i + j ≥ T``): LaughingHyena
(Massaroli et al. 2023, arXiv 2310.18780, §3.2) reduces long-conv filters this way. ``𝓗`` is real symmetric, so
they are its eigenvectors of largest ``|eigenvalue|``. A dense ``eigh`` costs ``O(T³)`` per channel (≈ 3 s at T 2047
on one core); ``𝓗`` applied to a vector is a cross-correlation, ``O(T log T)`` by FFT, so the leading part comes
from a randomized block Krylov space ``span{𝓗Ω, 𝓗²Ω, …}`` (Ω Gaussian, seeded) and a Rayleigh-Ritz step (Musco &
Musco 2015, arXiv 1504.05477, Algorithm 2, in its symmetric form; the range finder of Halko, Martinsson & Tropp
2011, arXiv 0909.4061, §4, with every power kept), batched over channels: large FFTs and batched matmuls,
``O(T·m²)`` per channel for a basis of m columns, instead of one eigendecomposition per channel.

Accuracy: a Krylov space converges fast to the eigenvectors of well separated leading eigenvalues; kernels whose
Hankel singular values fall off (trained, smoothed kernels) are fitted as with the dense route (the tests hold the
fit errors within 1%), noise-like kernels (slowly decaying values, a random init) get a less accurate basis and fits
a few percent worse at N = 64 (benchmarks/results/h3_distillation_speed.md). :func:`dense_hankel_eigvecs` is the
oracle (``eigensolver="dense"`` in :func:`ssmhub.ops.modal.fit_modal_kernels`).
"""

from __future__ import annotations

import torch

__all__ = [
    "EIGENSOLVERS",
    "balanced_basis",
    "dense_hankel_eigvecs",
    "hankel_apply",
    "hankel_spectrum",
    "krylov_dimension",
    "leading_hankel_eigvecs",
    "square_hankel",
    "uses_krylov",
]

EIGENSOLVERS = ("truncated", "dense")

DEFAULT_BLOCK = 32  # columns added to the Krylov basis per product with 𝓗
_SEED = 0  # the random test matrix is seeded: the same kernels always give the same basis
_DEFICIENT = 1e-10  # a QR column below this fraction of the block's size is a direction the basis already has


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


def uses_krylov(rank: int, taps: int) -> bool:
    """Whether ``eigensolver="truncated"`` takes the Krylov route: when its basis is at most a quarter of T (below
    that the dense ``eigh`` costs about as much and is exact)."""
    return 4 * krylov_dimension(rank, taps) <= taps


def balanced_basis(tail: torch.Tensor, rank: int, eigensolver: str = "truncated") -> torch.Tensor:
    """The ``rank`` leading Hankel eigenvectors (H, T, rank) of ``tail`` (H, T), by ``eigensolver``.

    ``"truncated"``: :func:`leading_hankel_eigvecs` where :func:`uses_krylov`, else the dense route;
    ``"dense"``: :func:`dense_hankel_eigvecs`, always.
    """
    if eigensolver == "truncated" and uses_krylov(rank, tail.shape[-1]):
        return leading_hankel_eigvecs(tail, rank)[1]
    return dense_hankel_eigvecs(tail)[1][..., :rank]


def hankel_spectrum(tail: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(rfft(tail, n), n)`` with ``n ≥ 2T − 1`` a power of two: what :func:`hankel_apply` multiplies with."""
    size = 1 << max(0, 2 * tail.shape[-1] - 2).bit_length()
    return torch.fft.rfft(tail, n=size), size


def hankel_apply(spectrum: torch.Tensor, size: int, vectors: torch.Tensor) -> torch.Tensor:
    """``𝓗 @ vectors`` for each channel, by FFT: (H, T, k) -> (H, T, k), ``O(k·T log T)`` per channel.

    ``(𝓗x)[i] = Σ_j tail[i + j] x[j]`` is a cross-correlation: with both zero-padded to ``size ≥ 2T − 1``,
    ``irfft(conj(X)·K)[i]`` is it exactly (no index ``i + j ≤ 2T − 2`` wraps, and ``tail`` is zero from T on).
    """
    taps = vectors.shape[-2]
    columns = torch.fft.rfft(vectors.mT, n=size)  # (H, k, n/2+1)
    image = torch.fft.irfft(columns.conj() * spectrum.unsqueeze(-2), n=size)[..., :taps]  # (H, k, T)
    return image.mT  # (H, T, k)


def _project_out(block: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``block`` (H, T, b) minus its projection on the orthonormal ``rows`` (H, m, T), twice ("twice is enough")."""
    for _ in range(2):
        block = block - rows.mT @ (rows @ block)  # (H, T, b)
    return block


def _orthogonal_block(block: torch.Tensor, rows: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Orthonormal columns (H, T, b) spanning ``block`` (H, T, b) with the basis ``rows`` (H, m, T) projected out.

    Block classical Gram-Schmidt twice, then Householder QR. A column that is (numerically) in the span of the
    basis and the block's earlier columns (a kernel of low Hankel rank, or a zero kernel) is replaced by a seeded
    random one, projected out the same way: the basis stays orthonormal, it only grows beyond the Krylov space.
    """
    size = block.norm(dim=-2).amax(-1, keepdim=True)  # (H, 1)
    q, r = torch.linalg.qr(_project_out(block, rows))
    deficient = torch.diagonal(r, dim1=-2, dim2=-1).abs() <= _DEFICIENT * size  # (H, b)
    if bool(deficient.any()):
        noise = torch.randn(block.shape, generator=generator, dtype=block.dtype, device=block.device)
        q = torch.linalg.qr(_project_out(torch.where(deficient.unsqueeze(-2), noise, q), rows)).Q
    return q


def krylov_dimension(rank: int, taps: int) -> int:
    """Default size of the Krylov basis for ``rank`` eigenpairs: ``2·rank``, at least ``rank + 64``, at most T."""
    return min(taps, max(2 * rank, rank + 64))


def leading_hankel_eigvecs(
    tail: torch.Tensor, rank: int, dimension: int | None = None, block_size: int = DEFAULT_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``rank`` leading Hankel singular values (H, rank), descending, and eigenvectors (H, T, rank) of ``tail``.

    The same quantities as the first ``rank`` columns of the dense ``eigh`` of :func:`square_hankel`, from a
    randomized block Krylov space ``span{𝓗Ω, 𝓗²Ω, …}`` of ``dimension`` columns (default
    :func:`krylov_dimension`) grown ``block_size`` columns at a time from a seeded Gaussian ``Ω``, and a
    Rayleigh-Ritz step; every product goes through :func:`hankel_apply` (see the module docstring). An
    eigenvector's sign is arbitrary, as with a dense ``eigh``.
    """
    channels, taps = tail.shape
    _check_solver_arguments(rank, dimension, block_size, taps)
    dimension = krylov_dimension(rank, taps) if dimension is None else dimension
    block_size = min(block_size, dimension)
    spectrum, size = hankel_spectrum(tail)
    generator = torch.Generator(device=tail.device).manual_seed(_SEED)
    probes = torch.randn(taps, block_size, generator=generator, dtype=tail.dtype, device=tail.device)  # (T, b)
    rows = tail.new_empty(channels, dimension, taps)  # (H, m, T): Qᵀ, filled block by block (contiguous slices)
    images = tail.new_empty(channels, taps, dimension)  # (H, T, m): 𝓗Q, for the next block and Rayleigh-Ritz
    block = hankel_apply(spectrum, size, probes.expand(channels, taps, block_size))  # (H, T, b)
    block = _orthogonal_block(block, rows[:, :0], generator)
    for start in range(0, dimension, block_size):
        stop = min(dimension, start + block_size)
        rows[:, start:stop] = block[..., : stop - start].mT
        images[..., start:stop] = hankel_apply(spectrum, size, block[..., : stop - start])
        if stop < dimension:
            block = _orthogonal_block(images[..., start:stop], rows[:, :stop], generator)
    projected = rows @ images  # (H, m, m): Qᵀ𝓗Q
    evals, evecs = torch.linalg.eigh(0.5 * (projected + projected.mT))
    order = evals.abs().argsort(dim=-1, descending=True)[..., :rank]  # (H, r)
    sigma = torch.gather(evals.abs(), -1, order)
    ritz = torch.gather(evecs, -1, order.unsqueeze(-2).expand(channels, dimension, rank))  # (H, m, r)
    return sigma, rows.mT @ ritz  # (H, r), (H, T, r)


def _check_solver_arguments(rank, dimension, block_size, taps: int) -> None:
    """ValueError naming the bad argument of :func:`leading_hankel_eigvecs`, before any work."""
    for name, value in (("rank", rank), ("block_size", block_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int; got {value!r}")
    if rank > taps:
        raise ValueError(f"rank must be at most the number of taps T = {taps}; got {rank}")
    if dimension is not None and (
        isinstance(dimension, bool) or not isinstance(dimension, int) or not rank <= dimension <= taps
    ):
        raise ValueError(f"dimension must be an int in [rank, T] = [{rank}, {taps}] or None; got {dimension!r}")
