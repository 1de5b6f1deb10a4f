"""DLR ops against their step-by-step complex128 references and the paper's identities."""

import math

import pytest
import torch
from comparisons import FP32_REL, scaled_close

from ssmhub.ops import dlr as dlr_ops
from ssmhub.ops.dlr import (
    dlr_init,
    dlr_kernel,
    dlr_kernel_ref,
    dlr_scan,
    dlr_scan_recurrent,
    dlr_scan_ref,
    dlr_state_complex,
    dlr_state_planes,
    dlr_step,
    kronecker_dlr,
    lambda_powers,
)


def _params(state_size=16, channels=3, seed=0, dt_min=5e-4, dt_max=0.5):
    gen = torch.Generator().manual_seed(seed)
    p = dlr_init(state_size, channels, dt_min, dt_max, generator=gen)
    p["weight"] = p["weight"] * state_size  # O(1) weights so the checks are not trivially small
    return p["log_lambda_re"][0], p["log_lambda_im"][0], p["weight"]


def _modal(log_re, log_im, weight):
    """``(log|Λ|, arg Λ, w)`` as the ops take them: w stays (H, N, 2), real and imaginary parts."""
    return -(log_re**2), log_im, weight


def _state(*shape, generator=None):
    """A random state in the ops' layout: float32 planes (B, H, 2, N) of Re x and Im x."""
    batch, channels, modes = shape
    return torch.randn(batch, channels, 2, modes, generator=generator)


