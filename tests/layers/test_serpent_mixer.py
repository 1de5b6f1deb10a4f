"""The SeRpEnt mixer: each resampling branch (causal and faithful) and the whole mixer against per-row Python
loops in float64 (outputs and gradients, with padding), causality, streaming decode equal to the parallel
forward (also exactly at grid boundaries), left padding, and the degenerate cases (no resampling branch =
Mamba; κ = 1, K = 1 = Mamba over θ_Γ of each token)."""

from __future__ import annotations

import math

import pytest
import torch
from comparisons import EPS32, FP32_REL, scaled_close
from torch.nn import functional as F

import ssmhub
from ssmhub.layers import serpent as serpent_layer
from ssmhub.layers import serpent_step
from ssmhub.layers.mamba import MambaMixer
from ssmhub.layers.serpent import ResamplingBranch, SerpentMixer
from ssmhub.layers.serpent_step import stack_branches
from ssmhub.ops import selective_scan_ref

HIDDEN = 12
MAMBA = {"state_size": 4}


def vary_steps(branch: ResamplingBranch, constant_gate=None) -> ResamplingBranch:
    """Steps that vary from token to token (θ_Δ ~ N(0, 1)) and a faster branch Mamba, so that the windows,
    the grid and the scan all matter; with ``constant_gate``, σ(θ_Δ x) = constant_gate for every token."""
    with torch.no_grad():
        branch.step_proj.weight.normal_(0, 1.0)
        branch.mamba.dt_proj.bias.add_(2.0)
        if branch.additive:  # a trained-looking output projection (it starts at zero)
            branch.output_proj.weight.normal_(0, 0.5)
            branch.compress.slot_weight.normal_(0, 0.5)
        if constant_gate is not None:
            branch.step_proj.weight.zero_()
            branch.step_proj.bias.fill_(torch.logit(torch.tensor(constant_gate)).item())
    return branch


def make_branch(kappa=0.5, window=3, mode="causal", seed=0, constant_gate=None, layout="additive"):
    torch.manual_seed(seed)
    options = {"resampling_window": window, "num_distance_features": 4, "resampling_mode": mode, **MAMBA}
    branch = ResamplingBranch(HIDDEN, 6, kappa, branch_layout=layout, **options)
    return vary_steps(branch, constant_gate).eval()


# ----------------------------------------------------------------------------------------------------------
# float64 loop references of one row (its real tokens only)


def _linear64(layer: torch.nn.Linear, v: torch.Tensor) -> torch.Tensor:
    """θ v + b in float64, differentiable in the layer's (float32) parameters."""
    out = v @ layer.weight.double().T
    return out if layer.bias is None else out + layer.bias.double()


def window_map64(window_map, slots: torch.Tensor, width: int) -> torch.Tensor:
    """θ_Γ of Eq. 12 on one window's slots (K, W + G) = [u_k, ε_k] per slot, float64: dense over the flattened
    window (the concatenated layout, the paper's reading), or Σ_k w_k ⊙ u_k + W_ε ⊕_k ε_k + b (the additive
    layout's depthwise map)."""
    if hasattr(window_map, "slot_weight"):
        inputs = (slots[:, :width] * window_map.slot_weight.double()).sum(0)
        return inputs + window_map.feature_weight.double() @ slots[:, width:].flatten() + window_map.bias.double()
    return window_map.weight.double() @ slots.flatten() + window_map.bias.double()


def mamba_by_loop(mamba: MambaMixer, u: torch.Tensor) -> torch.Tensor:
    """The Mamba mixer (arXiv 2312.00752 §3.4) on one unpadded row u (T, H_in), float64: in_proj, the causal
    depthwise convolution as a loop over tokens and taps (tap k − 1 meets the newest input), SiLU, the
    selective inputs, the loop scan ``selective_scan_ref`` with the D skip and the SiLU(z) gate, out_proj."""
    inner, gate = _linear64(mamba.in_proj, u.double()).chunk(2, dim=-1)  # (T, E) each
    taps = mamba.conv1d.weight.double()[:, 0]  # (E, k)
    width = taps.shape[1]
    conv = []
    for pos in range(u.shape[0]):
        acc = mamba.conv1d.bias.double() if mamba.conv1d.bias is not None else torch.zeros_like(inner[0])
        for tap in range(width):
            source = pos - (width - 1) + tap
            if source >= 0:
                acc = acc + taps[:, tap] * inner[source]
        conv.append(acc)
    inner = F.silu(torch.stack(conv))
    rank, n = mamba.time_step_rank, mamba.state_size
    low_rank, B, C = (inner @ mamba.x_proj.weight.double().T).split([rank, n, n], dim=-1)
    delta = F.softplus(_linear64(mamba.dt_proj, low_rank))
    A = -torch.exp(mamba.ssm.A_log.double())
    y, _ = selective_scan_ref(inner[None], delta[None], A, B[None], C[None], D=mamba.ssm.D.double(), z=gate[None])
    return _linear64(mamba.out_proj, y[0])


