"""The model-order-reduction fits of ops/modal.py against the reference Hankel/ESPRIT fit, and the Hankel spectrum."""

import pytest
import torch

from ssmhub.ops.hankel import dense_hankel_eigvecs
from ssmhub.ops.modal import (
    _balanced_poles,
    fit_modal_kernel,
    fit_modal_kernels,
    hankel_singular_values,
    max_modes,
    modal_kernel,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _decaying_noise(channels, length, seed=0):
    gen = torch.Generator().manual_seed(seed)
    t = torch.arange(length, dtype=torch.float64)
    return (torch.randn(channels, length, generator=gen, dtype=torch.float64) * torch.exp(-t / (length / 8))).float()


def _delays(channels, length, seed=0, count=1):
    """Sums of ``count`` delayed impulses with random weights at random lags in [1, length/2)."""
    gen = torch.Generator().manual_seed(seed)
    kernel = torch.zeros(channels, length)
    for _ in range(count):
        lags = torch.randint(1, length // 2, (channels,), generator=gen)
        kernel[torch.arange(channels), lags] += torch.randn(channels, generator=gen) if count > 1 else 1.0
    return kernel


KERNELS = {
    "decaying_noise": lambda: _decaying_noise(8, 96),
    "delays": lambda: _delays(8, 96),
    "sums_of_delays": lambda: _delays(8, 96, count=3),
}


@pytest.mark.parametrize("kind", sorted(KERNELS))
@pytest.mark.parametrize("modes", [4, 12])
def test_best_fit_matches_or_beats_the_reference_channel_by_channel(kind, modes):
    kernel = KERNELS[kind]()
    reference = fit_modal_kernel(kernel, modes, method="hankel").relative_error
    best = fit_modal_kernel(kernel, modes, method="best")
    assert torch.all(best.relative_error <= reference + 1e-6)
    # the reported error is that of the stored parameters
    recomputed = (kernel.double() - modal_kernel(best, 96).double()).norm(dim=-1) / kernel.double().norm(dim=-1)
    torch.testing.assert_close(best.relative_error.double(), recomputed, atol=1e-5, rtol=1e-4)


def test_delays_shorter_than_twice_the_modes_are_fitted_where_the_reference_fails():
    kernel = _delays(8, 96)  # lags in [1, 48): a diagonal SSM with N = 24 modes (2N = 48 real states) holds them
    reference = fit_modal_kernel(kernel, 23, method="hankel").relative_error
    best = fit_modal_kernel(kernel, 24, method="best").relative_error
    assert reference.min() > 0.9  # a delay's realisation is nilpotent: ESPRIT's poles sit at 0
    assert best.max() < 1e-2


def test_refinement_never_loses_to_its_start():
    kernel = _delays(6, 64, count=3)
    best = fit_modal_kernel(kernel, 6, method="best").relative_error
    refined = fit_modal_kernel(kernel, 6, method="refined", refine_steps=40).relative_error
    assert torch.all(refined <= best + 1e-6)
    assert refined.mean() < best.mean() - 1e-3  # and on these kernels it gains something


def test_balanced_truncation_recovers_a_sum_of_exponentials_and_is_stable():
    gen = torch.Generator().manual_seed(0)
    modulus = torch.empty(3, 4, dtype=torch.float64).uniform_(0.5, 0.9, generator=gen)
    phase = torch.empty(3, 4, dtype=torch.float64).uniform_(0.3, 2.8, generator=gen)
    c = torch.randn(3, 4, dtype=torch.complex128, generator=gen)
    t = torch.arange(80, dtype=torch.float64)
    kernel = (c[..., None] * torch.polar(modulus[..., None] ** t, phase[..., None] * t)).sum(-2).real
    fit = fit_modal_kernel(kernel.float(), 4, method="balanced")
    assert fit.relative_error.max() < 1e-4
    poles = _balanced_poles(dense_hankel_eigvecs(_decaying_noise(4, 64).double()[:, 1:])[1], 10)
    assert poles.abs().max() < 1  # discrete balanced truncation keeps the reduced model stable


def test_fitting_several_orders_at_once_equals_one_at_a_time():
    kernel = _decaying_noise(4, 48)
    together = fit_modal_kernels(kernel, [2, 5], method="best")
    for fit, modes in zip(together, (2, 5)):
        alone = fit_modal_kernel(kernel, modes, method="best")
        # exact: fit_modal_kernel(k, n) is fit_modal_kernels(k, [n])[0], and order n's fit runs the same ops on the
        # same tensors in both calls (the shared Hankel basis too: the same op on the same block)
        torch.testing.assert_close(fit.relative_error, alone.relative_error, atol=0, rtol=0)


def test_no_cap_below_what_the_length_supports():
    assert max_modes(33, method="hankel") == 7 and max_modes(33, method="best") == 16
    kernel = _decaying_noise(2, 33)
    fit = fit_modal_kernel(kernel, 16, method="best")  # 2N = 32 real states = every tap after K[0]
    assert fit.num_modes == 16 and fit.relative_error.max() < 1e-3
    with pytest.raises(ValueError, match="at most 16"):
        fit_modal_kernel(kernel, 17, method="balanced")
    with pytest.raises(ValueError, match="method must be one of"):
        max_modes(33, method="prony")


def _hankel_singular_values_ref(kernel):
    """Oracle: the singular values of the T×T Hankel matrix of the tail, built entry by entry."""
    tail = kernel.double()[:, 1:]
    taps = tail.shape[-1]
    rows = []
    for row in tail:
        h = torch.zeros(taps, taps, dtype=torch.float64)
        for i in range(taps):
            for j in range(taps - i):
                h[i, j] = row[i + j]
        rows.append(torch.linalg.svdvals(h))
    return torch.stack(rows)


def test_hankel_singular_values_match_their_oracle_and_count_a_delay():
    kernel = _decaying_noise(3, 20)
    torch.testing.assert_close(
        hankel_singular_values(kernel).double(), _hankel_singular_values_ref(kernel), atol=1e-6, rtol=1e-5
    )
    delay = torch.zeros(1, 40)
    delay[0, 9] = 1.0  # K[9]: the tail's lag 8, a rank-9 Hankel operator with singular values 1
    sigma = hankel_singular_values(delay)[0]
    torch.testing.assert_close(sigma[:9], torch.ones(9))
    assert sigma[9:].abs().max() < 1e-6


def _direct_residues(kernel, log_modulus, phase, valid, start):
    """Reference least squares over explicit columns ``Re λ^t``, ``−Im λ^t`` (t ≥ start) of the valid poles."""
    t = torch.arange(start, kernel.shape[-1], dtype=torch.float64)
    out = torch.zeros(log_modulus.shape, dtype=torch.complex128)
    for h in range(kernel.shape[0]):
        powers = torch.polar(torch.exp(log_modulus[h, :, None] * t), phase[h, :, None] * t)  # (N, T)
        real = phase[h].sin().abs() <= 1e-6
        columns = [(n, 0, powers[n].real) for n in range(powers.shape[0]) if valid[h, n]]
        columns += [(n, 1, -powers[n].imag) for n in range(powers.shape[0]) if valid[h, n] and not real[n]]
        matrix = torch.stack([column for _, _, column in columns], dim=-1)  # (T, unknowns)
        z = torch.linalg.lstsq(matrix, kernel[h, start:, None]).solution[:, 0]
        for (n, part, _), value in zip(columns, z):
            out[h, n] += value if part == 0 else 1j * value
    return out


def test_residues_of_valid_real_and_complex_poles_match_a_direct_least_squares():
    from ssmhub.ops.modal import _fit_residues

    # the system is built for the valid poles only, and without the Im columns of real ones (padded to the largest
    # count in the block): the same least squares as explicit columns, and zero residues for invalid poles
    gen = torch.Generator().manual_seed(0)
    kernel = _decaying_noise(3, 200).double()
    log_modulus = torch.empty(3, 6, dtype=torch.float64).uniform_(0.5, 0.9, generator=gen).log()
    phase = torch.empty(3, 6, dtype=torch.float64).uniform_(0.3, 2.8, generator=gen)
    phase[:, 0] = 0.0  # a real pole in every channel
    phase[1, 3] = torch.pi  # and a negative one
    valid = torch.tensor([[True] * 6, [True, False, True, True, False, True], [False, True, True, True, True, True]])
    fitted = _fit_residues(kernel, log_modulus, phase, valid, start=1)
    expected = _direct_residues(kernel, log_modulus, phase, valid, start=1)
    assert (fitted[~valid] == 0).all()
    torch.testing.assert_close(fitted, expected, rtol=1e-7, atol=1e-9 * kernel.abs().max().item())


def test_shared_poles_are_solved_once_and_give_the_per_channel_residues():
    from ssmhub.ops.modal import _circle_poles, _fit_residues

    kernel = _decaying_noise(4, 150).double()
    poles = _circle_poles(4, 8, 2.0, kernel.device)
    shared = _fit_residues(kernel, *poles, start=1, shared=True)
    torch.testing.assert_close(shared, _fit_residues(kernel, *poles, start=1), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(shared, _direct_residues(kernel, *poles, start=1), rtol=1e-7, atol=1e-9)
