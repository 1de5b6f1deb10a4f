"""SeRpEnt resampling against per-row Python loops: times, grid, windows, features, expansion, streaming."""

import math

import pytest
import torch
from comparisons import EPS32

from ssmhub.ops import (
    causal_windows,
    expand_floor,
    expand_nearest,
    gather_windows,
    gaussian_distance_features,
    grid_index,
    grid_sizes,
    nearest_windows,
    resampling_init_state,
    resampling_lattice,
    resampling_prefill,
    resampling_step,
    resampling_times,
)
from ssmhub.ops.resampling import FEATURE_FLOOR_SQUARE, _lattice, select_rows

# Most comparisons in this file are exact, and promised: times are float64 sums of multiples of a power of two q
# (below 2^53·q, exact in any order, see ssmhub.ops.resampling), distances jΔ − t_k are differences of such values
# (exact), windows and counts are integers and booleans, window inputs and expansions are copies (gathers), and
# empty slots are zeros. A streamed and a parallel pass given the same steps therefore agree bit for bit. Floating
# results of rounded arithmetic (features, gradients) are compared within tolerances.

# ----------------------------------------------------------------------------------------------------------
# inputs


def _eq13_steps(batch, length, kappa, delta, seed):
    """Eq. 13 steps σ(·)·Δ·(1−κ) + κΔ in float32 (Δ float32), as the layer computes them."""
    gen = torch.Generator().manual_seed(seed)
    sig = torch.sigmoid(3 * torch.randn(batch, length, generator=gen))
    delta = torch.tensor(delta, dtype=torch.float32)
    return sig * delta * (1 - kappa) + kappa * delta


def _left_pad_mask(batch, length, seed, min_real=1):
    gen = torch.Generator().manual_seed(seed)
    pads = torch.randint(0, length - min_real + 1, (batch,), generator=gen)
    pads[0] = 0  # one full row
    return torch.arange(length)[None, :] >= pads[:, None]


def _random_mask(batch, length, seed):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(batch, length, generator=gen) < 0.7
    mask[:, -1] = True
    return mask


def _cases():
    """(name, steps (B, L), grid_step, mask) covering boundaries, κ = 1, padding and random steps."""
    boundary = torch.tensor(
        [
            [0.5, 0.25, 0.75, 0.5, 1.0, 0.25, 0.25, 0.5, 0.5, 0.5, 0.75, 0.25],
            [0.25, 0.25, 0.25, 0.25, 0.5, 0.5, 1.0, 1.0, 0.125, 0.375, 0.5, 0.5],
            [1.0] * 12,
        ]
    )
    yield "boundary", boundary, 1.0, None
    yield "boundary_half_delta", boundary / 2, 0.5, None
    yield "kappa1", torch.full((3, 10), 0.7), torch.tensor(0.7), None  # step == Δ (non-dyadic)
    yield "kappa1_padded", torch.full((3, 10), 1.0), 1.0, _left_pad_mask(3, 10, seed=3)
    for seed in range(3):
        kappa = [0.5, 0.2, 0.1][seed]
        yield (
            f"eq13_k{kappa}",
            _eq13_steps(4, 37, kappa, 1.0, seed),
            1.0,
            _left_pad_mask(4, 37, seed) if seed != 1 else None,
        )
    # float64 steps and a non-dyadic float32 Δ: exercises the lattice rounding
    gen = torch.Generator().manual_seed(11)
    delta = torch.tensor(math.exp(0.3), dtype=torch.float32)
    steps = (0.1 + 0.9 * torch.rand(3, 29, generator=gen, dtype=torch.float64)) * float(delta)
    yield "float64_steps", steps, delta, _left_pad_mask(3, 29, seed=5)
    yield "random_mask", _eq13_steps(3, 25, 0.3, 2.0, 7), 2.0, _random_mask(3, 25, seed=8)
    # a step rounding just above Δ (σ = 1 in float32) must be clamped, not cross two grid points
    yield "above_delta", torch.tensor([[0.5, 1.0 + 2**-20, 1.0, 0.5, 1.0 + 2**-20]]), 1.0, None


CASES = list(_cases())
CASE_IDS = [c[0] for c in CASES]


def _inputs(steps, hidden=3, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*steps.shape, hidden, generator=gen, dtype=dtype)


# ----------------------------------------------------------------------------------------------------------
# independent per-row references (plain Python floats, brute force)


def _snapped_delta(delta):
    _, e = math.frexp(float(delta))
    q = 2.0 ** (e - 29)
    return q, round(float(delta) / q) * q


def _times_ref(steps, delta, mask):
    """Sequential sum of the lattice-rounded, clamped steps; pads add nothing."""
    q, d = _snapped_delta(delta)
    out = []
    for b in range(steps.shape[0]):
        acc, row = 0.0, []
        for pos in range(steps.shape[1]):
            if mask is None or mask[b, pos]:
                acc += min(max(round(float(steps[b, pos]) / q) * q, 0.0), d)
            row.append(acc)
        out.append(row)
    return out


def _count_ref(time, delta):
    """#{j ≥ 1 : jΔ ≤ time} by walking the grid."""
    _, d = _snapped_delta(delta)
    j = 0
    while (j + 1) * d <= time:
        j += 1
    return j


