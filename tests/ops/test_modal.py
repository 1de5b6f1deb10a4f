"""Modal distillation of long-conv kernels: exact recovery, monotone accuracy, and scan == step == convolution."""

import math

import pytest
import torch
from devices import bf16_autocast

from ssmhub.ops.fftconv import fft_conv_ref
from ssmhub.ops.modal import (
    _RCOND,
    MAX_MODULUS,
    ModalKernel,
    fit_modal_kernel,
    max_modes,
    modal_init_state,
    modal_kernel,
    modal_scan,
    modal_scan_ref,
    modal_step,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _true_modes(channels, modes, seed=0):
    """The modes behind :func:`_sum_of_exponentials`: modulus in [0.5, 0.95], phase in [0.2, 3.0] (upper half
    plane, as the fit stores them) and complex residues ``c``, each (channels, modes) float64 / complex128."""
    gen = torch.Generator().manual_seed(seed)
    modulus = torch.empty(channels, modes, dtype=torch.float64).uniform_(0.5, 0.95, generator=gen)
    phase = torch.empty(channels, modes, dtype=torch.float64).uniform_(0.2, 3.0, generator=gen)
    c = torch.randn(channels, modes, dtype=torch.complex128, generator=gen)
    return modulus, phase, c


def _sum_of_exponentials(channels, modes, length, seed=0, direct=None):
    """A real kernel that IS ``Re Σ_n c_n λ_n^t`` (conjugate-symmetric: 2N poles, N complex modes)."""
    modulus, phase, c = _true_modes(channels, modes, seed)
    t = torch.arange(length, dtype=torch.float64)
    kernel = (c[..., None] * torch.polar(modulus[..., None] ** t, phase[..., None] * t)).sum(-2).real
    if direct is not None:
        kernel[:, 0] += direct
    return kernel


def _decaying_noise(channels, length, tau, seed=0):
    """``randn·exp(-t/τ)`` smoothed by a width-3 moving average: a typical trained long-conv kernel."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(channels, length + 2, generator=gen, dtype=torch.float64)
    smooth = torch.nn.functional.avg_pool1d(noise[:, None], 3, stride=1).squeeze(1)[:, :length]
    return (smooth * torch.exp(-torch.arange(length, dtype=torch.float64) / tau)).float()


def _geometric_init(channels, length, seed=0):
    """The long-conv paper's geometric ("Exp") init, safari ``double_exp``: randn·exp(-(j/L)·⌊H/2⌋^(i/H))."""
    gen = torch.Generator().manual_seed(seed)
    i = torch.arange(channels, dtype=torch.float64)[:, None]
    j = torch.arange(length, dtype=torch.float64)
    decay = torch.exp(-(j / length) * (channels // 2) ** (i / channels))
    return (0.02 * torch.randn(channels, length, generator=gen, dtype=torch.float64) * decay).float()


def _recomputed_error(kernel, fit):
    k = kernel.double()
    return (k - modal_kernel(fit, kernel.shape[-1]).double()).norm(dim=-1) / k.norm(dim=-1)


# Measured on the four cases below: every recovered pole is the true pole rounded to the float32 storage of
# log|λ| and arg λ, |λ̂ − λ| ≤ 8.2e-8; the residues refitted for those rounded poles are off by ≤ 1.2e-6 and d by
# ≤ 6.9e-7, both relative to the channel's largest |c_n|. The tolerances leave a ~6x and ~8x margin.
POLE_ATOL = 5e-7
RESIDUE_RTOL = 1e-5  # of the channel's largest |c_n|, for residues and d


def _assert_recovers_the_true_modes(fit, channels, modes, seed, direct):
    """Poles, residues and ``d`` of ``fit`` against the ones that built the kernel, modes paired by phase.

    The true phases lie in (0, π), the fit's upper half plane, so sorting both by phase pairs them (the closest
    true phases, 4.6e-3 apart, are far further apart than POLE_ATOL); a missing or spurious pole breaks the pairing.
    """
    modulus, phase, c = _true_modes(channels, modes, seed)
    true_poles = torch.polar(modulus, phase)
    order, true_order = fit.phase.double().argsort(-1), phase.argsort(-1)
    poles = fit.poles().gather(-1, order)
    true_poles, c = true_poles.gather(-1, true_order), c.gather(-1, true_order)
    pole_error = (poles - true_poles).abs()
    assert pole_error.max() <= POLE_ATOL, pole_error.max()
    scale = c.abs().amax(-1, keepdim=True)  # (H, 1)
    residue_error = (fit.complex_residues().gather(-1, order) - c).abs() / scale
    assert residue_error.max() <= RESIDUE_RTOL, residue_error.max()
    expected_d = torch.full((channels,), 0.0 if direct is None else direct, dtype=torch.float64)
    d_error = (fit.d.double() - expected_d).abs() / scale.squeeze(-1)
    assert d_error.max() <= RESIDUE_RTOL, d_error.max()


@pytest.mark.parametrize(
    ("channels", "modes", "length", "seed", "direct"),
    [(4, 6, 256, 0, None), (4, 6, 256, 0, 0.7), (3, 5, 128, 2, 0.3)],  # the last: _random_fit(seed=2)'s kernel
)
def test_exact_recovery_of_a_sum_of_exponentials(channels, modes, length, seed, direct):
    """The fit returns the poles and residues the kernel was built from (up to float32 storage)."""
    kernel = _sum_of_exponentials(channels, modes, length, seed=seed, direct=direct)
    fit = fit_modal_kernel(kernel, num_modes=modes)
    assert fit.relative_error.max() < 1e-5
    torch.testing.assert_close(_recomputed_error(kernel, fit).float(), fit.relative_error, atol=1e-6, rtol=1e-3)
    assert torch.all(fit.log_modulus < 0) and torch.all(fit.phase >= 0)
    _assert_recovers_the_true_modes(fit, channels, modes, seed, direct)


def test_exact_recovery_without_direct_term():
    """Without ``d``, the modes also fit ``K[0] = Re Σ c_n``: same poles and residues, ``d`` stays 0."""
    kernel = _sum_of_exponentials(channels=3, modes=4, length=128, seed=1)
    fit = fit_modal_kernel(kernel, num_modes=4, direct_term=False)
    assert fit.relative_error.max() < 1e-5
    assert torch.all(fit.d == 0)  # not fitted: set to zero
    _assert_recovers_the_true_modes(fit, channels=3, modes=4, seed=1, direct=None)


def test_fit_dtypes_and_shapes():
    kernel = _decaying_noise(5, 200, tau=30.0)
    fit = fit_modal_kernel(kernel, num_modes=8)
    assert isinstance(fit, ModalKernel)
    assert fit.log_modulus.shape == fit.phase.shape == (5, 8)
    assert fit.residues.shape == (5, 8, 2)
    assert fit.d.shape == fit.relative_error.shape == (5,)
    for tensor in (fit.log_modulus, fit.phase, fit.residues, fit.d, fit.relative_error):
        assert tensor.dtype == torch.float32
    assert modal_kernel(fit, 300).shape == (5, 300)


@pytest.mark.parametrize(
    "make_kernel",
    [lambda: _decaying_noise(8, 512, tau=40.0), lambda: _geometric_init(16, 512)],
    ids=["decaying_noise", "geometric_init"],
)
def test_error_decreases_with_modes_and_is_reported_honestly(make_kernel):
    kernel = make_kernel()
    errors = []
    for modes in (8, 16, 64):
        fit = fit_modal_kernel(kernel, num_modes=modes)
        torch.testing.assert_close(_recomputed_error(kernel, fit).float(), fit.relative_error, atol=1e-6, rtol=1e-4)
        assert torch.all(fit.relative_error <= 1.0 + 1e-6)  # never worse than the zero kernel
        errors.append(fit.relative_error.mean().item())
    assert errors[0] > errors[1] > errors[2], errors


def test_smooth_decaying_kernel_is_fitted_well():
    kernel = _decaying_noise(8, 1024, tau=20.0, seed=3)
    fit = fit_modal_kernel(kernel, num_modes=64)
    assert fit.relative_error.mean() < 0.05


@pytest.mark.parametrize("kernel_kind", ["exact", "noise", "geometric"])
def test_poles_are_strictly_stable(kernel_kind):
    kernel = {
        "exact": lambda: _sum_of_exponentials(3, 4, 200).float(),
        "noise": lambda: torch.randn(6, 300, generator=torch.Generator().manual_seed(5)),  # no decay at all
        "geometric": lambda: _geometric_init(8, 512),
    }[kernel_kind]()
    fit = fit_modal_kernel(kernel, num_modes=16)
    assert torch.all(fit.log_modulus <= math.log(MAX_MODULUS))
    assert torch.all(fit.poles().abs() < 1)
    assert torch.isfinite(fit.residues).all() and torch.isfinite(fit.relative_error).all()


def test_non_decaying_unit_circle_kernel_is_clamped():
    t = torch.arange(400, dtype=torch.float64)
    kernel = torch.stack([torch.cos(0.3 * t), torch.ones_like(t), 1.001**t])  # |λ| = 1, 1 and > 1
    fit = fit_modal_kernel(kernel, num_modes=2)
    assert torch.all(fit.poles().abs() <= MAX_MODULUS + 1e-7)
    assert fit.relative_error[:2].max() < 0.05  # still a good fit on [0, L)
    assert fit.relative_error[2] < 0.5  # a growing kernel is only approximated by a (clamped) decaying one


def test_real_poles_with_a_round_off_imaginary_part_are_kept(monkeypatch):
    """``torch.linalg.eigvals`` does not promise ``Im λ = 0`` exactly for a real eigenvalue (LAPACK's geev gives it,
    other backends need not): the clamped-kernel fits above must not change when every real ESPRIT pole comes back
    with ``Im λ = −1e-17·|λ|``, which the upper-half-plane rule alone would drop as half of a conjugate pair."""
    eigvals = torch.linalg.eigvals

    def round_off(matrix):
        poles = eigvals(matrix)
        return torch.where(poles.imag == 0, poles - 1e-17j * poles.abs(), poles)

    monkeypatch.setattr(torch.linalg, "eigvals", round_off)
    test_non_decaying_unit_circle_kernel_is_clamped()
    assert torch.all(fit_modal_kernel(_sum_of_exponentials(3, 4, 200).float(), num_modes=4).relative_error < 1e-4)


def _random_fit(channels=3, modes=5, seed=0):
    return fit_modal_kernel(_sum_of_exponentials(channels, modes, 128, seed=seed, direct=0.3).float(), modes)


def test_modal_kernel_matches_recurrence_reference():
    fit = _random_fit()
    impulse = torch.zeros(1, 3, 150)
    impulse[..., 0] = 1.0
    y_ref, _ = modal_scan_ref(impulse, fit)
    torch.testing.assert_close(modal_kernel(fit, 150), y_ref[0], atol=1e-5, rtol=1e-4)


def test_step_scan_and_convolution_agree():
    fit = _random_fit()
    u = torch.randn(2, 3, 90, generator=torch.Generator().manual_seed(1))
    y_conv = fft_conv_ref(u.double(), modal_kernel(fit, 90).double()).float()
    y_scan, final = modal_scan(u, fit, return_final_state=True)
    y_ref, final_ref = modal_scan_ref(u, fit, return_final_state=True)
    state = modal_init_state(fit, 2)
    steps = []
    for t in range(90):
        y_t, state = modal_step(u[..., t], state, fit)
        steps.append(y_t)
    y_step = torch.stack(steps, dim=-1)
    torch.testing.assert_close(y_scan, y_conv, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(y_ref, y_conv, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(y_step, y_conv, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final, final_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(state, final_ref, atol=1e-4, rtol=1e-4)


def test_prefill_hands_over_to_steps():
    fit = _random_fit(seed=2)
    u = torch.randn(2, 3, 70, generator=torch.Generator().manual_seed(4))
    y_full = fft_conv_ref(u.double(), modal_kernel(fit, 70).double()).float()
    y_pre, state = modal_scan(u[..., :40], fit, return_final_state=True)
    steps = []
    for t in range(40, 70):
        y_t, state = modal_step(u[..., t], state, fit)
        steps.append(y_t)
    torch.testing.assert_close(torch.cat([y_pre, torch.stack(steps, -1)], -1), y_full, atol=1e-4, rtol=1e-4)


def test_scan_with_initial_state_continues_a_sequence():
    fit = _random_fit(seed=3)
    u = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(6))
    y_full, final_full = modal_scan_ref(u, fit, return_final_state=True)
    _, mid = modal_scan(u[..., :25], fit, return_final_state=True)
    y_rest, final = modal_scan(u[..., 25:], fit, initial_state=mid, return_final_state=True)
    torch.testing.assert_close(y_rest, y_full[..., 25:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final, final_full, atol=1e-4, rtol=1e-4)
    y_ref, _ = modal_scan_ref(u[..., 25:], fit, initial_state=mid)
    torch.testing.assert_close(y_rest, y_ref, atol=1e-4, rtol=1e-4)


def test_modal_ops_under_autocast_stay_float32():
    fit = _random_fit()
    u = torch.randn(1, 3, 20)
    with bf16_autocast():
        y, _ = modal_scan(u.bfloat16(), fit)
        y_t, _ = modal_step(u[..., 0].bfloat16(), modal_init_state(fit, 1), fit)
    assert y.dtype == torch.float32 and y_t.dtype == torch.float32


def test_zero_kernel():
    """A zero kernel fits to zero residues: every output below is a sum of products with 0, exactly 0."""
    fit = fit_modal_kernel(torch.zeros(3, 64), num_modes=4)
    assert torch.all(fit.relative_error == 0)
    assert torch.all(modal_kernel(fit, 100) == 0)
    y, final = modal_scan(torch.randn(2, 3, 30), fit, return_final_state=True)
    assert torch.all(y == 0)
    y_t, _ = modal_step(torch.randn(2, 3), final, fit)
    assert torch.all(y_t == 0)


def test_max_modes():
    assert max_modes(2048) == 511
    assert max_modes(6) == 1 and max_modes(5) == 0
    assert max_modes(5, direct_term=False) == 1
    fit_modal_kernel(torch.randn(2, 6), num_modes=1)  # the smallest length that fits one mode


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"kernel": torch.randn(64), "num_modes": 2}, "kernel"),
        ({"kernel": torch.randn(2, 3, 64), "num_modes": 2}, "kernel"),
        ({"kernel": torch.randn(2, 64, dtype=torch.complex64), "num_modes": 2}, "kernel"),
        ({"kernel": torch.full((2, 64), float("nan")), "num_modes": 2}, "kernel"),
        ({"kernel": torch.randn(2, 64), "num_modes": 0}, "num_modes"),
        ({"kernel": torch.randn(2, 64), "num_modes": 2.0}, "num_modes"),
        ({"kernel": torch.randn(2, 64), "num_modes": 16}, "num_modes"),
        ({"kernel": torch.randn(2, 64), "num_modes": 2, "method": "prony"}, "method"),
        ({"kernel": torch.randn(2, 64), "num_modes": 2, "channel_block": 0}, "channel_block"),
    ],
)
def test_bad_fit_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        fit_modal_kernel(**kwargs)


def test_bad_decode_arguments():
    fit = _random_fit()
    with pytest.raises(ValueError, match="length"):
        modal_kernel(fit, 0)
    with pytest.raises(ValueError, match="state"):
        modal_step(torch.randn(2, 3), torch.zeros(2, 3, 4, dtype=torch.complex64), fit)
    with pytest.raises(ValueError, match="u_t"):
        modal_step(torch.randn(2, 4), modal_init_state(fit, 2), fit)
    with pytest.raises(ValueError, match="initial_state"):
        modal_scan(torch.randn(2, 3, 10), fit, initial_state=torch.zeros(1, 3, 5, dtype=torch.complex64))
    with pytest.raises(ValueError, match="u must"):
        modal_scan(torch.randn(3, 10), fit)


def _squashed(kernel, lam):
    """Squash (long-conv paper §3.1), ``sign(K)·max(|K| − λ, 0)``: a sparse kernel, as trained H3 kernels are."""
    return torch.sign(kernel) * (kernel.abs() - lam).clamp(min=0)


@pytest.mark.parametrize(
    "make_kernel",
    [
        lambda: _squashed(_geometric_init(64, 512, seed=4), 0.02),  # ~70% of taps zero, spread over 512 lags
        lambda: torch.zeros(8, 256).index_put_(  # a few isolated taps at short lags: an FIR, not exponentials
            (torch.arange(8).repeat_interleave(3), torch.tensor([2, 4, 7] * 8)), torch.randn(24)
        ),
    ],
    ids=["squashed_geometric", "short_fir"],
)
@pytest.mark.parametrize("modes", [8, 32])
def test_sparse_kernels_never_fit_worse_than_no_modes(make_kernel, modes):
    """Sparse (squashed) kernels make ESPRIT return near-zero and near-duplicate poles: their residues must not
    blow up and cancel in float32; every channel's stored fit is at least as good as ``d`` alone."""
    kernel = make_kernel()
    kernel = kernel[kernel.abs().sum(-1) > 0]  # Squash can zero a whole channel; its error is 0/0
    fit = fit_modal_kernel(kernel, num_modes=modes)
    no_modes = kernel[:, 1:].double().norm(dim=-1) / kernel.double().norm(dim=-1)
    recomputed = _recomputed_error(kernel, fit)
    assert torch.isfinite(recomputed).all()
    torch.testing.assert_close(recomputed.float(), fit.relative_error, atol=1e-6, rtol=1e-4)
    assert torch.all(fit.relative_error <= no_modes.float() + 1e-6)
    # clustered poles with large, cancelling residues would lose the output in float32 decoding: the float32
    # step-by-step decode must match the complex128 recurrence of the same stored fit, to a small fraction of
    # the output of the true kernel (the input is longer than the kernel, so every channel has an output)
    u = torch.randn(1, kernel.shape[0], kernel.shape[-1] + 40, generator=torch.Generator().manual_seed(1))
    y_ref, _ = modal_scan_ref(u, fit)
    state, steps = modal_init_state(fit, 1), []
    for t in range(u.shape[-1]):
        y_t, state = modal_step(u[..., t], state, fit)
        steps.append(y_t)
    error = (torch.stack(steps, -1).double() - y_ref.double()).abs().amax(dim=(0, 2))  # (H,)
    scale = fft_conv_ref(u.double(), kernel.double()).abs().amax(dim=(0, 2))  # (H,)
    # the residue solve keeps the directions of its scaled normal equations down to _RCOND of the largest, a column's
    # scale counting its tap 0 (which d cancels), so the 2N modes' residues and contributions add up to about
    # √(2N/_RCOND)·‖K‖ at most, resolved by float32 decoding to 2^-24 of that: 7.5e-4 of the output at N = 8, 1.5e-3
    # at N = 32. Measured over 40 CPU draws of this kernel: ≤ 2.6e-4. Without tap 0 in the scale, isolated taps got
    # poles |λ| ≈ 0.015 with residues 5e4·‖K‖, and most draws lost more than 1e-3 (up to 7e-3; the H100's, 3.5e-3).
    tolerance = 2.0**-24 * math.sqrt(2 * modes / _RCOND)
    assert torch.all(error <= tolerance * scale), (error / scale).max()
