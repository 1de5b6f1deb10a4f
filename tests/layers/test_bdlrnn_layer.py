"""The block-diagonal input-dependent LRNN mixer (arXiv 2309.07412): scans, autocast runs and long runs (10k-100k
tokens) vs a float64 naive loop of Eq. 5-6, decoding, padding, the two normalisations (Eq. 6 and the authors'
code), stability (Eq. 7), a hand-set Sum(5) automaton (spec §5) and bad options."""

import copy

import pytest
import torch
import torch.nn.functional as F
from comparisons import scaled_close
from devices import bf16_autocast

from ssmhub import BDLRNNConfig
from ssmhub.layers.bdlrnn import BDLRNNMixer, BDLRNNParameters, normalize_blocks


def _mixer(dtype=torch.float32, **kwargs):
    torch.manual_seed(0)
    defaults = {"hidden_size": 8, "block_size": 4, "transition_hidden_size": 16}
    return BDLRNNMixer(**{**defaults, **kwargs}).to(dtype).eval()


def _naive_normalise(mixer: BDLRNNMixer, G: torch.Tensor) -> torch.Tensor:
    """The normalisation of raw blocks G (..., h, b, b) [row i, col j]: "code" (the authors' code) centres each
    column and divides the block by its largest column p-norm (+ eps); "paper" is arXiv 2309.07412 Eq. 6, each
    column v / max(1, ‖v‖_p)."""
    p = mixer.p_norm
    if mixer.norm_mode == "code":
        G = G - G.mean(dim=-2, keepdim=True)
        col = (G.abs() ** p).sum(dim=-2) ** (1 / p)  # (..., h, b): column p-norms
        return G / (col.max(dim=-1).values[..., None, None] + mixer.norm_eps)
    col = (G.abs() ** p).sum(dim=-2) ** (1 / p)
    return G / torch.clamp(col, min=1.0)[..., None, :]


def _naive_recurrence(mixer: BDLRNNMixer, G, v, state=None):
    """Eq. 5 one token at a time, ``x ← A x + v`` with A = normalised G, from ``state`` (B, h, b) or the
    mixer's x_0. G (B, T, h, b, b) and v (B, T, h, b) are the raw MLP outputs; returns the outputs
    (B, T, h·b) and the last state, in G's dtype."""
    batch, _, h, b, _ = G.shape
    if state is None:
        x0 = mixer.ssm.initial_state
        state = G.new_zeros(batch, h, b) if x0 is None else x0.to(G.dtype).expand(batch, h, b)
    outputs = []
    for A_t, v_t in zip(_naive_normalise(mixer, G).unbind(1), v.unbind(1)):
        state = (A_t * state.unsqueeze(-2)).sum(-1) + v_t  # x_i ← Σ_j A[i, j] x_j + v_i
        outputs.append(state)
    return torch.stack(outputs, dim=1).flatten(2), state


def _naive(mixer: BDLRNNMixer, x: torch.Tensor, state=None, return_state=False):
    """arXiv 2309.07412 Eq. 5-6 written out: G = g(z) (the MLP), normalise, v = B(z), then x ← A x + v one token
    at a time (from ``state`` (B, h, b), else x_0)."""
    batch, seq_len, _ = x.shape
    h, b = mixer.num_heads, mixer.block_size
    g1, g2 = mixer.transition[0], mixer.transition[2]
    G = F.linear(F.relu(F.linear(x, g1.weight, g1.bias)), g2.weight, g2.bias).reshape(batch, seq_len, h, b, b)
    if mixer.input_map == "mlp":
        v1, v2 = mixer.in_proj[0], mixer.in_proj[2]
        v = F.linear(F.relu(F.linear(x, v1.weight, v1.bias)), v2.weight, v2.bias)
    else:
        v = F.linear(x, mixer.in_proj.weight)
    y, state = _naive_recurrence(mixer, G, v.reshape(batch, seq_len, h, b), state)
    return (y, state) if return_state else y


def _float64_copy(mixer: BDLRNNMixer) -> BDLRNNMixer:
    """The same mixer in float64, for a reference run of a float32 one."""
    return copy.deepcopy(mixer).double()


