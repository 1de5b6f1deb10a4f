"""The H3 mixer with long convolutions: naive per-token equations, decoding vs forward, padding, dtypes, arguments."""

import pytest
import torch
from comparisons import scaled_close
from devices import bf16_autocast

from ssmhub.layers.h3 import H3Mixer
from ssmhub.layers.longconv import LongConvKernel
from ssmhub.ops.longconv import DIRECT_TAIL_MAX, squash_kernel


def _mixer(**kwargs):
    torch.manual_seed(0)
    # λ = 0 and a large init scale keep every tap alive, so the tests see the whole kernel
    defaults = {"hidden_size": 8, "max_kernel_length": 16, "kernel_init_std": 0.3, "squash_lambda": 0.0}
    return H3Mixer(**{**defaults, **kwargs}).eval()


def _naive(mixer, x, mask=None):
    """The layer's equations with direct loops over positions, in float64."""
    x = x.double()
    if mask is not None:
        x = x * mask[..., None].double()
    w_in, b_in = mixer.in_proj.weight.double(), mixer.in_proj.bias.double()
    q, k, v = (x @ w_in.T + b_in).chunk(3, dim=-1)
    if mask is not None:
        k, v = k * mask[..., None].double(), v * mask[..., None].double()
    o = _naive_mix(mixer, q, k, v)
    return o @ mixer.out_proj.weight.double().T + mixer.out_proj.bias.double()


def _naive_mix(mixer, q, k, v, long_kernel=None):
    """Steps 2-5 (shift convolution, kv, long convolution with skip, q·s) with direct loops over positions, in
    float64, from the projections q, k, v (B, L, d): the output o (B, L, d) that goes into the output Linear.
    ``long_kernel``: (H, L) taps in place of the layer's (zeros leave only the skip D)."""
    q, k, v = q.double(), k.double(), v.double()
    batch, length, d = q.shape
    heads, dh = mixer.num_heads, mixer.head_dim
    shift, shift_skip = mixer.shift_kernel().double(), mixer.shift_conv.skip.double()  # (d, S), (d,)
    kernel = (mixer.kernel(length) if long_kernel is None else long_kernel).double()  # (H, L)
    skip = mixer.long_conv.skip.double()  # (H,)
    k_shift = torch.zeros_like(k)
    for t in range(length):
        for j in range(min(shift.shape[-1], t + 1)):
            k_shift[:, t] += shift[:, j] * k[:, t - j]
        k_shift[:, t] += shift_skip * k[:, t]
    kv = k_shift.view(batch, length, heads, dh, 1) * v.view(batch, length, heads, 1, dh)  # (B, L, H, i, j)
    s = torch.zeros_like(kv)
    for t in range(length):
        for j in range(t + 1):
            s[:, t] += kernel[:, j, None, None] * kv[:, t - j]
        s[:, t] += skip[:, None, None] * kv[:, t]
    return (q.view(batch, length, heads, dh, 1) * s).sum(3).reshape(batch, length, d)  # channel h·dh + j


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"ssm_num_heads": 2},  # head dim 4: the outer-product state
        {"ssm_num_heads": 1, "shift_kernel_size": 1},
        {"squash_lambda": 0.1, "smooth_width": 1, "kernel_init": "random"},
        {"regularize_shift_kernel": True, "shift_kernel_size": 16, "smooth_width": 2, "smooth_domain": "frequency"},
    ],
)
def test_forward_matches_naive_equations(options):
    mixer = _mixer(**options)
    x = torch.randn(2, 11, 8)
    y, _ = mixer(x)
    torch.testing.assert_close(y.double(), _naive(mixer, x), atol=1e-5, rtol=1e-5)


def test_kernel_is_the_regularized_parameter():
    mixer = _mixer(squash_lambda=0.2)
    torch.testing.assert_close(mixer.kernel(16), squash_kernel(mixer.long_conv.ssm.kernel, 0.2))
    assert mixer.kernel(16).shape == (8, 16) and mixer.kernel(16).dtype == torch.float32
    assert (mixer.kernel(16) == 0).any()


