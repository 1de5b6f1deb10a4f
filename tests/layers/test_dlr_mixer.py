"""The DLR mixer: convolution form vs recurrence, prefill hand-over, bidirectional Eq. 6, padding, dtypes."""

import pytest
import torch
import torch.nn.functional as F
from devices import bf16_autocast

from ssmhub.layers.dlr import DLRMixer
from ssmhub.ops.fftconv import fft_conv_ref


def _mixer(**kwargs):
    torch.manual_seed(0)
    defaults = {"hidden_size": 8, "state_size": 6, "weight_std": 0.3}
    return DLRMixer(**{**defaults, **kwargs}).eval()


@pytest.mark.parametrize("kernel_type", ["real", "prod"])
@pytest.mark.parametrize("options", [{}, {"use_glu": True}, {"skip_connection": "learned"}])
def test_step_by_step_equals_forward(kernel_type, options):
    mixer = _mixer(kernel_type=kernel_type, **options)
    x = torch.randn(2, 25, 8)
    y_full, _ = mixer(x)
    state = mixer.init_state(2)
    for t in range(x.shape[1]):
        y_t, state = mixer.step(x[:, t], state)
        torch.testing.assert_close(y_t, y_full[:, t], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kernel_type", ["real", "prod"])
def test_prefill_state_continues_in_chunks(kernel_type):
    """forward(prefix, return_state) then forward(rest, state) equals one forward over everything."""
    mixer = _mixer(kernel_type=kernel_type)
    x = torch.randn(2, 40, 8)
    y_full, final_full = mixer(x, return_state=True)
    y_a, state = mixer(x[:, :17], return_state=True)
    y_b, state = mixer(x[:, 17:31], state=state, return_state=True)
    y_c, state = mixer(x[:, 31:32], state=state, return_state=True)  # one token: the step path
    y_d, state = mixer(x[:, 32:], state=state, return_state=True)
    torch.testing.assert_close(torch.cat([y_a, y_b, y_c, y_d], 1), y_full, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(state["dlr_state"], final_full["dlr_state"], atol=1e-4, rtol=1e-4)


def test_matches_the_paper_layer_written_out():
    """y = W_out(GELU(conv(u, Re K) + u)), Figure 4 plus §2.3, via the dense Toeplitz reference."""
    mixer = _mixer()
    x = torch.randn(2, 30, 8)
    kernel = mixer.kernel(30)
    conv = fft_conv_ref(x.transpose(1, 2), kernel).transpose(1, 2)
    expected = mixer.output_linear(F.gelu(conv + x))
    torch.testing.assert_close(mixer(x)[0], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shared_lambda", [True, False])
def test_bidirectional_is_eq6(shared_lambda):
    mixer = _mixer(bidirectional=True, bidirectional_shared_lambda=shared_lambda)
    assert mixer.ssm.log_lambda_re.shape[0] == (1 if shared_lambda else 2)
    x = torch.randn(2, 30, 8)
    conv = fft_conv_ref(x.transpose(1, 2), mixer.kernel(30), mixer.kernel(30, direction=1)).transpose(1, 2)
    expected = mixer.output_linear(F.gelu(conv + x))
    torch.testing.assert_close(mixer(x)[0], expected, atol=1e-5, rtol=1e-5)
    x2 = x.clone()
    x2[:, -1] += 1.0
    assert (mixer(x2)[0][:, 0] - mixer(x)[0][:, 0]).abs().max() > 1e-4  # it does see the future


def test_bidirectional_cannot_step():
    mixer = _mixer(bidirectional=True)
    with pytest.raises(ValueError, match="bidirectional"):
        mixer.init_state(1)
    with pytest.raises(ValueError, match="bidirectional"):
        mixer(torch.randn(1, 4, 8), return_state=True)


def test_masked_positions_add_nothing_to_the_state():
    mixer = _mixer()
    x = torch.randn(1, 12, 8)
    padded = torch.cat([torch.randn(1, 5, 8), x], 1)  # 5 left-padding positions with garbage values
    mask = torch.cat([torch.zeros(1, 5), torch.ones(1, 12)], 1)
    y_alone, state_alone = mixer(x, return_state=True)
    y_pad, state_pad = mixer(padded, mask=mask, return_state=True)
    torch.testing.assert_close(y_pad[:, 5:], y_alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state_pad["dlr_state"], state_alone["dlr_state"], atol=1e-5, rtol=1e-5)


def test_bf16_autocast_keeps_recurrence_in_fp32():
    mixer = _mixer(state_size=64, hidden_size=16)
    x = torch.randn(2, 2048, 16)
    with bf16_autocast():
        y, state = mixer(x, return_state=True)
    assert mixer.ssm.weight.dtype == torch.float32
    assert state["dlr_state"].dtype == torch.float32  # real and imaginary planes, never bf16
    assert torch.isfinite(y).all()
    reference = mixer(x)[0]
    # what remains is bf16 rounding in W_out (~0.4% relative), not an error growing along the sequence
    relative = (y.float() - reference).abs().mean(dim=(0, 2)) / reference.abs().mean(dim=(0, 2))  # (L,)
    assert relative.max() < 2e-2


def test_state_size_is_independent_of_length():
    mixer = _mixer(state_size=5)
    for length in (1, 10, 300):
        _, state = mixer(torch.randn(3, length, 8), return_state=True)
        assert state["dlr_state"].shape == (3, 8, 2, 5)  # (B, H, 2, N): Re and Im planes
    assert _mixer(kernel_type="prod", state_size=5).init_state(2)["dlr_state"].shape == (2, 8, 2, 25)


@pytest.mark.parametrize(
    ("kwargs", "field"), [({"kernel_type": "imag"}, "kernel_type"), ({"skip_connection": "x"}, "skip")]
)
def test_bad_options_raise(kwargs, field):
    with pytest.raises(ValueError, match=field):
        DLRMixer(8, state_size=4, **kwargs)


def test_prod_decoding_memo_follows_parameter_updates():
    mixer = _mixer(kernel_type="prod")
    x = torch.randn(1, 5, 8)
    with torch.no_grad():
        state = mixer.init_state(1)
        first, _ = mixer.step(x[:, 0], state)
        assert mixer.step(x[:, 0], state)[0].equal(first)  # memoized recurrence: the same op on the same inputs
        mixer.ssm.weight.mul_(2.0)  # an in-place update (as an optimizer step) bumps the version
        y_full, _ = mixer(x)
        y_t, _ = mixer.step(x[:, 0], mixer.init_state(1))
    torch.testing.assert_close(y_t, y_full[:, 0], atol=1e-5, rtol=1e-5)
    assert not y_t.equal(first)
