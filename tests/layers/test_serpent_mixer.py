"""The SeRpEnt mixer: the resampling branch against a per-row loop, causality, streaming decode equal to
the parallel forward (also exactly at grid boundaries), left padding, and the degenerate cases (no
resampling branch = Mamba; κ = 1, K = 1 = Mamba over θ_Γ of each token)."""

from __future__ import annotations

import pytest
import torch

import ssmhub
from ssmhub.layers.mamba import MambaMixer
from ssmhub.layers.serpent import ResamplingBranch, SerpentMixer

HIDDEN = 12
MAMBA = {"intermediate_size": 8, "state_size": 4}


def make_branch(kappa=0.5, window=3, mode="causal", seed=0, constant_gate=None):
    torch.manual_seed(seed)
    branch = ResamplingBranch(HIDDEN, 6, kappa, window, 4, mode, dict(MAMBA))
    with torch.no_grad():
        branch.step_proj.weight.normal_(0, 1.0)  # steps that vary from token to token
        branch.mamba.dt_proj.bias.add_(2.0)
        if constant_gate is not None:  # σ(θ_Δ x) = constant_gate for every token
            branch.step_proj.weight.zero_()
            branch.step_proj.bias.fill_(torch.logit(torch.tensor(constant_gate)).item())
    return branch.eval()


def branch_by_loop(branch: ResamplingBranch, x: torch.Tensor) -> torch.Tensor:
    """The causal branch of one row (1, L, H), written as the spec's pseudocode with Python loops (§3)."""
    steps, grid_step = branch.steps(x[0])
    delta = float(grid_step)
    t = torch.cumsum(steps.double(), 0)
    num_grid = int(torch.floor(t[-1] / delta))
    x_bar = []
    for j in range(1, num_grid + 1):
        emission = next(i for i in range(len(t)) if t[i] >= j * delta)
        window = [k for k in range(emission - branch.window + 1, emission + 1)]
        inputs = torch.stack([x[0, k] if k >= 0 else torch.zeros(HIDDEN) for k in window])
        distance = torch.tensor([j * delta - float(t[k]) if k >= 0 else 0.0 for k in window], dtype=torch.float64)
        valid = torch.tensor([k >= 0 for k in window])
        x_bar.append(branch._compress(inputs, distance, valid))
    if not x_bar:
        return torch.zeros(1, x.shape[1], branch.branch_size)
    y_grid, _ = branch.mamba(torch.stack(x_bar)[None])  # (1, L̄, H_b): the row alone, no padding
    out = []
    for i in range(len(t)):
        j = int(torch.floor(t[i] / delta))
        out.append(y_grid[0, j - 1] if j >= 1 else torch.zeros(branch.branch_size))
    return torch.stack(out)[None]