def branch_by_loop(branch: ResamplingBranch, x: torch.Tensor) -> torch.Tensor:
    """One resampling branch on one row x (n, H) of real tokens (pads removed), float64, written as plain loops
    over tokens and grid points after arXiv 2501.11729 §4:

    - Eq. 13 and 9: ``Δ_l = σ(θ_Δ x_l)·Δ·(1−κ) + κΔ`` and ``t_l = Σ_{i≤l} Δ_i``; Eq. 11: ``t̄_j = jΔ``,
      j = 1..L̄ with ``L̄ = ⌊t_{n−1}/Δ⌋``;
    - the window of t̄_j. Faithful (Eq. 12): the K tokens nearest in time, ties to the earlier token. Causal
      (the layer's streaming variant): the last K tokens up to the first one with ``t_l ≥ t̄_j``;
    - Eq. 12: ``x̄_j = θ_Γ(⊕_k [x_k, ε(t̄_j − t_k)])``, ``ε(d)_i = exp(−(d − μ_i)²)``, slots in ascending token
      order, the missing ones of a row of fewer than K tokens first and zero;
    - Eq. 15a: the branch's Mamba over x̄ (:func:`mamba_by_loop`);
    - Eq. 14b: ``y_l = ȳ_k``. Faithful: k the nearest grid point, ties to the earlier one. Causal: k = ⌊t_l/Δ⌋,
      ``y_l = 0`` before the first grid point.

    The discrete choices are made on Python floats; Δ, the times and the distances stay tensors, so autograd
    carries the gradients of θ_Δ, Δ and μ through the distances only, as in the layer. Additive layout: the windows
    hold ``window_proj x`` and the output is ``output_proj y``.
    """
    faithful = branch.mode == "faithful"
    kappa, window = branch.resampling_rate, branch.window
    grid_step = branch.ssm.log_grid_step.double().exp()
    theta_delta, bias_delta = branch.step_proj.weight.double()[0], branch.step_proj.bias.double()[0]
    centers = branch.ssm.distance_centers.double()
    x = x.double()
    u = _linear64(branch.window_proj, x) if branch.additive else x  # (n, W): what the windows hold
    times, clock = [], 0.0
    for token in x:
        gate = torch.sigmoid(token @ theta_delta + bias_delta)
        clock = clock + gate * grid_step * (1 - kappa) + kappa * grid_step
        times.append(clock)
    t, delta = [time.item() for time in times], grid_step.item()
    num_grid = math.floor(t[-1] / delta)
    x_bar = []
    for j in range(1, num_grid + 1):
        if faithful:
            members = sorted(sorted(range(len(t)), key=lambda k, j=j: (abs(j * delta - t[k]), k))[:window])
        else:
            emission = next(pos for pos in range(len(t)) if t[pos] >= j * delta)
            members = list(range(max(0, emission - window + 1), emission + 1))
        slots = [torch.zeros(u.shape[1] + len(centers), dtype=torch.float64)] * (window - len(members))
        for k in members:
            features = torch.exp(-((j * grid_step - times[k] - centers) ** 2))  # (G,)
            slots.append(torch.cat([u[k], features]))
        x_bar.append(window_map64(branch.compress, torch.stack(slots), u.shape[1]))
    zero = torch.zeros(branch.branch_size, dtype=torch.float64)
    y_grid = mamba_by_loop(branch.mamba, torch.stack(x_bar)) if x_bar else None
    out = []
    for time in t:
        if faithful:
            k = min(range(1, num_grid + 1), key=lambda g, time=time: (abs(time - g * delta), g), default=0)
        else:
            k = math.floor(time / delta)
        out.append(y_grid[k - 1] if k >= 1 else zero)
    return _linear64(branch.output_proj, torch.stack(out)) if branch.additive else torch.stack(out)