# A float32 run against its float64 reference (scaled_close: error ≤ rel × the reference's largest entry, since
# states that decay to ~0 have no relative precision). Measured on every use below, up to 100k tokens: ≤ 3.1e-7;
# a normalisation or a scan in bf16 is off by ~1e-3.
FLOAT32_REL = 2e-6


VARIANTS = [
    {},
    {"norm_mode": "paper", "input_map": "linear", "learned_initial_state": False},
    {"norm_mode": "paper", "p_norm": 1.0},
    {"norm_eps": 1e-3, "block_size": 2},
    {"norm_mode": "paper", "block_size": 1},  # b = 1: A_k is a scalar g / max(1, |g|) per channel
]


@pytest.mark.parametrize("options", VARIANTS)
def test_parallel_and_sequential_scans_equal_the_naive_loop(options):
    """Outputs and gradients (inputs and every parameter), float64, with a non-power-of-2 length."""
    mixer = _mixer(torch.float64, **options)
    x = torch.randn(2, 37, 8, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(2, 37, 8, dtype=torch.float64)
    results = []
    for name in ("parallel", "sequential", "naive"):
        mixer.scan = "parallel" if name == "naive" else name
        y = _naive(mixer, x) if name == "naive" else mixer(x)[0]
        grads = torch.autograd.grad((y * weights).sum(), [x, *mixer.parameters()])
        results.append((y, grads))
    for y, grads in results[:2]:
        torch.testing.assert_close(y, results[2][0], atol=1e-10, rtol=1e-10)
        for g, g_ref in zip(grads, results[2][1]):
            torch.testing.assert_close(g, g_ref, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("options", VARIANTS[:2])
@pytest.mark.parametrize("scan", ["parallel", "sequential"])
def test_step_by_step_equals_forward(options, scan):
    mixer = _mixer(scan=scan, **options)
    x = torch.randn(2, 25, 8)
    y_full, final = mixer(x, return_state=True)
    state = mixer.init_state(2)
    for t in range(x.shape[1]):
        y_t, state = mixer.step(x[:, t], state)
        torch.testing.assert_close(y_t, y_full[:, t], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state["bdlrnn_state"], final["bdlrnn_state"], atol=1e-5, rtol=1e-5)


def test_prefill_then_steps_and_chunks_continue_the_state():
    mixer = _mixer()
    x = torch.randn(3, 40, 8)
    y_full, final = mixer(x, return_state=True)
    y_a, state = mixer(x[:, :17], return_state=True)
    y_b, state = mixer(x[:, 17:31], state=state, return_state=True)
    y_c, state = mixer(x[:, 31:32], state=state, return_state=True)  # one token: the step path
    steps = []
    for t in range(32, 40):
        y_t, state = mixer.step(x[:, t], state)
        steps.append(y_t)
    torch.testing.assert_close(torch.cat([y_a, y_b, y_c, torch.stack(steps, 1)], 1), y_full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state["bdlrnn_state"], final["bdlrnn_state"], atol=1e-5, rtol=1e-5)


def test_init_state_is_the_learned_x0():
    mixer = _mixer()
    state = mixer.init_state(3)["bdlrnn_state"]
    assert state.shape == (3, 2, 4) and state.dtype == torch.float32
    torch.testing.assert_close(state, mixer.ssm.initial_state.expand(3, 2, 4))
    torch.manual_seed(7)  # x_0 is drawn as randn (the authors' code's a0), not zeros or a scaled randn
    drawn = BDLRNNParameters(num_heads=2, block_size=4, learned_initial_state=True).initial_state
    torch.manual_seed(7)
    # exact: the same op (randn of the same shape) from the same seed, copied into the parameter
    torch.testing.assert_close(drawn.detach(), torch.randn(1, 2, 4), atol=0, rtol=0)
    zero = _mixer(learned_initial_state=False)
    assert zero.ssm.initial_state is None and not zero.init_state(2)["bdlrnn_state"].any()


@pytest.mark.parametrize("scan", ["parallel", "sequential"])
def test_masked_positions_leave_the_state_unchanged(scan):
    mixer = _mixer(scan=scan)
    x = torch.randn(1, 12, 8)
    padded = torch.cat([torch.randn(1, 5, 8) * 3, x], 1)  # left padding with garbage values
    mask = torch.cat([torch.zeros(1, 5), torch.ones(1, 12)], 1)
    y_alone, state_alone = mixer(x, return_state=True)
    y_pad, state_pad = mixer(padded, mask=mask, return_state=True)
    torch.testing.assert_close(y_pad[:, 5:], y_alone, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(state_pad["bdlrnn_state"], state_alone["bdlrnn_state"], atol=1e-6, rtol=1e-6)
    x0 = mixer.ssm.initial_state.detach().flatten(1)
    torch.testing.assert_close(y_pad[:, :5], x0.expand(5, -1).unsqueeze(0))  # still x_0 on the padding
    holes = torch.ones(1, 12)
    holes[0, [3, 4, 9, 11]] = 0  # masked positions inside a row and at its end
    y_holes, state_holes = mixer(x, mask=holes, return_state=True)
    for t in (3, 4, 9, 11):  # A = I, v = 0 there (the parallel scan may round differently in the last bit)
        torch.testing.assert_close(y_holes[:, t], y_holes[:, t - 1], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(state_holes["bdlrnn_state"].flatten(1), y_holes[:, 10], atol=1e-6, rtol=1e-6)
    kept = [t for t in range(12) if t not in (3, 4, 9, 11)]  # the real tokens: the naive loop on them alone
    with torch.no_grad():
        y_kept = _naive(_float64_copy(mixer), x[:, kept].double())
    scaled_close(y_holes[:, kept], y_kept, FLOAT32_REL, "outputs at the real tokens")


def _column_p_norms(A, p):
    return torch.linalg.vector_norm(A, ord=p, dim=-2)  # (..., b)


@pytest.mark.parametrize("p", [1.0, 1.2, 2.0])
def test_code_normalisation_centres_columns_and_sets_the_largest_column_norm_to_one(p):
    G = torch.randn(3, 5, 4, 8, 8, dtype=torch.float64) * 7 + 2
    A = normalize_blocks(G, p, "code")
    torch.testing.assert_close(A.sum(dim=-2), torch.zeros(3, 5, 4, 8, dtype=torch.float64), atol=1e-12, rtol=0)
    norms = _column_p_norms(A, p)
    torch.testing.assert_close(norms.amax(dim=-1), torch.ones(3, 5, 4, dtype=torch.float64), atol=1e-12, rtol=0)
    assert (norms <= 1 + 1e-12).all()
    # per token and head: scaling one block's G leaves every block's A unchanged
    G2 = G.clone()
    G2[0, 1, 2] *= 100
    torch.testing.assert_close(normalize_blocks(G2, p, "code"), A)


@pytest.mark.parametrize("p", [1.0, 1.2])
def test_paper_normalisation_projects_columns_into_the_unit_ball(p):
    G = torch.randn(4, 3, 6, 6, dtype=torch.float64)
    G = G * torch.rand(4, 3, 1, 6, dtype=torch.float64) * 2  # some columns inside the ball, some outside
    norms = _column_p_norms(G, p)
    inside = norms <= 1
    assert inside.any() and (~inside).any()
    A = normalize_blocks(G, p, "paper")
    assert (_column_p_norms(A, p) <= 1 + 1e-12).all()
    # exact: a column inside the ball is divided by max(1, ‖v‖_p) = 1.0, and v / 1 = v
    torch.testing.assert_close(A.transpose(-1, -2)[inside], G.transpose(-1, -2)[inside], atol=0, rtol=0)
    torch.testing.assert_close(_column_p_norms(A, p)[~inside], torch.ones_like(norms[~inside]))


def test_normalisation_and_scan_are_float32_under_autocast():
    """Under bf16 autocast the MLPs run in bf16, but A = normalise(G) and the recurrence must be float32: A and y
    against the float64 formula and loop applied to the MLPs' own bf16 outputs G and v."""
    mixer = _mixer()
    x = torch.randn(2, 6, 8)
    with bf16_autocast():
        A, v = mixer.transitions(x)
        y, state = mixer(x, return_state=True)
        G, v_raw = mixer.transition(x), mixer.in_proj(x)  # the bf16 MLP outputs the layer starts from
    assert A.dtype == v.dtype == state["bdlrnn_state"].dtype == torch.float32 and G.dtype == torch.bfloat16
    G, v_raw = G.double().unflatten(-1, (2, 4, 4)), v_raw.double().unflatten(-1, (2, 4))
    scaled_close(A, _naive_normalise(mixer, G), FLOAT32_REL, "A")
    y_ref, state_ref = _naive_recurrence(_float64_copy(mixer), G, v_raw)
    scaled_close(y, y_ref, FLOAT32_REL, "y")
    scaled_close(state["bdlrnn_state"], state_ref, FLOAT32_REL, "final state")


@torch.no_grad()
def test_p1_paper_mode_states_stay_within_the_eq7_bound_for_100k_tokens():
    """Eq. 7: with p = 1 every column has 1-norm ≤ 1, so ‖x_k‖_1 ≤ ‖x_0‖_1 + Σ_{j≤k} ‖v_j‖_1 per block; and the
    float32 states follow the float64 naive loop run alongside over all 100k tokens (no drift)."""
    mixer = _mixer(norm_mode="paper", p_norm=1.0, hidden_size=4, block_size=2, transition_hidden_size=8)
    reference, ref_state = _float64_copy(mixer), None
    gen = torch.Generator().manual_seed(1)
    state = mixer.init_state(1)
    bound = state["bdlrnn_state"].abs().sum(-1)  # (1, h)
    total, chunk = 100_000, 10_000
    for _ in range(total // chunk):
        x = torch.randn(1, chunk, 4, generator=gen) * 5  # large inputs: most columns land on the sphere
        _, v = mixer.transitions(x)
        y, state = mixer(x, state=state, return_state=True)
        y_ref, ref_state = _naive(reference, x.double(), state=ref_state, return_state=True)
        assert torch.isfinite(y).all()
        scaled_close(y, y_ref, FLOAT32_REL, "y")
        norms = y.unflatten(-1, (2, 2)).abs().sum(-1)  # (1, T, h)
        bounds = bound.unsqueeze(1) + v.abs().sum(-1).cumsum(1)  # (1, T, h)
        assert (norms <= bounds * (1 + 1e-5)).all()
        bound = bounds[:, -1]


@torch.no_grad()
def test_p1_paper_mode_products_never_grow_the_state():
    """v = 0: x_k = A_k⋯A_1 x_0 (the naive loop's values), and every step can only shrink ‖x‖_1 (Eq. 7)."""
    mixer = _mixer(norm_mode="paper", p_norm=1.0, input_map="linear")
    mixer.in_proj.weight.zero_()
    x = torch.randn(4, 2000, 8) * 5
    y = mixer(x)[0]
    scaled_close(y, _naive(_float64_copy(mixer), x.double()), FLOAT32_REL, "y")
    y = y.unflatten(-1, (2, 4)).abs().sum(-1)  # (B, T, h): ‖x_k‖_1 per block
    x0 = mixer.ssm.initial_state.abs().sum(-1).unsqueeze(1)  # (1, 1, h)
    norms = torch.cat([x0.expand(4, 1, 2), y], dim=1)
    assert (norms[:, 1:] <= norms[:, :-1] * (1 + 1e-6) + 1e-30).all()


@torch.no_grad()
def test_code_mode_p12_follows_the_naive_loop_and_stays_finite_for_10k_tokens():
    mixer = _mixer()  # norm_mode="code", p = 1.2 (the paper's setting): no Eq. 7 guarantee
    x = torch.randn(2, 10_000, 8) * 3
    y, state = mixer(x, return_state=True)
    y_ref, state_ref = _naive(_float64_copy(mixer), x.double(), return_state=True)
    assert torch.isfinite(y).all() and torch.isfinite(state["bdlrnn_state"]).all()
    scaled_close(y, y_ref, FLOAT32_REL, "y")
    scaled_close(state["bdlrnn_state"], state_ref, FLOAT32_REL, "final state")


def _sum5_automaton(norm_mode: str) -> BDLRNNMixer:
    """Spec §5 test 3: one-hot input s ↦ A = P^s (cyclic shift by s), v = 0, x_0 = e_0, so x_k = e_{Σ s mod 5}."""
    mixer = BDLRNNMixer(
        5, block_size=5, p_norm=1.2, norm_mode=norm_mode, transition_hidden_size=5, input_map="linear"
    ).double()
    shift = torch.roll(torch.eye(5, dtype=torch.float64), 1, dims=0)  # P e_j = e_{j+1 mod 5}
    with torch.no_grad():
        mixer.transition[0].weight.copy_(torch.eye(5))
        mixer.transition[0].bias.zero_()
        mixer.transition[2].weight.copy_(
            torch.stack([torch.linalg.matrix_power(shift, s).flatten() for s in range(5)], 1)
        )
        mixer.transition[2].bias.zero_()
        mixer.in_proj.weight.zero_()
        mixer.ssm.initial_state.copy_(torch.eye(5)[0].view(1, 1, 5))
    return mixer


@pytest.mark.parametrize("scan", ["parallel", "sequential", "step"])
def test_hand_set_permutation_blocks_compute_sum5_exactly(scan):
    mixer = _sum5_automaton("paper")
    length = 120 if scan == "step" else 500  # L_ex = 500 (Table 1); stepping is slow in a Python loop
    tokens = torch.randint(0, 5, (3, length), generator=torch.Generator().manual_seed(0))
    x = F.one_hot(tokens, 5).double()
    expected = F.one_hot(tokens.cumsum(1) % 5, 5).double()
    with torch.no_grad():
        if scan == "step":
            state, ys = mixer.init_state(3), []
            for t in range(length):
                y_t, state = mixer.step(x[:, t], state)
                ys.append(y_t)
            y = torch.stack(ys, 1)
        else:
            mixer.scan = scan
            y = mixer(x)[0]
    # exact on every path: one-hot inputs, ReLU, 0/1 weights and permutation blocks (column p-norm 1^(1/p) = 1,
    # divided by 1) make every value 0 or 1 and every sum one of a single 1 with zeros, in any order
    torch.testing.assert_close(y, expected, atol=0, rtol=0)


def test_code_normalisation_keeps_the_permutation_automaton_up_to_a_contraction():
    """Centred permutations compose (C(P₁)C(P₂) = C(P₁P₂)) but are rescaled by 1/‖col‖_1.2 each step."""
    mixer = _sum5_automaton("code")
    tokens = torch.randint(0, 5, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = mixer(F.one_hot(tokens, 5).double())[0]
    assert torch.equal(y.argmax(-1), tokens.cumsum(1) % 5)  # integers (the state's largest entry: 0.8 vs -0.2)
    column = torch.full((5,), -0.2, dtype=torch.float64)
    column[0] = 0.8
    rate = 1 / torch.linalg.vector_norm(column, ord=1.2)
    # from x_0 = e_0, x_k = rate^k (e_{Σs} − 1/5) after the first step's centring
    torch.testing.assert_close(y[:, -1].abs().sum(-1), (rate**40 * 1.6).expand(3), rtol=1e-9, atol=0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"hidden_size": 20, "block_size": 8}, "hidden_size"),
        ({"block_size": 0}, "block_size"),
        ({"block_size": 1}, "block_size"),  # centring a 1×1 block gives 0/0 in "code" mode
        ({"p_norm": 0.5}, "p_norm"),
        ({"norm_mode": "unit"}, "norm_mode"),
        ({"norm_eps": -1.0}, "norm_eps"),
        ({"transition_hidden_size": 0}, "transition_hidden_size"),
        ({"input_map": "conv"}, "input_map"),
        ({"scan": "pscan"}, "scan"),
    ],
)
def test_bad_options_raise_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"BDLRNNConfig.{field}"):
        BDLRNNConfig(**{"vocab_size": 8, "hidden_size": 16, **kwargs})
    with pytest.raises(ValueError, match="hidden_size" if field == "hidden_size" else f"BDLRNNOptions.{field}"):
        BDLRNNMixer(**{"hidden_size": 16, **kwargs})


def test_paper_sized_layer_has_the_codes_parameter_count():
    """d = 64, b = 8: 304,448 parameters per layer with its LayerNorm (spec §1.3), 86% of them in W_g2."""
    mixer = BDLRNNMixer(64, block_size=8)
    assert sum(p.numel() for p in mixer.parameters()) + 2 * 64 == 304_448
    assert mixer.transition[2].weight.numel() / 304_448 > 0.86
