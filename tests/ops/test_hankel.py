"""ops/hankel.py: the FFT-applied Hankel operator against the dense matrix, and the truncated (block Krylov)
eigensolver and the fits built on it against the dense ``eigh`` (the oracle)."""

import pytest
import torch

from ssmhub.ops.hankel import (
    _lanczos_basis,
    dense_hankel_eigvecs,
    hankel_apply,
    hankel_spectrum,
    krylov_dimension,
    leading_hankel_eigvecs,
    square_hankel,
    uses_krylov,
)
from ssmhub.ops.modal import fit_modal_kernel, fit_modal_kernels

EPS64 = torch.finfo(torch.float64).eps


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _smooth_decaying(channels, length, tau, seed=0):
    """``randn·exp(-t/τ)`` smoothed by a width-3 moving average (float64): a trained long-conv kernel's shape."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(channels, length + 2, generator=gen, dtype=torch.float64)
    smooth = torch.nn.functional.avg_pool1d(noise[:, None], 3, stride=1).squeeze(1)[:, :length]
    return smooth * torch.exp(-torch.arange(length, dtype=torch.float64) / tau)


def _sum_of_exponentials(channels, modes, length, seed=0):
    """Real kernels with ``modes`` complex modes: a Hankel operator of rank ``2·modes`` exactly."""
    gen = torch.Generator().manual_seed(seed)
    modulus = torch.empty(channels, modes, dtype=torch.float64).uniform_(0.6, 0.95, generator=gen)
    phase = torch.empty(channels, modes, dtype=torch.float64).uniform_(0.3, 2.8, generator=gen)
    c = torch.randn(channels, modes, dtype=torch.complex128, generator=gen)
    t = torch.arange(length, dtype=torch.float64)
    return (c[..., None] * torch.polar(modulus[..., None] ** t, phase[..., None] * t)).sum(-2).real


@pytest.mark.parametrize("taps", [1, 2, 7, 64, 129])
def test_fft_apply_equals_the_dense_hankel_matrix(taps):
    tail = _smooth_decaying(3, taps, tau=20.0)
    vectors = torch.randn(3, taps, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    spectrum, size = hankel_spectrum(tail)
    expected = square_hankel(tail) @ vectors
    # FFT round-off: a few eps·log2(n) of ‖tail‖·‖x‖ per entry
    bound = 64 * EPS64 * tail.norm(dim=-1).max() * vectors.norm(dim=-2).max()
    assert (hankel_apply(spectrum, size, vectors) - expected).abs().max() <= bound


def _projector(vectors):
    return vectors @ vectors.mT  # (H, T, T): the orthogonal projector on the columns' span (orthonormal columns)


def test_leading_eigenpairs_match_the_dense_eigh_on_a_decaying_spectrum():
    tail = _smooth_decaying(4, 400, tau=12.0)  # Hankel singular values fall below 1e-12·σ₁ within ~150
    rank = 8
    assert uses_krylov(rank, 400) and krylov_dimension(rank, 400) == 72
    sigma, vectors = leading_hankel_eigvecs(tail, rank)
    dense_sigma, dense_vectors = dense_hankel_eigvecs(tail)
    scale = dense_sigma[:, :1]
    assert ((sigma - dense_sigma[:, :rank]).abs() / scale).max() < 1e-10
    torch.testing.assert_close(vectors.mT @ vectors, torch.eye(rank, dtype=torch.float64).expand(4, -1, -1))
    # the span of the leading eigenvectors (signs and order within a cluster are arbitrary), against Davis-Kahan's
    # sin Θ bound: ‖sin Θ‖ ≤ ‖𝓗V − V(Vᵀ𝓗V)‖ / gap, the gap between the kept and the dropped |eigenvalues|
    gap = dense_sigma[:, rank - 1] - dense_sigma[:, rank]  # (H,)
    assert (gap / scale[:, 0]).min() > 1e-3  # the leading subspace is well defined
    image = square_hankel(tail) @ vectors
    residual = torch.linalg.matrix_norm(image - vectors @ (vectors.mT @ image))  # (H,)
    difference = torch.linalg.matrix_norm(_projector(vectors) - _projector(dense_vectors[..., :rank]), ord=2)
    assert (difference <= residual / gap + 1e-10).all()
    assert (residual / scale[:, 0]).max() < 1e-6  # and the Krylov space has converged that far


def test_a_kernel_of_lower_hankel_rank_still_gets_an_orthonormal_basis():
    tail = torch.cat([_sum_of_exponentials(2, 3, 300), torch.zeros(1, 300, dtype=torch.float64)])  # ranks 6, 6, 0
    sigma, vectors = leading_hankel_eigvecs(tail, 16)
    dense_sigma = dense_hankel_eigvecs(tail)[0][:, :16]
    assert torch.isfinite(vectors).all()
    torch.testing.assert_close(vectors.mT @ vectors, torch.eye(16, dtype=torch.float64).expand(3, -1, -1))
    scale = dense_sigma[:, :1].clamp(min=1.0)
    assert ((sigma - dense_sigma).abs() / scale).max() < 1e-10


@pytest.mark.parametrize("block_size", [4, 5])  # 5: a last block shorter than the others (48 = 9·5 + 3)
def test_the_lanczos_projected_matrix_is_the_rayleigh_quotient_of_an_orthonormal_basis(block_size):
    # the Rayleigh-Ritz matrix comes from the Gram-Schmidt coefficients, not from Qᵀ(𝓗Q): check it against the dense
    # product, on a decaying kernel, one of Hankel rank 6 (the basis outgrows the Krylov space: seeded random rows)
    # and a zero kernel
    tail = torch.cat([_smooth_decaying(2, 200, tau=25.0), _sum_of_exponentials(1, 3, 200), torch.zeros(1, 200)])
    rows, projected = _lanczos_basis(tail.double(), 48, block_size)  # (H, m, T), (H, m, m)
    torch.testing.assert_close(rows @ rows.mT, torch.eye(48, dtype=torch.float64).expand(4, -1, -1))
    expected = rows @ square_hankel(tail.double()) @ rows.mT
    scale = square_hankel(tail.double()).abs().amax((-2, -1)).clamp(min=1.0)[:, None, None]
    assert ((projected - expected).abs() / scale).max() < 1e-12


@pytest.mark.parametrize("tau", [40.0, 120.0, 400.0])
def test_truncated_best_fit_of_a_long_noisy_kernel_stays_within_one_percent_of_the_dense_fit(tau):
    # decaying noise kernels long enough for the Krylov route at the default dimension (L 1024, N 32: a basis of
    # 160 columns): their Hankel singular values fall slowly, what the basis size and block size were chosen for
    kernel = _smooth_decaying(2, 1024, tau=tau, seed=5).float()
    assert uses_krylov(64, 1023)
    fast = fit_modal_kernel(kernel, 32, method="best")
    dense = fit_modal_kernel(kernel, 32, method="best", eigensolver="dense")
    assert (fast.relative_error <= 1.01 * dense.relative_error + 1e-6).all()


def test_the_solver_is_deterministic():
    tail = _smooth_decaying(2, 300, tau=30.0)
    first, again = leading_hankel_eigvecs(tail, 8), leading_hankel_eigvecs(tail, 8)
    for a, b in zip(first, again):
        torch.testing.assert_close(a, b, atol=0, rtol=0)  # seeded probes, same ops on the same inputs


@pytest.mark.parametrize("method", ["balanced", "best"])
def test_truncated_fit_errors_are_within_one_percent_of_the_dense_fit(method):
    kernel = torch.cat([_smooth_decaying(3, 513, tau=tau, seed=2) for tau in (8.0, 30.0, 80.0)]).float()
    modes = [2, 8, 16]
    assert uses_krylov(2 * max(modes), 512)
    truncated = fit_modal_kernels(kernel, modes, method)  # the default eigensolver
    dense = fit_modal_kernels(kernel, modes, method, eigensolver="dense")
    for fast, reference in zip(truncated, dense):
        # the bound: per channel within 1% (relative) of the dense fit's error (plus float32 storage)
        assert (fast.relative_error <= 1.01 * reference.relative_error + 1e-6).all()


def test_bad_solver_arguments():
    tail = _smooth_decaying(1, 64, tau=8.0)
    with pytest.raises(ValueError, match="rank must be a positive int"):
        leading_hankel_eigvecs(tail, 0)
    with pytest.raises(ValueError, match="rank must be at most"):
        leading_hankel_eigvecs(tail, 65)
    with pytest.raises(ValueError, match="dimension must be an int in"):
        leading_hankel_eigvecs(tail, 8, dimension=4)
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        leading_hankel_eigvecs(tail, 8, block_size=0)
    with pytest.raises(ValueError, match="eigensolver must be one of"):
        fit_modal_kernel(tail.float(), 4, method="balanced", eigensolver="lanczos")


def test_below_the_krylov_threshold_the_default_is_the_dense_fit_bit_for_bit():
    # L_max 512 at N = 64 (the synthetic-task models of benchmarks/results/h3_distillation.md): a Krylov basis of
    # 256 columns is over T/4, so the default takes the dense route and their fits (and R²) are those of before
    kernel = _smooth_decaying(2, 512, tau=60.0).float()
    assert not uses_krylov(2 * 64, 511)
    default = fit_modal_kernel(kernel, 64, method="best")
    dense = fit_modal_kernel(kernel, 64, method="best", eigensolver="dense")
    for name in default.__dataclass_fields__:
        torch.testing.assert_close(getattr(default, name), getattr(dense, name), atol=0, rtol=0)
