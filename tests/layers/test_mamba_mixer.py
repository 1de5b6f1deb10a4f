"""The Mamba mixer: equal to transformers' MambaMixer on the same weights, and its recurrent form equal
to its parallel form (continuation, step-by-step, left padding)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from comparisons import scaled_close
from transformers import MambaConfig
from transformers.models.mamba.modeling_mamba import MambaMixer as TransformersMambaMixer

from ssmhub.layers.mamba import MambaMixer

HIDDEN, STATE = 16, 4  # inner width expand × HIDDEN = 32


def make_mixer(seed=0, **kwargs):
    torch.manual_seed(seed)
    mixer = MambaMixer(HIDDEN, state_size=STATE, **kwargs)
    with torch.no_grad():  # move Δ away from its tiny init so that the state carries real history
        mixer.dt_proj.bias.add_(2.0)
        mixer.ssm.D.normal_()
    return mixer


def test_matches_transformers_mamba_mixer():
    config = MambaConfig(hidden_size=HIDDEN, state_size=STATE, expand=2, num_hidden_layers=1, use_mambapy=False)
    theirs = TransformersMambaMixer(config, layer_idx=0).eval()
    ours = MambaMixer(HIDDEN, state_size=STATE, time_step_rank=int(config.time_step_rank))
    state = {k if k not in ("A_log", "D") else f"ssm.{k}": v for k, v in theirs.state_dict().items()}
    ours.load_state_dict(state, strict=True)
    x = torch.randn(3, 29, HIDDEN)
    with torch.no_grad():
        expected = theirs(x)
        got, _ = ours(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scan", ["chunked", "sequential"])
def test_continuation_and_steps_equal_the_whole_sequence(scan):
    mixer = make_mixer(scan=scan)
    x = torch.randn(2, 23, HIDDEN)
    with torch.no_grad():
        whole, whole_state = mixer(x, return_state=True)
        first, state = mixer(x[:, :15], return_state=True)
        second, split_state = mixer(x[:, 15:], state=state, return_state=True)
        torch.testing.assert_close(torch.cat([first, second], 1), whole, rtol=1e-5, atol=1e-6)
        for name in whole_state:
            torch.testing.assert_close(split_state[name], whole_state[name], rtol=1e-5, atol=1e-6)
        state = mixer.init_state(2)
        steps = []
        for t in range(x.shape[1]):
            y_t, state = mixer.step(x[:, t], state)
            steps.append(y_t)
        torch.testing.assert_close(torch.stack(steps, 1), whole, rtol=1e-5, atol=1e-6)
        # pieces shorter than the convolution's k − 1 = 3 inputs: the window mixes old and new inputs
        state, pieces = None, []
        for start, stop in ((0, 2), (2, 4), (4, 5), (5, 23)):
            piece, state = mixer(x[:, start:stop], state=state, return_state=True)
            pieces.append(piece)
        torch.testing.assert_close(torch.cat(pieces, 1), whole, rtol=1e-5, atol=1e-6)
        for name in whole_state:
            torch.testing.assert_close(state[name], whole_state[name], rtol=1e-5, atol=1e-6)


def test_sequential_and_chunked_scans_agree():
    chunked, sequential = make_mixer(scan="chunked"), make_mixer(scan="sequential")
    x = torch.randn(2, 70, HIDDEN, requires_grad=True)
    y1, _ = chunked(x)
    y2, _ = sequential(x)
    torch.testing.assert_close(y1, y2, rtol=1e-5, atol=1e-6)
    (g1,) = torch.autograd.grad(y1.square().sum(), x)
    (g2,) = torch.autograd.grad(y2.square().sum(), x)
    torch.testing.assert_close(g1, g2, rtol=1e-4, atol=1e-5)


def _mixer_by_loop(mixer, x, mask=None):
    """The mixer's equations (module docstring; arXiv 2312.00752 §3.4, Fig. 3 and Algorithm 2) one token at a
    time in float64, written from the parameters alone: input projection, a window of the last k inputs for the
    depthwise convolution (tap k − 1 meets the newest), SiLU, Δ/B/C, ``h = exp(Δ·A)·h + Δ·x·B``,
    ``y = (C·h + D·x)·SiLU(z)``, output projection. Padding: the input, the convolution output and Δ are zeroed.
    Plain autograd through every step: no custom backward."""
    p = {name: t.double() for name, t in mixer.named_parameters()}
    E, N, R, k = mixer.intermediate_size, mixer.state_size, mixer.time_step_rank, mixer.conv_kernel
    batch, length, _ = x.shape
    keep = torch.ones(batch, length, 1, dtype=torch.float64) if mask is None else mask[..., None].double()
    A = -torch.exp(p["ssm.A_log"])  # (E, N)
    window = x.new_zeros(batch, E, k, dtype=torch.float64)  # the convolution's last k inputs, newest last
    h = x.new_zeros(batch, E, N, dtype=torch.float64)
    ys = []
    for t in range(length):
        u, z = F.linear(x[:, t].double() * keep[:, t], p["in_proj.weight"], p.get("in_proj.bias")).chunk(2, -1)
        window = torch.cat([window[..., 1:], u[..., None]], dim=-1)
        c = F.silu((window * p["conv1d.weight"][:, 0]).sum(-1) + p["conv1d.bias"]) * keep[:, t]  # (B, E)
        dt, B, C = F.linear(c, p["x_proj.weight"]).split([R, N, N], dim=-1)
        delta = F.softplus(F.linear(dt, p["dt_proj.weight"], p["dt_proj.bias"])) * keep[:, t]  # (B, E)
        h = torch.exp(delta[..., None] * A) * h + (delta * c)[..., None] * B[:, None, :]  # (B, E, N)
        y = ((h * C[:, None, :]).sum(-1) + p["ssm.D"] * c) * F.silu(z)
        ys.append(F.linear(y, p["out_proj.weight"], p.get("out_proj.bias")))
    return torch.stack(ys, dim=1)


@pytest.mark.parametrize("padded", [False, True], ids=["no_mask", "left_padded"])
def test_forward_and_gradients_match_the_token_loop(padded):
    """The chunked fast path (custom backward of the selective scan and of the short convolution) against
    :func:`_mixer_by_loop` in float64: outputs and the gradients with respect to x and every parameter, over
    23 tokens (two scan chunks of 16)."""
    mixer = make_mixer()
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 23, HIDDEN, generator=gen)
    mask = torch.cat([torch.zeros(2, 4), torch.ones(2, 19)], 1) if padded else None
    if padded:
        mask[1] = 1  # row 0 left-padded by 4, row 1 not
    weight = torch.randn(2, 23, HIDDEN, generator=gen)
    x_run, x_ref = x.clone().requires_grad_(), x.double().requires_grad_()
    y, _ = mixer(x_run, mask=mask)
    y_ref = _mixer_by_loop(mixer, x_ref, mask)
    scaled_close(y, y_ref.detach(), 1e-5, "y")
    leaves = dict(mixer.named_parameters())
    grads = torch.autograd.grad((y * weight).sum(), [x_run, *leaves.values()])
    grads_ref = torch.autograd.grad((y_ref * weight.double()).sum(), [x_ref, *leaves.values()])
    for name, grad, grad_ref in zip(["x", *leaves], grads, grads_ref):
        scaled_close(grad, grad_ref, 1e-5, f"grad {name}")


def test_left_padding_gives_the_numbers_of_the_row_alone():
    mixer = make_mixer()
    x = torch.randn(1, 9, HIDDEN)
    padded = torch.cat([torch.randn(1, 4, HIDDEN), x], 1)
    mask = torch.tensor([[0] * 4 + [1] * 9])
    with torch.no_grad():
        alone, alone_state = mixer(x, return_state=True)
        got, state = mixer(padded, mask=mask, return_state=True)
    torch.testing.assert_close(got[:, 4:], alone, rtol=1e-5, atol=1e-6)
    for name in state:
        torch.testing.assert_close(state[name], alone_state[name], rtol=1e-5, atol=1e-6)


def test_padding_leaves_the_state_unchanged_in_a_step():
    mixer = make_mixer()
    with torch.no_grad():
        _, state = mixer(torch.randn(2, 5, HIDDEN), return_state=True)
        _, after = mixer(torch.randn(2, 1, HIDDEN), mask=torch.zeros(2, 1), state=state, return_state=True)
    torch.testing.assert_close(after["ssm_state"], state["ssm_state"])


def test_output_size_and_time_step_init():
    mixer = MambaMixer(HIDDEN, state_size=STATE, output_size=8)
    y, _ = mixer(torch.randn(2, 5, HIDDEN))
    assert y.shape == (2, 5, 8)
    assert mixer.time_step_rank == 1  # ⌈16 / 16⌉
    dt = torch.nn.functional.softplus(mixer.dt_proj.bias)
    assert dt.min() >= 1e-4 - 1e-9 and dt.max() <= 0.1 + 1e-6  # log-uniform in [time_step_min, time_step_max]
    torch.testing.assert_close(mixer.A()[0], -torch.arange(1.0, STATE + 1))


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"state_size": 0}, "state_size"),
        ({"conv_kernel": 0}, "conv_kernel"),
        ({"time_step_min": 0.5, "time_step_max": 0.1}, "time_step_min"),
        ({"time_step_init_scheme": "zeros"}, "time_step_init_scheme"),
        ({"scan": "fast"}, "scan"),
    ],
)
def test_bad_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        MambaMixer(HIDDEN, **kwargs)