@pytest.mark.parametrize("kernel_type", ["real", "prod"])
@pytest.mark.parametrize("length", [1, 5, 64, 300])
def test_kernel_matches_repeated_multiplication(kernel_type, length):
    log_re, log_im, weight = _params()
    fast = dlr_kernel(log_re, log_im, weight, length, kernel_type)
    torch.testing.assert_close(fast, dlr_kernel_ref(log_re, log_im, weight, length, kernel_type), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kernel_type", ["real", "prod"])
@pytest.mark.parametrize("length, chunk_taps", [(1, None), (64, None), (300, None), (300, 37)])
def test_kernel_gradients_match_autograd_through_repeated_multiplication(kernel_type, length, chunk_taps, monkeypatch):
    """The hand-written backward against autograd through the complex128 reference, with a random
    upstream gradient, in one chunk and in several."""
    if chunk_taps is not None:
        monkeypatch.setattr(dlr_ops, "_CHUNK_ELEMENTS", 16 * chunk_taps)
    params = [t.clone().requires_grad_() for t in _params(dt_min=1e-3, dt_max=0.1)]
    upstream = torch.randn(3, length, generator=torch.Generator().manual_seed(1))
    fast = torch.autograd.grad((dlr_kernel(*params, length, kernel_type) * upstream).sum(), params)
    ref_params = [t.detach().double().requires_grad_() for t in params]
    log_re, log_im, weight = ref_params
    lam = torch.polar(torch.exp(-(log_re**2)), log_im)  # dlr_kernel_ref, kept in float64 for its gradient
    w = torch.complex(weight[..., 0], weight[..., 1])
    powers = torch.stack([lam**k for k in range(length)], dim=-1)  # (N, L)
    z = w @ powers
    kernel = z.real * z.imag if kernel_type == "prod" else z.real
    expected = torch.autograd.grad((kernel * upstream.double()).sum(), ref_params)
    for name, got, want in zip(("log_lambda_re", "log_lambda_im", "weight"), fast, expected):
        scale = want.abs().max().item()
        torch.testing.assert_close(got.double(), want, atol=2e-5 * scale, rtol=1e-4, msg=name)


def test_kernel_is_dft_of_w_at_unit_modulus():
    """§2.3: with logΛ_re = 0 and logΛ_im[n] = 2πn/N, the length-N kernel is Re(Σ_n w_n e^{2πink/N})."""
    n = 32
    _, log_im, weight = _params(state_size=n, channels=2)
    kernel = dlr_kernel(torch.zeros(n), log_im, weight, n)
    w = torch.complex(weight[..., 0].double(), weight[..., 1].double())
    expected = (torch.fft.ifft(w, dim=-1) * n).real.float()  # ifft carries the e^{+2πink/N} sign
    torch.testing.assert_close(kernel, expected, atol=1e-4, rtol=1e-4)


def test_chunked_kernel_and_gradients_equal_unchunked(monkeypatch):
    log_re, log_im, weight = (t.clone().requires_grad_() for t in _params(state_size=8))
    whole = dlr_kernel(log_re, log_im, weight, 200, "prod")
    grads = torch.autograd.grad(whole.square().sum(), (log_re, log_im, weight))
    monkeypatch.setattr(dlr_ops, "_CHUNK_ELEMENTS", 8 * 17)  # chunks of 17 taps, recomputed in backward
    chunked = dlr_kernel(log_re, log_im, weight, 200, "prod")
    chunked_grads = torch.autograd.grad(chunked.square().sum(), (log_re, log_im, weight))
    torch.testing.assert_close(chunked, whole)
    for a, b in zip(chunked_grads, grads):  # float32 sums over taps in another order: scale-relative tolerance
        torch.testing.assert_close(a, b, atol=2e-5 * b.abs().max().item(), rtol=1e-5)


def test_kernel_accurate_at_one_million_taps():
    """Phases k·θ reach ~2π·2^20: formed in fp64 they keep the kernel at fp32 accuracy; an fp32 phase
    would be off by ~0.25 rad there (checked below, so the test is not vacuous)."""
    length = 1 << 20
    n = 4
    log_re = torch.full((n,), 1e-3)  # |λ| = exp(-1e-6): barely decays over 2^20 steps
    log_im = torch.tensor([0.1, 1.0, 2.0, 3.0])
    weight = torch.randn(2, n, 2, generator=torch.Generator().manual_seed(0))
    kernel = dlr_kernel(log_re, log_im, weight, length)
    ks = torch.tensor([length - 1, length - 1000, 777_777], dtype=torch.float64)
    lam_log = torch.complex(-(log_re.double() ** 2), log_im.double())  # (N,)
    w = torch.complex(weight[..., 0].double(), weight[..., 1].double())
    exact = (w @ torch.exp(lam_log[:, None] * ks)).real  # (H, 3) in complex128
    torch.testing.assert_close(kernel[:, ks.long()].double(), exact, atol=1e-5, rtol=1e-5)
    fp32_phase = torch.remainder(log_im[:, None] * ks.float(), 2 * math.pi)
    assert (fp32_phase.double() - torch.remainder(log_im.double()[:, None] * ks, 2 * math.pi)).abs().max() > 1e-2


@pytest.mark.parametrize("readout", ["real", "half_imag"])
@pytest.mark.parametrize("with_state", [False, True])
def test_scan_matches_recurrence(with_state, readout):
    log_re, log_im, weight = _params()
    log_modulus, phase, w = _modal(log_re, log_im, weight)
    gen = torch.Generator().manual_seed(3)
    u = torch.randn(2, 3, 50, generator=gen)
    state = _state(2, 3, 16, generator=gen) if with_state else None
    u = u.mT.contiguous().mT  # the (B, H, L) view of a (B, L, H) tensor, as a mixer passes it
    y, final = dlr_scan(u, log_modulus, phase, w, readout=readout, initial_state=state, return_final_state=True)
    y_ref, final_ref = dlr_scan_ref(u, log_modulus, phase, w, readout, initial_state=state, return_final_state=True)
    torch.testing.assert_close(y, y_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final, final_ref, atol=1e-4, rtol=1e-4)


def test_chunked_scan_equals_unchunked(monkeypatch):
    log_modulus, phase, w = _modal(*_params(state_size=8))
    u = torch.randn(2, 3, 100)
    state = _state(2, 3, 8)
    whole = dlr_scan(u, log_modulus, phase, w, initial_state=state, return_final_state=True)
    monkeypatch.setattr(dlr_ops, "_CHUNK_ELEMENTS", 8 * 13)
    chunked = dlr_scan(u, log_modulus, phase, w, initial_state=state, return_final_state=True)
    for a, b in zip(chunked, whole):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_scan_gradients_match_recurrence():
    params = [t.clone().requires_grad_() for t in _params(state_size=8)]
    u = torch.randn(2, 3, 40, requires_grad=True)
    state = _state(2, 3, 8)
    weight_out = torch.randn(2, 3, 40)

    def loss(fn):
        log_modulus, phase, w = _modal(*params)
        y, final = fn(u, log_modulus, phase, w, initial_state=state, return_final_state=True)
        return (y * weight_out).sum() + final.abs().square().sum()

    fast = torch.autograd.grad(loss(dlr_scan), [u, *params])
    slow = torch.autograd.grad(loss(dlr_scan_ref), [u, *params])
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)


