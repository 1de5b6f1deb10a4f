"""H3's diagonal SSM (H3 arXiv 2212.14052 §3.1; S4D-Lin, ZOH, S4D arXiv 2206.11893 §3.1 and §4): its modal
form against the closed-form kernel, computed naively, on the kernel and on the gradients of every parameter."""

import math

import pytest
import torch

import ssmhub
from ssmhub.layers.diagonal_ssm import DiagonalSSMKernel
from ssmhub.layers.h3 import H3Mixer


def _s4d_kernel_loop(module: DiagonalSSMKernel, length: int) -> torch.Tensor:
    """``K[t] = 2·Re Σ_n C_n (exp(ΔA_n) − 1)/A_n · exp(ΔA_n t)``, one tap at a time in complex128.

    Differentiable in the module's parameters (through their float64 copies): the gradient reference too."""
    p = module.ssm
    dt = torch.exp(p.log_dt.double())
    a = torch.complex(-torch.exp(p.log_neg_real.double()), p.imag.double())
    c = torch.complex(p.c[..., 0].double(), p.c[..., 1].double())
    kernel = torch.zeros(p.num_heads, length, dtype=torch.float64)
    for h in range(p.num_heads):
        b_bar = (torch.exp(dt[h] * a[h]) - 1) / a[h]
        for t in range(length):
            kernel[h, t] = 2 * (c[h] * b_bar * torch.exp(dt[h] * a[h] * t)).sum().real
    return kernel


def test_kernel_is_the_zoh_discretized_s4d_kernel():
    torch.manual_seed(0)
    module = DiagonalSSMKernel(num_heads=3, state_size=5)
    p = module.ssm
    assert torch.allclose(p.imag[0], math.pi * torch.arange(5.0)) and torch.allclose(
        p.log_neg_real.exp(), torch.tensor(0.5)
    )
    dt = p.log_dt.exp()
    assert torch.all((dt >= 1e-3) & (dt <= 1e-1))
    torch.testing.assert_close(module(300).double(), _s4d_kernel_loop(module, 300), atol=1e-5, rtol=1e-4)


def test_gradients_of_every_kernel_parameter_equal_those_of_the_closed_form():
    """Autograd through the modal form (float32 storage of log|λ|, arg λ and c) against autograd through the
    complex128 tap-by-tap formula, for Δ, Re A, Im A and C. Parameters moved off the S4D-Lin init (distinct
    Re A_n, Im A_n off πn) and one Δ large enough that arg λ wraps past 2π; a random weighting of the taps
    reaches every one of them. Measured: every gradient within 8e-7 of its largest entry; tolerance 1e-5."""
    torch.manual_seed(0)
    module = DiagonalSSMKernel(num_heads=3, state_size=4)
    p = module.ssm
    with torch.no_grad():
        p.log_neg_real.add_(0.3 * torch.randn_like(p.log_neg_real))
        p.imag.add_(0.2 * torch.randn_like(p.imag))
        p.log_dt.copy_(torch.tensor([1e-3, 3e-2, 0.8]).log())  # Δ·Im A up to ~8 rad on the last head
    length = 96
    weights = torch.randn(3, length, dtype=torch.float64)
    params = [p.log_dt, p.log_neg_real, p.imag, p.c]  # D (skip) is applied by the H3 layer, not the kernel
    grads = torch.autograd.grad((module(length).double() * weights).sum(), params)
    grads_ref = torch.autograd.grad((_s4d_kernel_loop(module, length) * weights).sum(), params)
    for name, g, g_ref in zip(("log_dt", "log_neg_real", "imag", "c"), grads, grads_ref):
        assert g_ref.abs().amax() > 0, name
        atol = 1e-5 * g_ref.abs().amax().item()
        torch.testing.assert_close(g, g_ref, atol=atol, rtol=0, msg=lambda m, name=name: f"{name}: {m}")


def test_layer_decodes_step_by_step_like_its_forward():
    torch.manual_seed(1)
    layer = H3Mixer(hidden_size=8, max_kernel_length=16, kernel_type="diagonal_ssm", ssm_state_size=6).eval()
    x = torch.randn(2, 40, 8)
    full, _ = layer(x)
    state = layer.init_state(2)
    assert state["kv_state"].shape == (2, 1, 1, 8, 6)  # O(N) per channel, whatever the context
    steps = []
    for t in range(40):
        y_t, state = layer.step(x[:, t], state)
        steps.append(y_t)
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=1e-4)


def test_bad_requests_are_named():
    config = dict(vocab_size=50, hidden_size=8, num_hidden_layers=1, intermediate_size=16, attention_layers=[])
    with pytest.raises(ValueError, match="kernel_type"):
        ssmhub.H3Config(**config, kernel_type="s4")
    model = ssmhub.H3ForCausalLM(ssmhub.H3Config(**config, kernel_type="diagonal_ssm", ssm_state_size=4))
    with pytest.raises(ValueError, match="no long convolutions to distill"):
        model.distill_for_decoding(2)
    with pytest.raises(ValueError, match="decode_num_modes"):
        ssmhub.H3Config(**config, kernel_type="diagonal_ssm", decode_num_modes=4)