def _real(mask, b, length):
    return [pos for pos in range(length) if mask is None or bool(mask[b, pos])]


def _causal_ref(times, delta, mask, window):
    """Per row, per grid point: first token with t ≥ jΔ, then the last K real tokens up to it (front-padded)."""
    _, d = _snapped_delta(delta)
    rows = []
    for b, row in enumerate(times):
        sizes = _count_ref(row[-1], delta)
        real = _real(mask, b, len(row))
        wins = []
        for j in range(1, sizes + 1):
            e = next(pos for pos in range(len(row)) if row[pos] >= j * d)
            assert e in real
            upto = [k for k in real if k <= e][-window:]
            wins.append(([None] * (window - len(upto)) + upto, [j * d - row[k] for k in upto]))
        rows.append(wins)
    return rows


def _nearest_ref(times, delta, mask, window):
    """Per row, per grid point: sort real tokens by (|jΔ − t_k|, k), keep K, ascending (front-padded)."""
    _, d = _snapped_delta(delta)
    rows = []
    for b, row in enumerate(times):
        sizes = _count_ref(row[-1], delta)
        real = _real(mask, b, len(row))
        wins = []
        for j in range(1, sizes + 1):
            best = sorted(sorted(real, key=lambda k, j=j: (abs(j * d - row[k]), k))[:window])
            wins.append(([None] * (window - len(best)) + best, [j * d - row[k] for k in best]))
        rows.append(wins)
    return rows


def _assert_windows_match(w, ref, num_grid, window):
    batch = len(ref)
    assert w.index.shape == w.valid.shape == w.distance.shape == (batch, num_grid, window)
    assert w.index.dtype == torch.long and w.valid.dtype == torch.bool and w.distance.dtype == torch.float64
    for b in range(batch):
        for j in range(num_grid):
            if j >= len(ref[b]):
                assert not w.grid_mask[b, j] and not w.valid[b, j].any() and (w.distance[b, j] == 0).all()  # masked
                continue
            assert w.grid_mask[b, j]
            slots, dist = ref[b][j]
            assert w.valid[b, j].tolist() == [s is not None for s in slots], (b, j)
            got = [int(i) if v else None for i, v in zip(w.index[b, j], w.valid[b, j])]
            assert got == slots, (b, j, got, slots)
            got_dist = [float(x) for x, v in zip(w.distance[b, j], w.valid[b, j]) if v]
            assert got_dist == dist, (b, j)  # exact: lattice arithmetic


# ----------------------------------------------------------------------------------------------------------
# hand-computed examples


def test_hand_example_times_grid_windows_and_expansion():
    """Δ = 1, steps (.5, .25, .75, .5, 1, .25): t = (.5, .75, 1.5, 2, 3, 3.25), L̄ = 3, exact boundaries at 2 and 3.
    Dyadic values throughout: every time, distance and expanded value below is exact."""
    steps = torch.tensor([[0.5, 0.25, 0.75, 0.5, 1.0, 0.25]])
    t = resampling_times(steps, 1.0)
    assert t.dtype == torch.float64 and t.tolist() == [[0.5, 0.75, 1.5, 2.0, 3.0, 3.25]]
    assert grid_index(t, 1.0).tolist() == [[0, 0, 1, 2, 3, 3]]
    assert grid_sizes(t, 1.0).tolist() == [3]

    # causal, K = 2: e_1 = 2 (t = 1.5), e_2 = 3 (t = 2 lands on t̄_2), e_3 = 4 (t = 3 lands on t̄_3)
    w = causal_windows(t, 1.0, window=2)
    assert w.index.tolist() == [[[1, 2], [2, 3], [3, 4]]]
    assert w.valid.all() and w.grid_mask.all()
    assert w.distance.tolist() == [[[0.25, -0.5], [0.5, 0.0], [1.0, 0.0]]]

    # faithful, K = 2: for t̄_1 = 1, |1 − t| = (.5, .25, .5, ...): token 1, then the tie .5 goes to token 0
    w = nearest_windows(t, 1.0, window=2)
    assert w.index.tolist() == [[[0, 1], [2, 3], [4, 5]]]
    assert w.distance.tolist() == [[[0.5, 0.25], [0.5, 0.0], [0.0, -0.25]]]

    y_grid = torch.tensor([[[10.0], [20.0], [30.0]]])
    # floor: j(l) = (0, 0, 1, 2, 3, 3)
    assert expand_floor(y_grid, t, 1.0).squeeze(-1).tolist() == [[0.0, 0.0, 10.0, 20.0, 30.0, 30.0]]
    # nearest, ties to the earlier grid point: t = .5 → 0 → clamped to 1; t = 1.5 → 1; 3.25 → 3
    assert expand_nearest(y_grid, t, 1.0).squeeze(-1).tolist() == [[10.0, 10.0, 10.0, 20.0, 30.0, 30.0]]