def assert_relative_close(got: torch.Tensor, expected: torch.Tensor, rel: float, name: str = "") -> None:
    """max |got − expected| ≤ rel · max |expected|: the error relative to the signal under test (float32 layer
    vs float64 loop), and a non-zero reference, so a gradient that fails to arrive cannot pass."""
    scale = expected.detach().abs().max().item()
    error = (got.detach().double() - expected.detach().double()).abs().max().item()
    assert scale > 0, f"{name}: the reference is zero"
    assert error <= rel * scale, f"{name}: max error {error:.3g} > {rel:g} × max |reference| {scale:.3g}"


def assert_matches_loop(module, reference, x: torch.Tensor, mask: torch.Tensor, rel_out: float, rel_grad: float):
    """``module(x, mask)`` against ``reference`` (a row of real tokens (n, H) -> (n, ·)) on each row's real
    tokens alone: the outputs at the real positions, and the gradients of a random weighting of them with
    respect to x (zero at pads) and every parameter of the module."""
    x = x.detach().requires_grad_()
    params = dict(module.named_parameters())
    y, _ = module(x, mask=mask.long())
    y = y[mask]  # (real tokens, ·), rows one after the other
    expected = torch.cat([reference(x[b, mask[b]]) for b in range(x.shape[0])])
    assert_relative_close(y, expected, rel_out, "output")
    weights = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    got = torch.autograd.grad((y * weights).sum(), [x, *params.values()])
    want = torch.autograd.grad((expected * weights.double()).sum(), [x, *params.values()])
    for name, g, w in zip(["x", *params], got, want):
        assert_relative_close(g, w, rel_grad, f"grad {name}")


def padding_mask(length: int) -> torch.Tensor:
    """(6, length) bool: a full row, a left-padded and a right-padded row, one with pads inside, and rows of
    3 and 1 real tokens (fewer than K = 4: windows with empty slots; a single token: usually no grid point)."""
    mask = torch.ones(6, length, dtype=torch.bool)
    mask[1, :5] = False
    mask[2, -4:] = False
    mask[3, 6:9] = False
    mask[4, :-3] = False
    mask[5, :-1] = False
    return mask


# ----------------------------------------------------------------------------------------------------------
# the branch and the mixer against the loops


@pytest.mark.parametrize("layout", ["additive", "concatenated"])
@pytest.mark.parametrize("mode", ["causal", "faithful"])
@pytest.mark.parametrize(
    ("kappa", "constant_gate"),
    [(0.3, None), (0.5, 0.5)],  # κ = σ = 0.5: every step is 0.75Δ, exact ties in the windows and the expansion
    ids=["varied_steps", "exact_ties"],
)
def test_branch_matches_the_loop_outputs_and_gradients_with_padding(mode, kappa, constant_gate, layout):
    """Every row of a padded batch (unequal grids; pads anywhere advance no clock and enter no window) equals
    the float64 loop on its real tokens alone: outputs, and gradients in x, θ_Δ, Δ, μ, θ_Γ, the Mamba and (additive)
    the input and output projections."""
    branch = make_branch(kappa=kappa, window=4, mode=mode, constant_gate=constant_gate, layout=layout)
    if constant_gate is None:
        with torch.no_grad():
            branch.ssm.log_grid_step.fill_(0.3)  # Δ ≠ 1
    x = torch.randn(6, 17, HIDDEN, generator=torch.Generator().manual_seed(0))
    assert_matches_loop(branch, lambda row: branch_by_loop(branch, row), x, padding_mask(17), 1e-5, 1e-4)


@pytest.mark.parametrize("layout", ["additive", "concatenated"])
@pytest.mark.parametrize("static", [False, True], ids=["grid_of_max_Lbar", "grid_of_L"])
@pytest.mark.parametrize("mode", ["causal", "faithful"])
def test_mixer_matches_the_loop_outputs_and_gradients_with_padding(mode, static, layout, monkeypatch):
    """Eq. 15: the base Mamba and two resampling branches (κ = 0.5, 0.25) added or concatenated, against the loops;
    with the grid of max L̄ slots (the CPU's) and of L slots (an accelerator's or a compiled forward's, no host
    read)."""
    monkeypatch.setattr(serpent_layer, "static_grid", lambda x: static)
    torch.manual_seed(0)
    mixer = SerpentMixer(
        HIDDEN,
        resampling_rates=[0.5, 0.25],
        resampling_window=4,
        num_distance_features=4,
        resampling_mode=mode,
        state_size=4,
        branch_layout=layout,
        resampling_branch_size=3,
    )
    for branch in mixer.resampled:
        vary_steps(branch)

    def reference(row):
        outputs = [mamba_by_loop(mixer.base, row), *(branch_by_loop(b, row) for b in mixer.resampled)]
        return sum(outputs) if layout == "additive" else torch.cat(outputs, -1)

    x = torch.randn(6, 15, HIDDEN, generator=torch.Generator().manual_seed(2))
    mask = padding_mask(15)
    mask[3] = True  # the base Mamba gives the numbers of the row alone for left or right padding only
    assert_matches_loop(mixer.eval(), reference, x, mask, 1e-5, 1e-4)


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
            assert_same_stream(state, whole_state)
            for name in ("inputs", "held", "conv_state", "ssm_state"):
                torch.testing.assert_close(state[name], whole_state[name], rtol=1e-5, atol=1e-6)