@pytest.mark.parametrize("ssm_num_heads", [None, 2])
def test_step_by_step_equals_forward(ssm_num_heads):
    mixer = _mixer(ssm_num_heads=ssm_num_heads)
    x = torch.randn(2, 20, 8)  # longer than max_kernel_length = 16: the window drops the oldest input
    y_full, _ = mixer(x)
    state = mixer.init_state(2)
    with torch.no_grad():
        for t in range(x.shape[1]):
            y_t, state = mixer.step(x[:, t], state)
            torch.testing.assert_close(y_t, y_full[:, t], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("ssm_num_heads", [None, 4])
def test_prefill_then_steps_equals_forward(ssm_num_heads):
    mixer = _mixer(ssm_num_heads=ssm_num_heads, max_kernel_length=7, shift_kernel_size=3)
    x = torch.randn(2, 24, 8)
    y_full, final_full = mixer(x, return_state=True)
    y_a, state = mixer(x[:, :9], return_state=True)
    outs = [y_a]
    for t in range(9, 12):
        y_t, state = mixer.step(x[:, t], state)
        outs.append(y_t.unsqueeze(1))
    y_c, state = mixer(x[:, 12:13], state=state, return_state=True)  # one token through forward: the step path
    y_d, state = mixer(x[:, 13:], state=state, return_state=True)  # a second chunk continues from the state
    torch.testing.assert_close(torch.cat([*outs, y_c, y_d], 1), y_full, atol=1e-5, rtol=1e-5)
    for name in final_full:
        torch.testing.assert_close(state[name], final_full[name], atol=1e-6, rtol=1e-6)
    assert state["shift_state"].shape == (2, 8, 2) and state["kv_state"].dtype == torch.float32


def test_windows_longer_than_the_direct_tail_continue_by_fft_as_the_loop():
    """Windows of more than DIRECT_TAIL_MAX tokens, each continuing from the last one's state (stateful evaluation):
    the long convolution continues by overlap-save (:func:`ssmhub.ops.fftconv.fft_conv_continue`), and the outputs
    are the layer's equations looped over the whole sequence; the final state is the one-pass forward's."""
    mixer = _mixer(ssm_num_heads=2, max_kernel_length=DIRECT_TAIL_MAX + 8)
    window = DIRECT_TAIL_MAX + 4
    x = torch.randn(1, 3 * window - 5, 8)  # the last window is shorter
    _, final_full = mixer(x, return_state=True)
    state, outs = None, []
    with torch.no_grad():
        for begin in range(0, x.shape[1], window):
            y, state = mixer(x[:, begin : begin + window], state=state, return_state=True)
            outs.append(y)
    scaled_close(torch.cat(outs, 1), _naive(mixer, x), what="windows vs loop")
    for name in final_full:
        torch.testing.assert_close(state[name], final_full[name], atol=1e-6, rtol=1e-6)  # projections' round-off


def test_left_padded_row_equals_unpadded_row():
    mixer = _mixer(ssm_num_heads=4)
    pad, length = 5, 9
    x = torch.randn(1, length, 8)
    garbage = 100 * torch.randn(1, pad, 8)  # whatever sits under the padding must not matter
    padded = torch.cat([garbage, x], 1)
    mask = torch.cat([torch.zeros(1, pad), torch.ones(1, length)], 1)
    y_alone, state_alone = mixer(x, return_state=True)
    y_padded, state_padded = mixer(padded, mask=mask, return_state=True)
    torch.testing.assert_close(y_padded[:, pad:], y_alone, atol=1e-5, rtol=1e-5)
    for name in state_alone:  # padding only pushed zeros into the windows
        torch.testing.assert_close(state_padded[name], state_alone[name], atol=1e-6, rtol=1e-6)
    # a batch of the padded row and another row, and decoding after it
    other = torch.randn(1, pad + length, 8)
    batch_y, batch_state = mixer(
        torch.cat([padded, other]), mask=torch.cat([mask, torch.ones_like(mask)]), return_state=True
    )
    torch.testing.assert_close(batch_y[:1, pad:], y_alone, atol=1e-5, rtol=1e-5)
    nxt = torch.randn(1, 8)
    y_next_alone, _ = mixer.step(nxt, state_alone)
    y_next_batch, _ = mixer.step(torch.cat([nxt, nxt]), batch_state)
    torch.testing.assert_close(y_next_batch[:1], y_next_alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mixer(padded, mask=mask)[0][:, pad:], _naive(mixer, x).float(), atol=1e-5, rtol=1e-5)


def test_input_longer_than_max_kernel_length():
    mixer = _mixer(max_kernel_length=5)
    x = torch.randn(2, 13, 8)
    kernel = mixer.kernel(13)
    assert kernel.shape == (8, 13) and (kernel[:, 5:] == 0).all()  # zero padding past max_kernel_length
    torch.testing.assert_close(kernel[:, :5], mixer.kernel(5))
    y, _ = mixer(x)
    torch.testing.assert_close(y.double(), _naive(mixer, x), atol=1e-5, rtol=1e-5)
    state = mixer.init_state(2)
    assert state["kv_state"].shape == (2, 1, 1, 8, 4)  # the window never grows with the context
    for t in range(13):
        y_t, state = mixer.step(x[:, t], state)
    torch.testing.assert_close(y_t, y[:, -1], atol=1e-5, rtol=1e-5)


def test_gradients_reach_the_kernels():
    mixer = _mixer(squash_lambda=0.05).train()
    x = torch.randn(2, 10, 8)
    mixer(x)[0].square().sum().backward()
    for param in (mixer.long_conv.ssm.kernel, mixer.long_conv.ssm.skip, mixer.shift_conv.ssm.kernel):
        assert param.grad is not None and param.grad.abs().sum() > 0
    squashed = mixer.long_conv.ssm.kernel.abs() <= 0.05  # soft-thresholded taps get no gradient
    assert (mixer.long_conv.ssm.kernel.grad[squashed] == 0).all()  # masked: the threshold's gradient is 0
    assert {name for name, _ in mixer.named_parameters() if ".ssm." in f".{name}"} == {
        "shift_conv.ssm.kernel",
        "shift_conv.ssm.skip",
        "long_conv.ssm.kernel",
        "long_conv.ssm.skip",
    }


@pytest.mark.parametrize(
    "options",
    [
        {"squash_lambda": 0.1},  # the default direct shift FIR; squashed taps get no gradient
        {"ssm_num_heads": 2, "regularize_shift_kernel": True, "shift_kernel_size": 16, "max_kernel_length": 7},
    ],
    ids=["heads_of_1_direct_shift", "heads_of_4_fft_shift"],
)
def test_gradients_match_naive_equations(options):
    """The gradients (custom backward of the short and FFT convolutions) with respect to x and every parameter,
    against autograd through the float64 loops of :func:`_naive`."""
    mixer = _mixer(**options)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 11, 8, generator=gen)
    weight = torch.randn(2, 11, 8, generator=gen)
    x_run, x_ref = x.clone().requires_grad_(), x.double().requires_grad_()
    params = dict(mixer.named_parameters())
    grads = torch.autograd.grad((mixer(x_run)[0] * weight).sum(), [x_run, *params.values()])
    grads_ref = torch.autograd.grad((_naive(mixer, x_ref) * weight.double()).sum(), [x_ref, *params.values()])
    for name, grad, grad_ref in zip(["x", *params], grads, grads_ref):
        scaled_close(grad, grad_ref, 1e-5, f"grad {name}")