def test_hand_example_left_padding():
    """mask (0, 0, 1, 1, 1), steps (·, ·, .5, .5, 1): t = (0, 0, .5, 1, 2); pads never enter a window (dyadic
    values: exact)."""
    steps = torch.tensor([[0.9, 0.9, 0.5, 0.5, 1.0]])
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    t = resampling_times(steps, 1.0, mask)
    assert t.tolist() == [[0.0, 0.0, 0.5, 1.0, 2.0]]
    w = causal_windows(t, 1.0, window=3, mask=mask)
    assert w.valid.tolist() == [[[False, True, True], [True, True, True]]]
    assert w.index.tolist() == [[[0, 2, 3], [2, 3, 4]]]  # invalid slot holds index 0
    assert w.distance.tolist() == [[[0.0, 0.5, 0.0], [1.5, 1.0, 0.0]]]
    w = nearest_windows(t, 1.0, window=4, mask=mask)  # only 3 real tokens: one invalid slot, first
    assert w.valid.tolist() == [[[False, True, True, True]] * 2]
    assert w.index.tolist() == [[[0, 2, 3, 4]] * 2]


# ----------------------------------------------------------------------------------------------------------
# times and grid


@pytest.mark.parametrize(("name", "steps", "delta", "mask"), CASES, ids=CASE_IDS)
def test_times_and_grid_match_loops(name, steps, delta, mask):
    t = resampling_times(steps, delta, mask)
    assert t.dtype == torch.float64
    assert t.tolist() == _times_ref(steps, delta, mask)  # bit for bit: sums of lattice values are exact
    counts = grid_index(t, delta)
    assert counts.tolist() == [[_count_ref(x, delta) for x in row] for row in t.tolist()]
    assert grid_sizes(t, delta).tolist() == [row[-1] for row in counts.tolist()]
    if name.startswith("kappa1"):  # every real token crosses exactly one grid point
        real = torch.ones_like(counts, dtype=torch.bool) if mask is None else mask
        assert counts.tolist() == real.long().cumsum(1).tolist()


def test_times_are_exact_in_any_summation_order():
    """Lattice values: a reversed or blocked summation gives the same bits as the cumsum (any device's scan):
    multiples of a power of two q, far below 2^53·q, add exactly in any order, and t/q, round and ·q are exact."""
    gen = torch.Generator().manual_seed(0)
    delta = 0.7  # not a float32, not dyadic
    steps = (0.05 + 0.95 * torch.rand(2, 5000, generator=gen, dtype=torch.float64)) * delta
    t = resampling_times(steps, delta)
    q, _ = _snapped_delta(delta)
    assert torch.equal(torch.round(t / q) * q, t)  # on the lattice
    snapped = torch.diff(t, dim=1, prepend=torch.zeros(2, 1, dtype=torch.float64))
    assert torch.equal(snapped.flip(1).sum(1), t[:, -1])
    assert torch.equal(snapped.view(2, 50, 100).sum(2).cumsum(1), t[:, 99::100])
    # within the lattice rounding of the plain float64 cumsum
    assert (t - steps.cumsum(1)).abs().max() <= 5000 * q


def test_times_gradient_is_the_plain_cumsum():
    steps = _eq13_steps(2, 9, 0.3, 1.0, seed=0).double().requires_grad_()
    mask = _left_pad_mask(2, 9, seed=1)
    weight = torch.randn(2, 9, dtype=torch.float64)
    (grad,) = torch.autograd.grad((resampling_times(steps, 1.0, mask) * weight).sum(), steps)
    expected = (weight.flip(1).cumsum(1).flip(1)) * mask
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------------------------------------
# windows