def assert_same_stream(state, whole_state, prefix=""):
    """The resampling stream of a streamed (or chunked) run against one forward over the whole stream. The grid
    and token counters are integers: exactly (comparisons.py). The clock and the window times are float64 sums of
    lattice-rounded float32 Δ_l, exact sums; but each run computes its Δ_l in calls of another size, which agree to
    an ulp of Δ (and in all bits but for a rounding midpoint, see test_streamed_steps_match_the_parallel_steps), so
    L tokens may move a clock of ≥ LκΔ by ≤ L·EPS32·Δ: ≤ EPS32/κ ≤ 10·EPS32 of it for κ ≥ 0.1, inside FP32_REL."""
    for name in ("grid_count", "count"):
        assert torch.equal(state[prefix + name], whole_state[prefix + name]), name  # integers
    for name in ("clock", "times"):
        scaled_close(state[prefix + name], whole_state[prefix + name], FP32_REL, prefix + name)


def test_exact_grid_boundaries_are_hit():
    branch = make_branch(kappa=0.5, constant_gate=0.5)
    with torch.no_grad():
        steps, grid_step = branch.steps(torch.randn(4, HIDDEN))
    # exact by arithmetic: θ_Δ = 0 and logit(0.5) = log(1) = 0 give σ(0) = 0.5, Δ = exp(0) = 1, and
    # 0.5·1·0.5 + 0.5·1 = 0.75 are dyadic: t = 0.75, 1.5, 2.25, 3.0 (on t̄_3), ...
    assert float(grid_step) == 1.0 and torch.all(steps == 0.75)


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
        # exactly 0, not round-off: a later input meets only zero upstream gradients (products with 0, sums of
        # zeros: the scans run backward in time and the windows gather; no FFT mixes positions)
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
    with torch.no_grad():  # the additive branch's output projection starts at zero
        model.layers[0].mixer.resampled[0].output_proj.weight.normal_()
    embeds = torch.randn(1, 24, 12, requires_grad=True)
    hidden = model(inputs_embeds=embeds).last_hidden_state
    (grad,) = torch.autograd.grad(hidden[:, 10].square().sum(), embeds)
    assert grad[:, 11:].abs().sum() > 0  # the paper's symmetric windows and rounding look ahead (spec §3)


@pytest.mark.parametrize("layout", ["additive", "concatenated"])
def test_kappa_one_and_window_one_is_mamba_over_each_token(layout):
    branch = make_branch(kappa=1.0, window=1, layout=layout)
    x = torch.randn(2, 9, HIDDEN)
    with torch.no_grad():
        y, _ = branch(x)
        features = torch.exp(-(branch.ssm.distance_centers**2)).expand(2, 9, 1, -1)  # ε(0): every t_l is on t̄_l
        x_bar = branch.compress(branch.window_inputs(x)[..., None, :], features)  # windows of one slot
        expected = branch.project_output(branch.mamba(x_bar)[0])
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6)


def test_no_resampling_branch_is_a_mamba_mixer():
    torch.manual_seed(0)
    mixer = SerpentMixer(HIDDEN, resampling_rates=(), state_size=4)
    mamba = MambaMixer(HIDDEN, state_size=4)
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
        ({"hidden_size": 2, "branch_layout": "concatenated"}, "hidden_size"),  # fewer channels than the 3 branches
        ({"branch_layout": "stacked"}, "branch_layout"),
        ({"resampling_branch_size": 0}, "resampling_branch_size"),
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
    assert torch.equal(state["grid_count"], whole_state["grid_count"])  # integers: exactly (comparisons.py)
    torch.testing.assert_close(state["ssm_state"], whole_state["ssm_state"], rtol=1e-5, atol=1e-6)