def test_causal_branch_equals_the_per_row_loop_in_a_batch_of_unequal_grids():
    branch = make_branch(kappa=0.3)
    x = torch.randn(3, 17, HIDDEN)
    mask = torch.ones(3, 17, dtype=torch.long)
    mask[1, :5] = 0  # left padding: row 1 is the row x[1, 5:] alone
    with torch.no_grad():
        y, _ = branch(x, mask=mask)
        for row in (0, 2):
            torch.testing.assert_close(y[row : row + 1], branch_by_loop(branch, x[row : row + 1]), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(y[1:2, 5:], branch_by_loop(branch, x[1:2, 5:]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("constant_gate", [None, 0.5])  # 0.5: steps of exactly 0.75Δ, t lands on grid points
def test_streaming_equals_parallel_token_by_token(constant_gate):
    branch = make_branch(kappa=0.5, constant_gate=constant_gate)
    x = torch.randn(2, 21, HIDDEN)
    with torch.no_grad():
        whole, whole_state = branch(x, return_state=True)
        for split in (0, 1, 4, 11):  # prefill `split` tokens in parallel, then step
            if split:
                prefix, state = branch(x[:, :split], return_state=True)
                torch.testing.assert_close(prefix, whole[:, :split], rtol=1e-5, atol=1e-6)
            else:
                state = branch.init_state(2)
            outputs = []
            for t in range(split, x.shape[1]):
                y_t, state = branch(x[:, t : t + 1], state=state, return_state=True)
                outputs.append(y_t)
            torch.testing.assert_close(torch.cat(outputs, 1), whole[:, split:], rtol=1e-5, atol=1e-6)
            for name in ("clock", "grid_count", "times", "count"):
                torch.testing.assert_close(state[name], whole_state[name], rtol=0, atol=0)
            for name in ("inputs", "held", "conv_state", "ssm_state"):
                torch.testing.assert_close(state[name], whole_state[name], rtol=1e-5, atol=1e-6)


def test_exact_grid_boundaries_are_hit():
    branch = make_branch(kappa=0.5, constant_gate=0.5)
    with torch.no_grad():
        steps, grid_step = branch.steps(torch.randn(4, HIDDEN))
    assert float(grid_step) == 1.0 and torch.all(steps == 0.75)  # t = 0.75, 1.5, 2.25, 3.0 (on t̄_3), ...


def causal_model(**overrides):
    config = dict(
        vocab_size=32,
        hidden_size=12,
        num_hidden_layers=2,
        resampling_rates=[0.5, 0.2],
        resampling_window=4,
        num_distance_features=3,
        state_size=4,
    )
    torch.manual_seed(0)
    return ssmhub.SerpentForCausalLM(ssmhub.SerpentConfig(**{**config, **overrides})).eval()


def test_causal_mode_is_causal_gradient_of_output_t_wrt_later_inputs_is_zero():
    model = causal_model()
    embeds = torch.randn(2, 24, 12, requires_grad=True)
    logits = model(inputs_embeds=embeds).logits
    for t in (0, 5, 11, 17, 22):
        (grad,) = torch.autograd.grad(logits[:, t].square().sum(), embeds, retain_graph=True)
        assert torch.all(grad[:, t + 1 :] == 0), f"output {t} depends on a later input"
        assert grad[:, : t + 1].abs().sum() > 0


def test_faithful_mode_reads_later_tokens():
    torch.manual_seed(0)
    config = ssmhub.SerpentConfig(
        vocab_size=32,
        hidden_size=12,
        num_hidden_layers=1,
        resampling_rates=[0.2],
        resampling_window=6,
        resampling_mode="faithful",
        state_size=4,
    )
    model = ssmhub.SerpentModel(config).eval()
    embeds = torch.randn(1, 24, 12, requires_grad=True)
    hidden = model(inputs_embeds=embeds).last_hidden_state
    (grad,) = torch.autograd.grad(hidden[:, 10].square().sum(), embeds)
    assert grad[:, 11:].abs().sum() > 0  # the paper's symmetric windows and rounding look ahead (spec §3)


def test_gradients_reach_the_step_map_and_the_grid_step():
    branch = make_branch()
    branch.train()
    y, _ = branch(torch.randn(2, 15, HIDDEN))
    y.square().sum().backward()
    assert branch.step_proj.weight.grad.abs().sum() > 0
    assert branch.ssm.log_grid_step.grad.abs() > 0
    assert branch.ssm.distance_centers.grad.abs().sum() > 0


def test_kappa_one_and_window_one_is_mamba_over_each_token():
    branch = make_branch(kappa=1.0, window=1)
    x = torch.randn(2, 9, HIDDEN)
    with torch.no_grad():
        y, _ = branch(x)
        features = torch.exp(-(branch.ssm.distance_centers**2)).expand(2, 9, -1)  # ε(0): every t_l is on t̄_l
        expected, _ = branch.mamba(branch.compress(torch.cat([x, features], -1)))
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6)


def test_no_resampling_branch_is_a_mamba_mixer():
    torch.manual_seed(0)
    mixer = SerpentMixer(HIDDEN, resampling_rates=(), state_size=4)
    mamba = MambaMixer(HIDDEN, 2 * HIDDEN, state_size=4)
    mamba.load_state_dict(mixer.base.state_dict())
    x = torch.randn(2, 10, HIDDEN)
    with torch.no_grad():
        torch.testing.assert_close(mixer(x)[0], mamba(x)[0])


def test_left_padded_batch_decodes_like_single_rows():
    model = causal_model()
    ids = torch.randint(1, 32, (1, 9))
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), ids], 1)
    mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 9, dtype=torch.long)], 1)
    with torch.no_grad():
        alone = model.generate(ids, max_new_tokens=8, do_sample=False)
        batched = model.generate(padded, attention_mask=mask, max_new_tokens=8, do_sample=False)
    torch.testing.assert_close(batched[:, 4:], alone)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"resampling_rates": [0.0]}, "resampling_rates"),
        ({"resampling_rates": [1.5]}, "resampling_rates"),
        ({"resampling_window": 0}, "resampling_window"),
        ({"hidden_size": 13}, "hidden_size"),
        ({"resampling_mode": "symmetric"}, "resampling_mode"),
    ],
)
def test_bad_config_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        ssmhub.SerpentConfig(**{"hidden_size": 12, "resampling_rates": [0.5, 0.2], **overrides})


def test_faithful_mode_is_refused_in_a_causal_lm():
    config = ssmhub.SerpentConfig(hidden_size=12, resampling_rates=[0.5], resampling_mode="faithful")
    with pytest.raises(ValueError, match="resampling_mode='causal'"):
        ssmhub.SerpentForCausalLM(config)


def test_a_multi_token_forward_continues_a_cached_state():
    branch = make_branch(kappa=0.3)
    x = torch.randn(2, 19, HIDDEN)
    with torch.no_grad():
        whole, whole_state = branch(x, return_state=True)
        first, state = branch(x[:, :6], return_state=True)
        second, state = branch(x[:, 6:], state=state, return_state=True)  # 13 tokens at once
    torch.testing.assert_close(torch.cat([first, second], 1), whole, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state["grid_count"], whole_state["grid_count"], rtol=0, atol=0)
    torch.testing.assert_close(state["ssm_state"], whole_state["ssm_state"], rtol=1e-5, atol=1e-6)