@pytest.mark.parametrize(("name", "steps", "delta", "mask"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("window", [1, 3, 6])
def test_causal_windows_match_loop(name, steps, delta, mask, window):
    t = resampling_times(steps, delta, mask)
    num_grid = int(grid_sizes(t, delta).max()) + 2  # two extra batch-padding slots
    w = causal_windows(t, delta, window, mask=mask, num_grid=num_grid)
    _assert_windows_match(w, _causal_ref(t.tolist(), delta, mask, window), num_grid, window)
    assert torch.equal(w.grid_mask, w.valid[..., -1])  # the emission token is always the last slot


@pytest.mark.parametrize(("name", "steps", "delta", "mask"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("window", [1, 2, 5, 8])
def test_nearest_windows_match_brute_force_knn(name, steps, delta, mask, window):
    t = resampling_times(steps, delta, mask)
    w = nearest_windows(t, delta, window, mask=mask)
    num_grid = int(grid_sizes(t, delta).max())
    _assert_windows_match(w, _nearest_ref(t.tolist(), delta, mask, window), num_grid, window)


@pytest.mark.parametrize(("name", "steps", "delta", "mask"), CASES, ids=CASE_IDS)
def test_causal_windows_never_look_past_the_emission_token(name, steps, delta, mask):
    """Every valid index k of grid point j satisfies k ≤ e_j = min{l : t_l ≥ t̄_j}, and t_k < t̄_j for k < e_j."""
    t = resampling_times(steps, delta, mask)
    w = causal_windows(t, delta, 4, mask=mask)
    counts = grid_index(t, delta)
    for b in range(t.shape[0]):
        for j in range(1, int(counts[b, -1]) + 1):
            e = int(torch.searchsorted(counts[b], j))
            idx = w.index[b, j - 1][w.valid[b, j - 1]]
            assert idx.max() == e and (idx <= e).all()
            assert (w.distance[b, j - 1][w.valid[b, j - 1]][:-1] > 0).all()
            assert w.distance[b, j - 1, -1] > -float(delta)
            if mask is not None:
                assert mask[b, idx].all()


def test_num_grid_default_and_truncation():
    steps = _eq13_steps(3, 20, 0.4, 1.0, seed=2)
    t = resampling_times(steps, 1.0)
    full = causal_windows(t, 1.0, 3)
    assert full.index.shape[1] == int(grid_sizes(t, 1.0).max())
    short = causal_windows(t, 1.0, 3, num_grid=2)
    for a, b in zip(short, full):
        assert torch.equal(a, b[:, :2])  # integers, booleans and exact lattice distances
    assert causal_windows(t, 1.0, 3, num_grid=0).index.shape == (3, 0, 3)


# ----------------------------------------------------------------------------------------------------------
# coverage bound (spec §2c)


@pytest.mark.parametrize("kappa", [0.5, 0.375, 0.25, 10 / 64, 0.125])
def test_coverage_bound(kappa):
    """Causal: K ≥ ⌈1/κ⌉ puts every real token up to e_{L̄} in a window; faithful: K ≥ ⌊1/κ⌋ + 1 covers every
    token within Δ/2 of a grid point. Minimal steps κΔ with one K less drop tokens. κ is a multiple of 1/64
    so that steps ≥ κΔ hold exactly (the bound is on the steps actually summed: a κΔ rounded down by an ulp
    can need one more K)."""
    gen = torch.Generator().manual_seed(int(1 / kappa))
    # dyadic steps in [κ, 1] (multiples of 1/64), so the κ bound is exact
    steps = (torch.randint(round(kappa * 64), 65, (6, 60), generator=gen) / 64).double()
    steps[0] = kappa  # densest packing
    t = resampling_times(steps, 1.0)
    sizes = grid_sizes(t, 1.0)

    def causal_covered(window):
        w = causal_windows(t, 1.0, window)
        ok = True
        for b in range(6):
            last = int(w.index[b, sizes[b] - 1, -1])
            seen = set(w.index[b][w.valid[b]].tolist())
            ok &= seen == set(range(last + 1))
        return ok

    k_causal = math.ceil(1 / kappa)
    assert causal_covered(k_causal)
    if k_causal > 1:
        assert not causal_covered(k_causal - 1)

    k_near = math.floor(1 / kappa) + 1
    w = nearest_windows(t, 1.0, k_near)
    for b in range(6):
        seen = set(w.index[b][w.valid[b]].tolist())
        inner = {pos for pos in range(60) if 0.5 <= t[b, pos] <= sizes[b] + 0.5}
        assert inner <= seen


# ----------------------------------------------------------------------------------------------------------
# features, gather, expansion


def test_gaussian_features_match_formula_and_mask():
    gen = torch.Generator().manual_seed(0)
    distance = torch.randn(2, 3, 4, generator=gen, dtype=torch.float64)
    centers = torch.randn(5, generator=gen)
    valid = torch.rand(2, 3, 4, generator=gen) < 0.7
    eps = gaussian_distance_features(distance, centers, valid)
    assert eps.shape == (2, 3, 4, 5) and eps.dtype == torch.float32
    for idx in [(0, 0, 0), (1, 2, 3), (0, 1, 2)]:
        for i in range(5):
            d = float(torch.tensor(float(distance[idx])).float())
            expected = math.exp(-((d - float(centers[i])) ** 2)) if valid[idx] else 0.0
            assert eps[(*idx, i)].item() == pytest.approx(expected, rel=1e-6, abs=1e-7)
    eps64 = gaussian_distance_features(distance, centers.double())
    assert eps64.dtype == torch.float64
    torch.testing.assert_close(eps64, torch.exp(-((distance[..., None] - centers.double()) ** 2)))


def test_gaussian_features_of_far_distances_never_go_subnormal():
    """exp(−(d − μ)²) is below float32's smallest normal from |d − μ| ≈ 9.3: features stop at exp(−60) (~9e-27,
    with gradient 0) instead, since a CPU multiplies subnormal floats ~50× slower and θ_Γ's gradient reads every
    feature; nearer ones keep the formula's value and gradient."""
    distance = torch.linspace(0, 12, 241, dtype=torch.float64)
    centers = torch.tensor([0.0, 1.5], requires_grad=True)
    eps = gaussian_distance_features(distance, centers)
    assert eps.min() >= torch.exp(torch.tensor(-FEATURE_FLOOR_SQUARE))  # no subnormal, no 0
    square = (distance.float()[:, None] - centers.detach()) ** 2  # the op's own square: same op, same inputs
    near = square <= FEATURE_FLOOR_SQUARE
    # float32 exp of another shape (vectorised body or scalar tail, or another instruction set): each within
    # 2 ulps of exp, so within 4 ulps (≤ 4·EPS32 relative) of each other
    torch.testing.assert_close(eps.detach()[near], torch.exp(-square[near]), rtol=4 * EPS32, atol=0)
    (grad,) = torch.autograd.grad(eps[~near].sum(), centers)
    assert not grad.any()


def test_distance_gradient_in_log_grid_step_is_the_distance():
    """∂d/∂Δ = j (grid times) and −∂t_k/∂Δ through the steps (the only path of Δ and θ_Δ into the layer's
    output): with steps proportional to Δ, d is linear in Δ and ∂d/∂logΔ = d."""
    log_delta = torch.tensor(0.2, requires_grad=True)
    delta = log_delta.exp()
    sig = torch.sigmoid(torch.randn(2, 15, generator=torch.Generator().manual_seed(0)))
    steps = sig * delta * 0.7 + 0.3 * delta  # Eq. 13 with κ = 0.3
    mask = _left_pad_mask(2, 15, seed=4)
    t = resampling_times(steps, delta, mask)
    w = causal_windows(t, delta, 3, mask=mask)
    (g_delta_only,) = torch.autograd.grad(w.distance.sum(), log_delta)
    # d = jΔ − t_k and t_k = Δ·Σ(σ·0.7 + 0.3) = Δ·(t_k/Δ): d is linear in Δ, so ∂d/∂logΔ = d. Σd cancels Σ jΔ
    # against Σ t_k (each ~13× Σd here), and float32 rounds the steps (3 ops) and the gradient's sums (≤ 5 stages
    # over 30 steps, the two paths added, ·Δ) to ulps of those magnitudes: ≤ ~11 roundings of u = EPS32/2 on
    # S = Σ (jΔ + t_k), and 16·EPS32·S (~1.5× that) holds them (a bound of 1e-6 of Σd was 1.16× the error seen)
    t_k = torch.where(w.valid, t.detach().gather(1, w.index.flatten(1)).view_as(w.distance), 0.0)
    magnitude = (w.distance.detach() + 2 * t_k).sum().item()  # Σ (jΔ + t_k), both ≥ 0
    assert abs(g_delta_only.item() - w.distance.sum().item()) <= 16 * EPS32 * magnitude


@pytest.mark.parametrize(
    ("windows", "reference"),
    [(causal_windows, _causal_ref), (nearest_windows, _nearest_ref)],
    ids=["causal", "nearest"],
)
def test_distance_feature_gradients_match_the_chain_rule_by_loop(windows, reference):
    """Gradients of ``Σ W·ε(t̄_j − t_k)`` (Eq. 12's features, random weights W) in the centres μ, Δ and the
    steps, against the chain rule summed slot by slot over the loop windows: ``∂ε_i/∂d = −2(d − μ_i)ε_i =
    −∂ε_i/∂μ_i``, ``∂d/∂Δ = j`` (t̄_j = jΔ; the steps are separate leaves here) and ``∂d/∂Δ_i = −1`` for every
    real token i ≤ k (t_k = Σ_{i≤k} Δ_i, pads add nothing), straight through the lattice rounding."""
    gen = torch.Generator().manual_seed(0)
    batch, length, window, num_features = 3, 15, 3, 4
    delta = torch.tensor(1.3, dtype=torch.float64, requires_grad=True)
    steps = _eq13_steps(batch, length, 0.3, 1.3, seed=0).double().requires_grad_()
    mask = _random_mask(batch, length, seed=1)
    centers = torch.randn(num_features, generator=gen, dtype=torch.float64).requires_grad_()
    t = resampling_times(steps, delta, mask)
    w = windows(t, delta, window, mask=mask)
    features = gaussian_distance_features(w.distance, centers, w.valid)
    weights = torch.randn(features.shape, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad((features * weights).sum(), [steps, delta, centers])

    g_steps, g_delta, g_centers = torch.zeros(batch, length, dtype=torch.float64), 0.0, [0.0] * num_features
    for b, row in enumerate(reference(t.tolist(), 1.3, mask, window)):
        for j, (slots, distances) in enumerate(row, start=1):
            empty = window - len(distances)  # empty slots come first
            for slot, (k, d) in enumerate(zip(slots[empty:], distances), start=empty):
                for i, mu in enumerate(centers.tolist()):
                    g_d = float(weights[b, j - 1, slot, i]) * -2 * (d - mu) * math.exp(-((d - mu) ** 2))
                    g_centers[i] -= g_d
                    g_delta += j * g_d
                    for r in range(k + 1):
                        g_steps[b, r] -= g_d if mask[b, r] else 0.0
    expected = [g_steps, torch.tensor(g_delta, dtype=torch.float64), torch.tensor(g_centers, dtype=torch.float64)]
    for name, u, v in zip(["steps", "Δ", "μ"], got, expected):
        scale = v.abs().max().item()
        assert scale > 0, name
        torch.testing.assert_close(u, v, rtol=1e-9, atol=1e-9 * scale, msg=lambda m, name=name: f"{name}: {m}")


def test_select_rows_is_gather_of_whole_rows_forward_and_backward():
    x = torch.randn(3, 7, 5, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, 7, (3, 11))  # repeated rows: their gradients add up
    weight = torch.randn(3, 11, 5, dtype=torch.float64)
    got = select_rows(x, index)
    expected = x.gather(1, index[..., None].expand(-1, -1, 5))
    assert torch.equal(got, expected)  # copies of rows
    (g_got,) = torch.autograd.grad((got * weight).sum(), x)
    (g_expected,) = torch.autograd.grad((expected * weight).sum(), x)
    torch.testing.assert_close(g_got, g_expected, rtol=1e-12, atol=1e-12)


def test_gather_windows_matches_loop():
    steps = _eq13_steps(3, 21, 0.3, 1.0, seed=1)
    mask = _left_pad_mask(3, 21, seed=2)
    t = resampling_times(steps, 1.0, mask)
    w = nearest_windows(t, 1.0, 4, mask=mask, num_grid=int(grid_sizes(t, 1.0).max()) + 1)
    x = _inputs(steps, hidden=5).requires_grad_()
    got = gather_windows(x, w.index, w.valid)
    assert got.shape == (*w.index.shape, 5)
    for b in range(3):
        for j in range(w.index.shape[1]):
            for k in range(4):
                expected = x[b, w.index[b, j, k]] if w.valid[b, j, k] else torch.zeros(5, dtype=x.dtype)
                assert torch.equal(got[b, j, k], expected)  # a copy, or zeros where invalid
    (grad,) = torch.autograd.grad(got.sum(), x)
    uses = torch.zeros(3, 21, dtype=x.dtype)
    for b in range(3):
        for i in w.index[b][w.valid[b]].tolist():
            uses[b, i] += 1
    assert torch.equal(grad, uses[..., None].expand(-1, -1, 5))  # sums of ones: small integers, exact


@pytest.mark.parametrize(("name", "steps", "delta", "mask"), CASES, ids=CASE_IDS)
def test_expansions_match_loops(name, steps, delta, mask):
    t = resampling_times(steps, delta, mask)
    sizes = grid_sizes(t, delta)
    num_grid = int(sizes.max()) + 1
    y_grid = torch.randn(t.shape[0], num_grid, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    floor = expand_floor(y_grid, t, delta)
    near = expand_nearest(y_grid, t, delta)
    assert floor.shape == near.shape == (*t.shape, 2)
    _, d = _snapped_delta(delta)
    for b in range(t.shape[0]):  # expansions are gathers: copies of grid values, or zeros
        for pos in range(t.shape[1]):
            tl = float(t[b, pos])
            j = _count_ref(tl, delta)
            assert j * d <= tl < (j + 1) * d  # floor reads only grid points at or before t_l
            assert torch.equal(floor[b, pos], y_grid[b, j - 1] if j > 0 else torch.zeros(2, dtype=y_grid.dtype))
            if sizes[b] == 0:
                assert (near[b, pos] == 0).all()
                continue
            grid = range(1, int(sizes[b]) + 1)
            k = min(grid, key=lambda g: (abs(tl - g * d), g))  # nearest, ties to the earlier grid point
            assert torch.equal(near[b, pos], y_grid[b, k - 1])


def test_causal_pipeline_is_causal():
    """windows → gather → a causal map over the grid → expand_floor: output l ignores tokens after l. The
    runs have different grid sizes (features, sums and cumsums of other shapes), so their prefixes agree to
    float64 round-off: ~50 rounded stages (a sum of 35, a cumsum over ≤ 30 grid points), ≤ 1e-14 of the largest
    value; a token after l leaking into output l would move it by O(1)."""
    gen = torch.Generator().manual_seed(0)
    steps = _eq13_steps(3, 30, 0.25, 1.0, seed=9)
    mask = _left_pad_mask(3, 30, seed=9)
    x = torch.randn(3, 30, 4, generator=gen, dtype=torch.float64)
    centers = torch.randn(3, generator=gen)

    def pipeline(x, steps):
        t = resampling_times(steps, 1.0, mask)
        w = causal_windows(t, 1.0, 5, mask=mask)
        feats = gaussian_distance_features(w.distance, centers.double(), w.valid)
        x_bar = torch.cat([gather_windows(x, w.index, w.valid), feats], -1).flatten(-2).sum(-1, keepdim=True)
        return expand_floor(x_bar.cumsum(1), t, 1.0)  # cumsum over the grid: a causal "SSM"

    base = pipeline(x, steps)
    for cut in [0, 7, 15, 28]:
        x2, s2 = x.clone(), steps.clone()
        x2[:, cut + 1 :] = torch.randn(3, 29 - cut, 4, generator=gen, dtype=torch.float64)
        s2[:, cut + 1 :] = _eq13_steps(3, 29 - cut, 0.25, 1.0, seed=cut)
        got, want = pipeline(x2, s2)[:, : cut + 1], base[:, : cut + 1]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12 * base.abs().max().item())


# ----------------------------------------------------------------------------------------------------------
# streaming == parallel


def _assert_state_equal(a, b):
    """Bit for bit: clocks and times are lattice sums, counts integers, the window inputs copies (see the top)."""
    for name, u, v in zip(a._fields, a, b):
        assert torch.equal(u, v), name


@pytest.mark.parametrize(("name", "steps", "delta", "mask"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("window", [1, 4])
def test_streaming_matches_parallel_token_by_token(name, steps, delta, mask, window):
    """Clock, grid count, emissions (window inputs, validity, distances) bit for bit; prefill of every prefix.
    Both paths get the same step tensor: exact lattice arithmetic and copies (see the top of the file)."""
    batch, length = steps.shape
    x = _inputs(steps, hidden=3)
    t = resampling_times(steps, delta, mask)
    counts = grid_index(t, delta)
    w = causal_windows(t, delta, window, mask=mask)
    parallel_inputs = gather_windows(x, w.index, w.valid)
    state = resampling_init_state(batch, window, 3, dtype=x.dtype)
    for pos in range(length):
        state, em = resampling_step(state, x[:, pos], steps[:, pos], delta, None if mask is None else mask[:, pos])
        assert torch.equal(state.clock, t[:, pos])
        assert torch.equal(state.grid_count, counts[:, pos])
        previous = counts[:, pos - 1] if pos else torch.zeros(batch, dtype=torch.long)
        assert torch.equal(em.emitted, counts[:, pos] > previous)
        assert (counts[:, pos] - previous).max() <= 1  # at most one crossing per token
        for b in range(batch):
            if em.emitted[b]:
                j = int(counts[b, pos])
                assert torch.equal(em.inputs[b], parallel_inputs[b, j - 1])
                assert torch.equal(em.valid[b], w.valid[b, j - 1])
                assert torch.equal(em.distance[b], w.distance[b, j - 1])
            else:
                assert not em.valid[b].any() and (em.inputs[b] == 0).all() and (em.distance[b] == 0).all()
        prefix_mask = None if mask is None else mask[:, : pos + 1]
        _assert_state_equal(state, resampling_prefill(x[:, : pos + 1], t[:, : pos + 1], delta, window, prefix_mask))
    if name.startswith("kappa1"):
        assert torch.equal(state.grid_count, (torch.ones_like(t) if mask is None else mask).sum(1).long())


@pytest.mark.parametrize("split", [1, 9, 20])
def test_prefill_then_stream_continues_the_parallel_grid(split):
    steps = _eq13_steps(3, 33, 0.2, 1.0, seed=4)
    mask = _left_pad_mask(3, 33, seed=4)
    x = _inputs(steps, hidden=2, dtype=torch.float32)
    t = resampling_times(steps, 1.0, mask)
    w = causal_windows(t, 1.0, 6, mask=mask)
    parallel_inputs = gather_windows(x, w.index, w.valid)
    state = resampling_prefill(x[:, :split], t[:, :split], 1.0, 6, mask[:, :split])
    emitted = [[] for _ in range(3)]
    for pos in range(split, 33):
        state, em = resampling_step(state, x[:, pos], steps[:, pos], 1.0, mask[:, pos])
        for b in range(3):
            if em.emitted[b]:
                emitted[b].append(int(state.grid_count[b]))
                j = emitted[b][-1]
                assert torch.equal(em.inputs[b], parallel_inputs[b, j - 1])
                assert torch.equal(em.distance[b], w.distance[b, j - 1])
    sizes_before, sizes_after = grid_sizes(t[:, :split], 1.0), grid_sizes(t, 1.0)
    for b in range(3):
        assert emitted[b] == list(range(int(sizes_before[b]) + 1, int(sizes_after[b]) + 1))


def test_streaming_distance_carries_gradients():
    log_delta = torch.tensor(0.0, requires_grad=True)
    delta = log_delta.exp()
    state = resampling_init_state(1, 2, 1)
    total = 0
    for _ in range(4):
        state, em = resampling_step(state, torch.ones(1, 1), delta.reshape(1) * 0.5, delta)
        total = total + em.distance.sum()
    (grad,) = torch.autograd.grad(total, log_delta)
    assert grad.item() == pytest.approx(total.item())  # distances scale with Δ


# ----------------------------------------------------------------------------------------------------------
# bad inputs


def test_bad_inputs_raise_value_error_naming_the_argument():
    steps = torch.full((2, 5), 0.5)
    t = resampling_times(steps, 1.0)
    x = torch.zeros(2, 5, 3)
    w = causal_windows(t, 1.0, 2)
    with pytest.raises(ValueError, match="step"):
        resampling_times(steps[0], 1.0)
    with pytest.raises(ValueError, match="mask"):
        resampling_times(steps, 1.0, torch.ones(2, 4))
    for bad in [0.0, -1.0, float("nan"), float("inf"), torch.tensor([1.0, 2.0])]:
        with pytest.raises(ValueError, match="grid_step"):
            resampling_times(steps, bad)
        with pytest.raises(ValueError, match="grid_step"):
            causal_windows(t, bad, 2)
    for bad in [0, -2, 1.5, True]:
        with pytest.raises(ValueError, match="window"):
            causal_windows(t, 1.0, bad)
        with pytest.raises(ValueError, match="window"):
            nearest_windows(t, 1.0, bad)
        with pytest.raises(ValueError, match="window"):
            resampling_init_state(2, bad, 3)
    with pytest.raises(ValueError, match="num_grid"):
        causal_windows(t, 1.0, 2, num_grid=-1)
    with pytest.raises(ValueError, match="t must"):
        nearest_windows(t[0], 1.0, 2)
    with pytest.raises(ValueError, match="t must"):
        grid_sizes(t[:, :0], 1.0)
    with pytest.raises(ValueError, match="mask"):
        causal_windows(t, 1.0, 2, mask=torch.ones(3, 5))
    with pytest.raises(ValueError, match="centers"):
        gaussian_distance_features(w.distance, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="valid"):
        gaussian_distance_features(w.distance, torch.zeros(3), w.valid[:, :, :1])
    with pytest.raises(ValueError, match="x must"):
        gather_windows(x[0], w.index, w.valid)
    with pytest.raises(ValueError, match="index"):
        gather_windows(x, w.index[0], w.valid[0])
    with pytest.raises(ValueError, match="valid"):
        gather_windows(x, w.index, w.valid.long())
    with pytest.raises(ValueError, match="y_grid"):
        expand_floor(torch.zeros(2, 3), t, 1.0)
    with pytest.raises(ValueError, match="t must"):
        expand_nearest(torch.zeros(3, 3, 1), t, 1.0)
    with pytest.raises(ValueError, match="t must"):
        resampling_prefill(x, t[:, :4], 1.0, 2)
    state = resampling_init_state(2, 2, 3)
    with pytest.raises(ValueError, match="x_t"):
        resampling_step(state, torch.zeros(2, 4), steps[:, 0], 1.0)
    with pytest.raises(ValueError, match="step_t"):
        resampling_step(state, torch.zeros(2, 3), steps[:, :2], 1.0)
    with pytest.raises(ValueError, match="mask_t"):
        resampling_step(state, torch.zeros(2, 3), steps[:, 0], 1.0, torch.ones(3))


# ----------------------------------------------------------------------------------------------------------
# several branches stepped at once: rows (B, R) with one lattice per branch


def test_lattice_of_a_tensor_equals_the_scalar_lattice_of_each_value():
    """The on-device lattice (log2, no host sync) gives each Δ the quantum, units and snapped Δ of frexp on the host."""
    gen = torch.Generator().manual_seed(0)
    powers = 2.0 ** torch.arange(-30, 31, 3).float()  # and the float32 values on either side of each
    around = [powers, torch.nextafter(powers, torch.zeros(())), torch.nextafter(powers, torch.full((), 1e30))]
    values = torch.cat([torch.exp(8 * torch.randn(500, generator=gen)), torch.tensor([3.0, 0.7]), *around])
    lattice = resampling_lattice(values.float())
    scalar = _lattice(values[0].float(), torch.device("cpu"))  # the scalar functions' lattice: the same function
    assert scalar.units.item() == lattice.units[0].item() and scalar.delta.item() == lattice.delta[0].item()
    for i, value in enumerate(values.float().tolist()):
        _, exponent = math.frexp(value)  # the host reference: value = m·2^exponent, m ∈ [0.5, 1)
        quantum = math.ldexp(1.0, exponent - 29)  # q = 2^(⌊log₂Δ⌋ − 28); powers of two and integers: exact
        units = round(value / quantum)
        assert lattice.quantum[i].item() == quantum
        assert lattice.units[i].item() == units
        assert lattice.delta[i].item() == units * quantum
    far = torch.tensor([2.0**-122, 2.0**127], dtype=torch.float64)  # their q or 2^⌊log₂Δ⌋ is no float32 number
    for bad in (torch.tensor([1.0, 0.0]), torch.tensor([float("nan")]), torch.tensor([-1.0, 1.0]), far[:1], far[1:]):
        with pytest.raises(ValueError, match="grid_step"):
            resampling_lattice(bad)


@pytest.mark.parametrize("masked", [False, True])
def test_branches_stepped_at_once_equal_each_branch_alone_bit_for_bit(masked):
    """resampling_step on rows (B, R), Δ one per branch, equals R calls of (B,) rows with the branch's Δ: the same
    lattices (test above) and steps, so exact lattice arithmetic and copies."""
    deltas = torch.tensor([1.0, 0.37, 2.5])
    batch, length, window, hidden = 3, 40, 4, 5
    steps = torch.stack(
        [_eq13_steps(batch, length, k, d.item(), seed=i) for i, (k, d) in enumerate(zip((0.5, 0.1, 0.9), deltas))],
        dim=2,
    )  # (B, L, R)
    mask = _random_mask(batch, length, seed=1) if masked else None
    x = torch.randn(batch, length, hidden, generator=torch.Generator().manual_seed(2))
    together = resampling_init_state(batch, window, hidden)
    together = type(together)(*(t[:, None].repeat(1, 3, *[1] * (t.dim() - 1)) for t in together))  # (B, R, ...)
    alone = [resampling_init_state(batch, window, hidden) for _ in deltas]
    lattice = resampling_lattice(deltas)
    for pos in range(length):
        mask_t = None if mask is None else mask[:, pos]
        together, emission = resampling_step(
            together, x[:, pos, None].expand(batch, 3, hidden), steps[:, pos], lattice,
            None if mask_t is None else mask_t[:, None].expand(batch, 3),
        )  # fmt: skip
        for r, delta in enumerate(deltas):
            alone[r], em = resampling_step(alone[r], x[:, pos], steps[:, pos, r], delta, mask_t)
            _assert_state_equal(type(together)(*(t[:, r] for t in together)), alone[r])
            for name, u, v in zip(em._fields, emission, em):
                assert torch.equal(u[:, r], v), name