def assert_steps_match(streamed: torch.Tensor, parallel: torch.Tensor, what: str = "Δ_l") -> None:
    """Δ_l of the same tokens from calls of different sizes: not promised the same bits (the float64 sum along H
    and the float64 sigmoid may round differently by shape, instruction set or device). Each rounds one float64
    gate σ ∈ (0, 1) to float32 once, so they agree to an ulp of the gate (≤ EPS32/2), which ``·Δ(1−κ) + κΔ``
    and its two roundings turn into ≤ 2·EPS32·Δ: 4·EPS32 of max Δ_l ≥ Δ/2 (κ = 0.5, or among 1,200 tokens some
    gate near 1). And they differ at all only where the two float64 gates straddle a float32 rounding midpoint:
    a float64 error of ~1e-14 against float32 steps of ~6e-8, odds ~1e-6 per token, so at most one of these
    1,200 (a count, not a bit promise); a float32 gate differed at 12 of them (torch's vectorized and scalar
    float32 sigmoid differ in the last bit), and one differing Δ_l can move a clock across a grid point."""
    scaled_close(streamed, parallel, 4 * EPS32, what)
    differing = int((streamed != parallel).sum())
    assert differing <= 1, f"{what}: {differing} of {parallel.numel()} tokens got another float32 Δ_l"


