"""H3's diagonal SSM (H3 arXiv 2212.14052 §3.1; S4D-Lin, S4D arXiv 2206.11893 §3.1 and §4) in both
discretizations: its modal form against the closed-form kernel and the recurrence, computed naively from the
formulas, on the kernel, the decode step and the gradients of every parameter."""

import math

import pytest
import torch

import ssmhub
from ssmhub.layers.diagonal_ssm import DiagonalSSMKernel
from ssmhub.layers.h3 import H3Mixer
from ssmhub.layers.h3_convolutions import DiagonalSSMConvolution

DISCRETIZATIONS = ("bilinear", "zoh")


def _discretized(module: DiagonalSSMKernel):
    """``(λ, B̄, C)`` (H, N) complex128 by the formulas: bilinear ``λ = (1 + ΔA/2)/(1 − ΔA/2)``,
    ``B̄ = Δ/(1 − ΔA/2)``; ZOH ``λ = exp(ΔA)``, ``B̄ = (exp(ΔA) − 1)/A``. Differentiable in the parameters."""
    p = module.ssm
    dt = torch.exp(p.log_dt.double())[:, None]
    a = torch.complex(-torch.exp(p.log_neg_real.double()), p.imag.double())
    c = torch.complex(p.c[..., 0].double(), p.c[..., 1].double())
    if module.discretization == "bilinear":
        return (1 + dt * a / 2) / (1 - dt * a / 2), dt / (1 - dt * a / 2), c
    return torch.exp(dt * a), (torch.exp(dt * a) - 1) / a, c


def _s4d_kernel_loop(module: DiagonalSSMKernel, length: int) -> torch.Tensor:
    """``K[t] = 2·Re Σ_n C_n B̄_n λ_n^t``, one tap at a time in complex128 (the gradient reference too)."""
    lam, b_bar, c = _discretized(module)
    taps = [2 * (c * b_bar * lam**t).sum(-1).real for t in range(length)]
    return torch.stack(taps, -1)  # (H, length)


def _recurrence_loop(module: DiagonalSSMKernel, u: torch.Tensor) -> torch.Tensor:
    """The SSM run as a recurrence on u (B, H, L): ``x_t = λ x_{t−1} + B̄ u_t``, ``y_t = 2·Re(C·x_t) + D u_t``."""
    lam, b_bar, c = _discretized(module)
    x = torch.zeros(u.shape[0], *lam.shape, dtype=torch.complex128)
    ys = []
    for t in range(u.shape[-1]):
        x = lam * x + b_bar * u[..., t, None].double()
        ys.append(2 * (c * x).sum(-1).real + module.skip.double() * u[..., t].double())
    return torch.stack(ys, -1)


@pytest.mark.parametrize("discretization", DISCRETIZATIONS)
def test_kernel_is_the_discretized_s4d_kernel(discretization):
    torch.manual_seed(0)
    module = DiagonalSSMKernel(num_heads=3, state_size=5, discretization=discretization)
    p = module.ssm
    assert torch.allclose(p.imag[0], math.pi * torch.arange(5.0)) and torch.allclose(
        p.log_neg_real.exp(), torch.tensor(0.5)
    )
    dt = p.log_dt.exp()
    assert torch.all((dt >= 1e-3) & (dt <= 1e-1))
    torch.testing.assert_close(module(300).double(), _s4d_kernel_loop(module, 300), atol=1e-5, rtol=1e-4)


def test_the_two_discretizations_differ_as_the_formulas_do():
    """The same parameters under both: bilinear and ZOH poles differ at O((ΔA)³) (log λ = ΔA + (ΔA)³/12 + …), so
    with Δ = 0.5 and |Im A| up to 7π the kernels differ by far more than round-off (the first head, Δ = 10⁻³, much
    less); a mismatch of the two would be a wrong model, not noise."""
    torch.manual_seed(3)
    bilinear = DiagonalSSMKernel(num_heads=2, state_size=8)
    with torch.no_grad():
        bilinear.ssm.log_dt.copy_(torch.tensor([1e-3, 0.5]).log())
    zoh = DiagonalSSMKernel(num_heads=2, state_size=8, discretization="zoh")
    zoh.load_state_dict(bilinear.state_dict())
    assert bilinear.discretization == "bilinear"  # H3's default
    with torch.no_grad():
        gap = (bilinear(64) - zoh(64)).norm(dim=-1) / zoh(64).norm(dim=-1)  # (H,)
    assert gap[1] > 0.1 and gap[0] < gap[1]


