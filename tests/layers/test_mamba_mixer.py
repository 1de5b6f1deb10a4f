"""The Mamba mixer: equal to transformers' MambaMixer on the same weights, and its recurrent form equal
to its parallel form (continuation, step-by-step, left padding)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from comparisons import FP32_REL, scaled_close
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
    ``y = (C·h + D·x)·SiLU(z)``, output projection. Padding: the input, the convolution output and Δ are zeroed,
    and the window holds (a pad is no input). Plain autograd through every step: no custom backward."""
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
        window = torch.where(keep[:, t, :, None] > 0, torch.cat([window[..., 1:], u[..., None]], dim=-1), window)
        c = F.silu((window * p["conv1d.weight"][:, 0]).sum(-1) + p["conv1d.bias"]) * keep[:, t]  # (B, E)
        dt, B, C = F.linear(c, p["x_proj.weight"]).split([R, N, N], dim=-1)
        delta = F.softplus(F.linear(dt, p["dt_proj.weight"], p["dt_proj.bias"])) * keep[:, t]  # (B, E)
        h = torch.exp(delta[..., None] * A) * h + (delta * c)[..., None] * B[:, None, :]  # (B, E, N)
        y = ((h * C[:, None, :]).sum(-1) + p["ssm.D"] * c) * F.silu(z)
        ys.append(F.linear(y, p["out_proj.weight"], p.get("out_proj.bias")))
    return torch.stack(ys, dim=1)


@pytest.mark.parametrize("padding", [None, "left", "holes"])
def test_forward_and_gradients_match_the_token_loop(padding):
    """The chunked fast path (custom backward of the selective scan and of the short convolution) against
    :func:`_mixer_by_loop` in float64: outputs and the gradients with respect to x and every parameter, over
    23 tokens (two scan chunks of 16); row 0 left-padded by 4 (and with holes), row 1 not padded."""
    mixer = make_mixer()
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 23, HIDDEN, generator=gen)
    mask = None if padding is None else torch.ones(2, 23)
    if padding is not None:
        mask[0, :4] = 0
    if padding == "holes":
        mask[0, [6, 10, 11, 17]] = 0
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
    """A pad leaves both states exactly as they were: the window holds and Δ = 0 (exp(0·A) = 1, nothing added)."""
    mixer = make_mixer()
    with torch.no_grad():
        _, state = mixer(torch.randn(2, 5, HIDDEN), return_state=True)
        _, after = mixer(torch.randn(2, 1, HIDDEN), mask=torch.zeros(2, 1), state=state, return_state=True)
    for name in state:
        torch.testing.assert_close(after[name], state[name], rtol=0, atol=0)


def _with_pads(x, pads):
    """x (B, L, H) with random rows inserted before positions ``pads`` (a list per row of the same length), and the
    mask (0 at the inserted rows)."""
    rows, masks = [], []
    for b, positions in enumerate(pads):
        pieces, keep, previous = [], [], 0
        for p in [*sorted(positions), x.shape[1]]:
            pieces.append(x[b, previous:p])
            keep += [1] * (p - previous)
            if p < x.shape[1]:
                pieces.append(torch.randn(1, x.shape[2]))
                keep.append(0)
            previous = p
        rows.append(torch.cat(pieces))
        masks.append(torch.tensor(keep))
    return torch.stack(rows), torch.stack(masks)


@pytest.mark.parametrize("form", ["parallel", "steps", "continued"])
def test_holes_inside_a_row_change_nothing_later_tokens_see(form):
    """Pads inside a row (holes, several in a row, left padding) give the outputs at the real positions and the
    final state of the row without them: in one parallel forward, token by token, and in a forward continued after
    a state. Rows of a batch padded differently each equal themselves alone."""
    mixer = make_mixer()
    x = torch.randn(2, 11, HIDDEN)
    padded, mask = _with_pads(x, [[0, 0, 3, 4, 4, 8], [1, 2, 2, 5, 9, 10]])  # (2, 17, H)
    with torch.no_grad():
        alone, alone_state = mixer(x, return_state=True)
        if form == "parallel":
            got, state = mixer(padded, mask=mask, return_state=True)
        elif form == "steps":
            state, outputs = mixer.init_state(2), []
            for t in range(padded.shape[1]):
                y_t, state = mixer(padded[:, t : t + 1], mask=mask[:, t : t + 1], state=state, return_state=True)
                outputs.append(y_t)
            got = torch.cat(outputs, 1)
        else:
            first, state = mixer(padded[:, :6], mask=mask[:, :6], return_state=True)
            second, state = mixer(padded[:, 6:], mask=mask[:, 6:], state=state, return_state=True)
            got = torch.cat([first, second], 1)
    # two float32 computations of one mixer (other shapes, so other blockings and scan chunks), each within
    # FP32_REL of the exact values (projections over ≤ 32 terms, a scan of ≤ 17 steps)
    real = mask.bool()
    for b in range(2):
        scaled_close(got[b][real[b]], alone[b], 2 * FP32_REL, f"row {b}")
    for name in state:
        scaled_close(state[name], alone_state[name], 2 * FP32_REL, name)


def test_a_masked_training_forward_compiles_whole():
    """``torch.compile(fullgraph=True)`` of a masked forward and backward with holes: no graph break (the pads'
    gather indices come from cumulative sums, no host read), the eager numbers."""
    mixer = make_mixer()
    x = torch.randn(2, 9, HIDDEN)
    mask = torch.ones(2, 9)
    mask[0, [0, 1, 4]] = 0
    compiled = torch.compile(lambda x, mask: mixer(x, mask=mask)[0], fullgraph=True, backend="aot_eager")
    got = compiled(x, mask)
    expected, _ = mixer(x, mask=mask)
    scaled_close(got, expected, 2 * FP32_REL, "compiled")  # the same ops, possibly decomposed otherwise
    got.square().sum().backward()


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