@pytest.mark.parametrize("width", [12, 96])
def test_streamed_steps_match_the_parallel_steps(width):
    """Eq. 13's Δ_l of a token is the same float32 whether the call holds one token (streaming) or many (a
    forward), but for a float32 rounding midpoint (see assert_steps_match)."""
    torch.manual_seed(0)
    branch = ResamplingBranch(width, width // 2, 0.5, state_size=4)
    with torch.no_grad():
        branch.step_proj.weight.normal_()
        x = torch.randn(4, 300, width)
        parallel, _ = branch.steps(x)
        streamed = torch.stack([branch.steps(x[:, t])[0] for t in range(x.shape[1])], 1)
    assert_steps_match(streamed, parallel)


@pytest.mark.parametrize("static", [False, True], ids=["grid_of_max_Lbar", "grid_of_L"])
@pytest.mark.parametrize("chunks", [(6, 13), (1, 2, 5, 11), (9, 1, 9)], ids=lambda c: "+".join(map(str, c)))
def test_chunks_continued_in_parallel_equal_the_whole_forward_with_gradients(chunks, static, monkeypatch):
    """A stream cut into chunks, each a parallel forward continuing the last one's state (stateful training and
    evaluation, replayed rollbacks): outputs, gradients (through the carried states too) and the final state equal
    one forward over the whole stream; the discrete fields exactly. Rows get different numbers of new grid points
    per chunk (varied steps), and a left-padded row has pads in its first chunk. Grids of max L̄ slots (the CPU's)
    and of L slots (an accelerator's: no host read)."""
    monkeypatch.setattr(serpent_layer, "static_grid", lambda x: static)
    branch = make_branch(kappa=0.3)
    vary_steps(branch)
    x = torch.randn(3, sum(chunks), HIDDEN, generator=torch.Generator().manual_seed(5))
    mask = torch.ones(3, sum(chunks), dtype=torch.bool)
    mask[1, :4] = False  # left padding
    weights = torch.randn(3, sum(chunks), branch.output_size, generator=torch.Generator().manual_seed(6))

    def loss_and_state(pieces):
        state, outputs, start = None, [], 0
        for size in pieces:
            y, state = branch(x[:, start : start + size], mask[:, start : start + size], state=state, return_state=True)
            outputs.append(y)
            start += size
        y = torch.cat(outputs, 1)
        return (y * weights).sum(), y, state

    params = list(branch.parameters())
    whole_loss, whole, whole_state = loss_and_state([sum(chunks)])
    whole_grads = torch.autograd.grad(whole_loss, params)
    loss, y, state = loss_and_state(chunks)
    grads = torch.autograd.grad(loss, params)
    torch.testing.assert_close(y, whole, rtol=1e-5, atol=1e-6)
    for mine, theirs in zip(grads, whole_grads):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)
    assert_same_stream(state, whole_state)
    for name in ("inputs", "held", "conv_state", "ssm_state"):
        torch.testing.assert_close(state[name], whole_state[name], rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------
# the decode step of all resampling branches at once (ssmhub.layers.serpent_step)


def make_mixer(rates=(0.5, 0.1, 0.9), seed=0) -> SerpentMixer:
    torch.manual_seed(seed)
    mixer = SerpentMixer(
        HIDDEN * 4 // 3 * 3 if len(rates) == 3 else HIDDEN, resampling_rates=list(rates), resampling_window=3,
        num_distance_features=4, **MAMBA,
    )  # fmt: skip
    for branch in mixer.resampled:
        vary_steps(branch)
    return mixer.eval()


def test_mixer_streamed_token_by_token_equals_its_parallel_forward_with_padding():
    """Three resampling branches (κ 0.5, 0.1, 0.9) stepped together against the parallel forward: outputs, and
    the grid and token counts of every branch exactly, their clocks and window times to float32 round-off of
    Δ_l (assert_same_stream); padded rows as in padding_mask."""
    mixer = make_mixer()
    mask = padding_mask(17)
    x = torch.randn(6, 17, mixer.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        whole, whole_state = mixer(x, mask.long(), return_state=True)
        for split in (0, 5):
            state = mixer(x[:, :split], mask[:, :split].long(), return_state=True)[1] if split else mixer.init_state(6)
            outputs = []
            for t in range(split, 17):
                y_t, state = mixer(x[:, t : t + 1], mask[:, t : t + 1].long(), state=state, return_state=True)
                outputs.append(y_t)
            streamed = torch.cat(outputs, 1)
            real = mask[:, split:]
            torch.testing.assert_close(streamed[real], whole[:, split:][real], rtol=1e-5, atol=1e-6)
            assert_same_stream(state, whole_state, prefix="resampled.")
            for name, value in state.items():
                torch.testing.assert_close(value, whole_state[name], rtol=1e-5, atol=1e-6, msg=name)


def test_stacked_steps_match_each_branch_steps():
    """Eq. 13 for all branches at once gives each branch's Δ_l of the parallel pass (assert_steps_match)."""
    mixer = make_mixer()
    with torch.no_grad():
        for branch in mixer.resampled:
            branch.step_proj.weight.normal_()
        x = torch.randn(4, 300, mixer.hidden_size)
        stacked = stack_branches(mixer.resampled)
        streamed = torch.stack([serpent_step._steps(stacked, x[:, t]) for t in range(300)], 1)  # (B, L, R)
        for r, branch in enumerate(mixer.resampled):
            assert_steps_match(streamed[..., r], branch.steps(x)[0], f"branch {r} Δ_l")


def test_kept_stacked_weights_follow_an_in_place_weight_change():
    """The stacked weights kept between steps are made again after an optimizer-like in-place update."""
    mixer = make_mixer()
    x = torch.randn(2, 6, mixer.hidden_size)
    with torch.no_grad():
        _, state = mixer(x[:, :5], return_state=True)
        mixer(x[:, 5:], state=state)  # a step: the stacked weights are kept
        for branch in mixer.resampled:
            branch.compress.slot_weight.mul_(1.5)
            branch.mamba.out_proj.weight.add_(0.1)
        _, state = mixer(x[:, :5], return_state=True)
        stepped, _ = mixer(x[:, 5:], state=state)
        whole, _ = mixer(x)
    torch.testing.assert_close(stepped[:, 0], whole[:, 5], rtol=1e-5, atol=1e-6)


def test_kept_stacked_weights_follow_a_replaced_parameter_and_submodule():
    """A weight set anew (a new Parameter, or a new submodule holding it) makes the stack again too."""
    mixer = make_mixer()
    x = torch.randn(2, 6, mixer.hidden_size)
    with torch.no_grad():
        _, state = mixer(x[:, :5], return_state=True)
        mixer(x[:, 5:], state=state)  # a step: the stacked weights are kept
        branch = mixer.resampled[0]
        branch.compress.slot_weight = torch.nn.Parameter(branch.compress.slot_weight * 1.5)
        out_proj = torch.nn.Linear(branch.mamba.out_proj.in_features, branch.mamba.out_proj.out_features)
        out_proj.weight.copy_(branch.mamba.out_proj.weight + 0.1)
        out_proj.bias = branch.mamba.out_proj.bias
        branch.mamba.out_proj = out_proj
        _, state = mixer(x[:, :5], return_state=True)
        stepped, _ = mixer(x[:, 5:], state=state)
        whole, _ = mixer(x)
    torch.testing.assert_close(stepped[:, 0], whole[:, 5], rtol=1e-5, atol=1e-6)