@pytest.mark.parametrize("length", [21, 3])
@pytest.mark.parametrize("shift_kernel_size", [1, 4, 16])
def test_direct_shift_equals_fft_shift(shift_kernel_size, length):
    """The direct FIR of a short shift kernel (the default) against the FFT path it replaces: outputs,
    final windows and every gradient, from a zero start and from a state."""
    mixer = _mixer(shift_kernel_size=shift_kernel_size, ssm_num_heads=4)
    assert mixer.direct_shift
    x = torch.randn(2, length, 8)  # 3: shorter than a 16-tap window
    state = {name: torch.randn_like(value) for name, value in mixer.init_state(2).items()}
    results = []
    for direct in (True, False):
        mixer.direct_shift = direct
        mixer.zero_grad()
        x_run = x.clone().requires_grad_()
        history = state["shift_state"].clone().requires_grad_()
        y0, _ = mixer(x_run)
        y1, final = mixer(x_run, state={**state, "shift_state": history}, return_state=True)
        (y0.square().sum() + y1.sin().sum() + final["shift_state"].square().sum()).backward()
        grads = [p.grad.clone() for p in mixer.parameters()]
        results.append((y0, y1, final["shift_state"], x_run.grad, history.grad, *grads))
    for direct_value, fft_value in zip(*results):  # both float32: the FFT's round-off
        torch.testing.assert_close(direct_value, fft_value, atol=2e-5, rtol=1e-4)


def test_kernel_dropout_only_in_training():
    mixer = _mixer(kernel_dropout=0.5)
    torch.testing.assert_close(mixer.kernel(16), mixer.long_conv.ssm.kernel)
    mixer.train()
    torch.manual_seed(1)
    dropped = mixer.kernel(16)
    assert (dropped == 0).any() and not torch.equal(dropped, mixer.kernel(16))  # dropout zeros; another draw


def test_eval_kernel_memo_follows_parameter_updates():
    mixer = _mixer()
    with torch.no_grad():
        before = mixer.kernel(16).clone()
        mixer.long_conv.ssm.kernel.add_(1.0)
        torch.testing.assert_close(mixer.kernel(16), before + 1.0)