@pytest.mark.parametrize("discretization", DISCRETIZATIONS)
def test_the_decode_step_is_the_recurrence(discretization):
    """The modal step (O(N) per channel), from a prefill's state and then token by token, against the recurrence
    written from the formulas, float64 reference; the float32 state keeps it within 1e-5 of the largest output."""
    torch.manual_seed(2)
    module = DiagonalSSMKernel(num_heads=4, state_size=6, discretization=discretization)
    with torch.no_grad():
        module.ssm.log_dt.copy_(torch.tensor([1e-3, 1e-2, 1e-1, 0.5]).log())
    conv = DiagonalSSMConvolution(module)
    u = torch.randn(2, 4, 50)
    expected = _recurrence_loop(module, u)  # (B, H, L)
    with torch.no_grad():
        prefill, state = conv.convolve(u[..., :20], None, True)
        steps = []
        for t in range(20, 50):
            y_t, state = conv.step(u[..., t], state)
            steps.append(y_t)
    got = torch.cat([prefill, torch.stack(steps, -1)], -1).double()
    torch.testing.assert_close(got, expected, atol=1e-5 * expected.abs().amax().item(), rtol=0)


@pytest.mark.parametrize("discretization", DISCRETIZATIONS)
def test_gradients_of_every_kernel_parameter_equal_those_of_the_closed_form(discretization):
    """Autograd through the modal form (float32 storage of log|λ|, arg λ and c) against autograd through the
    complex128 tap-by-tap formula, for Δ, Re A, Im A and C. Parameters moved off the S4D-Lin init (distinct
    Re A_n, Im A_n off πn) and one Δ large enough that arg λ wraps past 2π under ZOH; a random weighting of the taps
    reaches every one of them. The float32 storage of log|λ| and arg λ puts a relative error of about t·eps into
    λ^t, so over 96 taps a gradient is good to ~96·eps ≈ 1e-5 of its largest entry: the tolerance is 4·96·eps.
    Measured (largest error / largest entry): 8e-7 under ZOH, 1.3e-5 bilinear (its poles sit nearer the unit circle
    at large Δ·|A|, so the late taps weigh more)."""
    torch.manual_seed(0)
    module = DiagonalSSMKernel(num_heads=3, state_size=4, discretization=discretization)
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
        atol = 4 * length * torch.finfo(torch.float32).eps * g_ref.abs().amax().item()
        torch.testing.assert_close(g, g_ref, atol=atol, rtol=0, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("discretization", DISCRETIZATIONS)
def test_layer_decodes_step_by_step_like_its_forward(discretization):
    torch.manual_seed(1)
    options = dict(kernel_type="diagonal_ssm", ssm_state_size=6, ssm_discretization=discretization)
    layer = H3Mixer(hidden_size=8, max_kernel_length=16, **options).eval()
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
    with pytest.raises(ValueError, match="ssm_discretization"):
        ssmhub.H3Config(**config, kernel_type="diagonal_ssm", ssm_discretization="euler")


def test_the_default_state_is_h3s_d_state_64():
    """H3's ``d_state = 64`` counts both members of each conjugate pair: 32 complex modes A_n = −1/2 + iπn."""
    layer = H3Mixer(hidden_size=4, kernel_type="diagonal_ssm")
    p = layer.long_conv.ssm
    assert p.state_size == 32 == ssmhub.H3Config().ssm_state_size
    torch.testing.assert_close(p.imag[0], math.pi * torch.arange(32.0))


@pytest.mark.parametrize("discretization", DISCRETIZATIONS)
def test_cached_generation_is_the_full_forward(discretization):
    """Greedy ``generate`` through the modal cache gives the tokens that recomputing the whole sequence at every
    step gives (``use_cache=False``), and the cached logits are those of one full forward over the result."""
    torch.manual_seed(4)
    config = ssmhub.H3Config(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=2,
        intermediate_size=32,
        attention_layers=[],
        kernel_type="diagonal_ssm",
        ssm_state_size=6,
        ssm_discretization=discretization,
    )
    model = ssmhub.H3ForCausalLM(config).eval()
    prompt = torch.randint(0, 40, (2, 7))
    options = dict(max_new_tokens=12, do_sample=False, output_logits=True, return_dict_in_generate=True)
    cached = model.generate(prompt, **options)
    recomputed = model.generate(prompt, use_cache=False, **options)
    assert torch.equal(cached.sequences, recomputed.sequences)
    with torch.no_grad():
        full = model(cached.sequences).logits[:, prompt.shape[1] - 1 : -1]
    got = torch.stack(cached.logits, 1)
    torch.testing.assert_close(got, full, atol=1e-4 * full.abs().amax().item(), rtol=0)