def test_step_continues_scan():
    log_re, log_im, weight = _params()
    log_modulus, phase, w = _modal(log_re, log_im, weight)
    u = torch.randn(2, 3, 30)
    y_full, _ = dlr_scan_ref(u, log_modulus, phase, w)
    _, state = dlr_scan(u[..., :20], log_modulus, phase, w, return_final_state=True)
    for k in range(20, 30):
        y_t, state = dlr_step(u[..., k], state, log_modulus, phase, w)
        torch.testing.assert_close(y_t, y_full[..., k], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("readout", ["real", "half_imag"])
def test_a_step_is_the_complex128_recurrence(readout):
    """One step on the float32 planes against x_k = Λ x_{k-1} + u_k, y_k = readout(<w, x_k>) in complex128 (Eq. 1),
    from a state with parts of both signs, so that every term of the complex product counts."""
    log_modulus, phase, w = _modal(*_params())
    gen = torch.Generator().manual_seed(5)
    u_t, state = torch.randn(2, 3, generator=gen), _state(2, 3, 16, generator=gen)
    y_t, new_state = dlr_step(u_t, state, log_modulus, phase, w, readout)
    lam = torch.polar(torch.exp(log_modulus.double()), phase.double())  # (N,)
    expected = lam * dlr_state_complex(state).cdouble() + u_t.double().unsqueeze(-1)  # (B, H, N)
    z = (expected * torch.complex(w[..., 0], w[..., 1]).cdouble()).sum(-1)  # (B, H)
    assert new_state.dtype == torch.float32 and new_state.shape == (2, 3, 2, 16)
    scaled_close(new_state, dlr_state_planes(expected), FP32_REL, "state")
    scaled_close(y_t, z.real.float() if readout == "real" else 0.5 * z.imag.float(), FP32_REL, "y")


def test_state_planes_are_the_complex_state():
    """The planes layout and the complex state it replaced: Re x at index 0 and Im x at 1 of dim -2, round trip
    exact (only float32 values are moved)."""
    gen = torch.Generator().manual_seed(6)
    complex_state = torch.complex(torch.randn(2, 3, 5, generator=gen), torch.randn(2, 3, 5, generator=gen))
    planes = dlr_state_planes(complex_state)
    assert planes.dtype == torch.float32 and planes.shape == (2, 3, 2, 5)
    assert torch.equal(planes[:, :, 0], complex_state.real) and torch.equal(planes[:, :, 1], complex_state.imag)
    assert torch.equal(dlr_state_complex(planes), complex_state)


def test_prod_kernel_is_kronecker_dlr():
    """§A.2: Re(K)·Im(K) = ½·Im(K²), the kernel of the N²-state DLR (Λ⊗Λ, w⊗w)."""
    log_re, log_im, weight = _params(state_size=6)
    kron = kronecker_dlr(*_modal(log_re, log_im, weight))
    u = torch.zeros(1, 3, 40)
    u[..., 0] = 1.0  # impulse: the output is the kernel
    impulse_response, _ = dlr_scan_ref(u, *kron, readout="half_imag")
    # float32 kernel (complex128 powers rounded once, float32 products and sums) against the complex128 scan:
    # within FP32_REL of the largest tap (elementwise, atol 1e-5 + rtol 1e-4 had been at 0.47 of the error seen)
    scaled_close(dlr_kernel(log_re, log_im, weight, 40, "prod"), impulse_response[0], FP32_REL, "prod kernel")


def test_init_follows_section_2_3():
    p = dlr_init(64, 5, 5e-4, 0.5, generator=torch.Generator().manual_seed(0))
    modulus = torch.exp(-(p["log_lambda_re"] ** 2))
    assert modulus.min() >= math.exp(-0.5 / 2) - 1e-6 and modulus.max() <= math.exp(-5e-4 / 2) + 1e-6
    torch.testing.assert_close(p["log_lambda_im"][0], 2 * math.pi * torch.arange(64) / 64)
    assert p["weight"].shape == (5, 64, 2)
    assert abs(p["weight"].std().item() - 1 / 64) < 0.2 / 64


def test_lambda_powers_never_exceed_unit_modulus():
    powers = lambda_powers(-torch.rand(10), torch.rand(10) * 6, 0, 1000)
    assert powers.abs().max() <= 1 + 1e-6


@pytest.mark.parametrize("readout", ["real", "half_imag"])
@pytest.mark.parametrize("with_state", [False, True])
def test_recurrent_scan_matches_the_complex128_recurrence(with_state, readout):
    """The token-by-token float32 path (a few tokens after a state) against the complex128 reference."""
    log_modulus, phase, w = _modal(*_params())
    gen = torch.Generator().manual_seed(4)
    u = torch.randn(2, 3, 9, generator=gen)
    state = _state(2, 3, 16, generator=gen) if with_state else None
    y, final = dlr_scan_recurrent(u, log_modulus, phase, w, readout, initial_state=state, return_final_state=True)
    y_ref, final_ref = dlr_scan_ref(u, log_modulus, phase, w, readout, initial_state=state, return_final_state=True)
    # a complex64 scan of 9 steps against complex128: FP32_REL of the largest value (elementwise atol = rtol = 1e-5
    # had been at 0.44 of the error seen)
    scaled_close(y, y_ref, FP32_REL, "y")
    scaled_close(final, final_ref, FP32_REL, "final state")


def _subnormal(t: torch.Tensor) -> bool:
    t = torch.view_as_real(t) if t.is_complex() else t
    return bool(((t != 0) & (t.abs() < torch.finfo(torch.float32).tiny)).any())


def test_far_taps_of_fast_decaying_modes_are_zero_never_subnormal():
    """|Λ|^k of a fast mode passes float32's smallest normal (1.2e-38) within a few hundred of L = 4096 taps. Those
    taps are 0, never subnormal floats (a CPU multiplies those ~50× slower: a DLR training step at L = 4096 ran
    3.7× longer with them), while the kernel and its gradients still match the complex128 reference."""
    length = 4096
    params = [t.clone().requires_grad_() for t in _params(state_size=8, dt_min=0.05, dt_max=2.0)]
    log_modulus, phase, _ = _modal(*params)
    assert float(log_modulus.min()) * length < -200  # Λ^k underflows float32 early for some modes
    fine = dlr_ops._fine_powers(log_modulus.detach(), phase.detach(), length)
    assert not _subnormal(dlr_ops._vandermonde_planes(log_modulus.detach(), phase.detach(), 0, length, fine))
    assert not _subnormal(lambda_powers(log_modulus.detach(), phase.detach(), 0, length))
    upstream = torch.randn(3, length, generator=torch.Generator().manual_seed(1))
    kernel = dlr_kernel(*params, length)
    torch.testing.assert_close(kernel, dlr_kernel_ref(*params, length), atol=2e-5, rtol=1e-4)
    fast = torch.autograd.grad((kernel * upstream).sum(), params)
    ref = [t.detach().double().requires_grad_() for t in params]
    lam = torch.polar(torch.exp(-(ref[0] ** 2)), ref[1])
    z = torch.complex(ref[2][..., 0], ref[2][..., 1]) @ torch.stack([lam**k for k in range(length)], dim=-1)
    expected = torch.autograd.grad((z.real * upstream.double()).sum(), ref)
    for got, want in zip(fast, expected):
        torch.testing.assert_close(got.double(), want, atol=1e-5 * want.abs().max().item(), rtol=0)


def test_scan_through_underflowing_powers_matches_the_recurrence():
    """The parallel scan's carried initial state and final state go through the powers under autograd, where
    zeroing a part would also zero its derivative (Im Λ^k of a real Λ is 0, its derivative in the phase is not):
    values and gradients against the complex128 recurrence at L = 1024, with modes that underflow float32."""
    length = 1024
    params = [t.clone().requires_grad_() for t in _params(state_size=8, dt_min=0.05, dt_max=2.0)]
    with torch.no_grad():
        params[1][0] = 0.0  # one real Λ: Im Λ^k = 0 exactly
    gen = torch.Generator().manual_seed(2)
    u, weight_out = torch.randn(2, 3, length, generator=gen), torch.randn(2, 3, length, generator=gen)
    state = _state(2, 3, 8, generator=gen)

    def loss(fn):
        y, final = fn(u, *_modal(*params), initial_state=state, return_final_state=True)
        return (y * weight_out).sum() + final.abs().square().sum()

    fast, slow = (torch.autograd.grad(loss(fn), params) for fn in (dlr_scan, dlr_scan_ref))
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, atol=2e-4 * b.abs().max().item(), rtol=0)