def _relative_error(got, expected, scale):
    """‖got − expected‖ / ‖scale‖ (Frobenius norms), in float64."""
    return ((got.double() - expected.double()).norm() / scale.double().norm()).item()


# bf16's unit round-off: the projections under autocast round q, k, v and o (the output Linear's input) to it
BF16_EPS = 2.0**-8


def test_bf16_autocast_keeps_convolutions_in_float32():
    """Under bf16 autocast the projections run in bf16 but both convolutions stay float32. The output Linear's
    input o must equal the float64 loops of :func:`_naive_mix` run on the same bf16 q, k, v, to float32 round-off
    of the part the long kernel contributes (o minus its value with the long kernel zeroed). Measured relative
    error: 2e-7 as it is; 4e-3 if the long convolution's input is rounded to bf16, 5.5e-3 if its output is too
    (a bf16 convolution). The output y differs from the fp32 layer's by about 6e-3 of ‖y‖ either way (the
    projections' rounding), so y alone cannot tell a bf16 convolution from a float32 one."""
    mixer = _mixer(ssm_num_heads=2)
    x = torch.randn(2, 12, 8)
    with torch.no_grad():
        y32, state32 = mixer(x, return_state=True)
        y32_t, _ = mixer.step(x[:, 0], state32)
    seen = {}
    hooks = [
        mixer.in_proj.register_forward_hook(lambda module, args, out: seen.setdefault("qkv", []).append(out)),
        mixer.out_proj.register_forward_pre_hook(lambda module, args: seen.setdefault("o", []).append(args[0])),
    ]
    with bf16_autocast():
        assert mixer.kernel(12).dtype == torch.float32
        y, state = mixer(x, return_state=True)
        y_t, state = mixer.step(x[:, 0], state)
    for hook in hooks:
        hook.remove()
    assert state["kv_state"].dtype == torch.float32 and state["shift_state"].dtype == torch.float32
    (qkv, qkv_t), (o, o_t) = seen["qkv"], seen["o"]
    assert qkv.dtype == torch.bfloat16 and o.dtype == torch.float32 and o_t.dtype == torch.float32
    q, k, v = torch.cat([qkv, qkv_t[:, None]], dim=1).chunk(3, dim=-1)  # 13 tokens: the sequence, then the step
    o_ref = _naive_mix(mixer, q, k, v)
    kernel_part = o_ref - _naive_mix(mixer, q, k, v, long_kernel=torch.zeros(2, 13))
    assert _relative_error(o, o_ref[:, :12], kernel_part[:, :12]) < 3e-5  # forward: FFT convolutions
    assert _relative_error(o_t, o_ref[:, 12], kernel_part[:, 12]) < 3e-5  # step: direct sums
    assert _relative_error(y, y32, y32) < 4 * BF16_EPS and _relative_error(y_t, y32_t, y32_t) < 4 * BF16_EPS
    # a half-precision model whose ``ssm`` submodules stay float32 (what the model tier does): the bf16 weights'
    # rounding on top of the projections'
    mixer = mixer.to(torch.bfloat16)
    mixer.long_conv.ssm.float()
    mixer.shift_conv.ssm.float()
    y16, state = mixer(x.bfloat16(), return_state=True)
    assert y16.dtype == torch.bfloat16 and state["kv_state"].dtype == torch.float32
    assert _relative_error(y16, y32, y32) < 4 * BF16_EPS


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"max_kernel_length": 0}, "max_kernel_length"),
        ({"shift_kernel_size": 0}, "shift_kernel_size"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"squash_lambda": -0.1}, "squash_lambda"),
        ({"smooth_width": -1}, "smooth_width"),
        ({"kernel_dropout": 1.5}, "kernel_dropout"),
        ({"ssm_num_heads": 3}, "ssm_num_heads"),
        ({"ssm_num_heads": 0}, "ssm_num_heads"),
        ({"kernel_init": "s4"}, "kernel_init"),
        ({"smooth_domain": "space"}, "smooth_domain"),
        ({"kernel_regularization_order": ("squash", "blur")}, "regularization_order"),
        ({"geometric_convention": "mine"}, "geometric_convention"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        _mixer(**kwargs)


def test_bad_inputs_and_states():
    mixer = _mixer()
    with pytest.raises(ValueError, match="x must have shape"):
        mixer(torch.randn(2, 5, 7))
    with pytest.raises(ValueError, match="mask must have shape"):
        mixer(torch.randn(2, 5, 8), mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="state must hold"):
        mixer.step(torch.randn(3, 8), mixer.init_state(2))
    with pytest.raises(ValueError, match="length"):
        LongConvKernel(4, 8)(0)
