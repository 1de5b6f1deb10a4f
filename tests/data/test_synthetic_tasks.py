"""Synthetic tasks: every generator against hand-computed examples, seeds, shapes, normalization, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from ssmhub.data.synthetic import (
    IGNORE_INDEX,
    REGRESSION_TASK_NAMES,
    SYNTHETIC_TASK_NAMES,
    add_position_features,
    assemble_associative_recall,
    assemble_induction_head,
    assemble_mqar,
    context_shift_targets,
    cummax_targets,
    cumsum_targets,
    fixed_eval_set,
    get_synthetic_task,
    mips_targets,
    mqar_gap_probabilities,
    normalize_max,
    position_features,
    r2_score,
    reverse_targets,
    select_targets,
    shift_targets,
    solve_inputs,
    solve_size,
    sort_targets,
)


def tensor(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- pure pieces, by hand


def test_normalize_max_divides_each_sample_by_its_largest_magnitude():
    x = tensor([[1, -4, 2], [0.5, 0.25, -0.125]])
    # dividing by a power of two (4, 0.5) is exact in float32: so is the comparison
    assert torch.equal(normalize_max(x), tensor([[0.25, -1, 0.5], [1, 0.5, -0.25]]))


def test_position_features_are_cos_sin_of_2_pi_i_over_the_actual_length():
    features = position_features(4)
    assert torch.allclose(features, tensor([[1, 0], [0, 1], [-1, 0], [0, -1]]), atol=1e-7)
    x = torch.zeros(2, 4, 1)
    with_features = add_position_features(x)
    assert with_features.shape == (2, 4, 3) and torch.allclose(with_features[1, :, 1:], features)


def test_shift_targets_by_hand():
    # Shift, CumMax, Reverse, Sort, Select, Solve's layout and MIPS (below) move input values without arithmetic
    # (copies, gathers; orders decided by exact comparisons): their targets are compared exactly.
    x = tensor([[1, 2, 3, 4]])
    expected = tensor([[[1, 0], [2, 0], [3, 1], [4, 2]]])  # shifts 0 and L/C = 2
    assert torch.equal(shift_targets(x, 2), expected)
    # C does not divide L = 6: shifts ⌊j·6/4⌋ = 0, 1, 3, 4
    y = shift_targets(tensor([[1, 2, 3, 4, 5, 6]]), 4)
    assert torch.equal(y[0, :, 1], tensor([0, 1, 2, 3, 4, 5]))
    assert torch.equal(y[0, :, 2], tensor([0, 0, 0, 1, 2, 3]))
    assert torch.equal(y[0, :, 3], tensor([0, 0, 0, 0, 1, 2]))


def test_cumsum_and_cummax_targets_by_hand():
    x = tensor([[1, -1, 2, 0.5]])
    assert torch.allclose(cumsum_targets(x), tensor([[1, 0, 2 / math.sqrt(3), 2.5 / 2]]))
    assert torch.equal(cummax_targets(tensor([[0.1, -0.5, 0.3, 0.2, 1.0]])), tensor([[0.1, 0.1, 0.3, 0.3, 1.0]]))


def test_reverse_and_sort_targets_by_hand():
    assert torch.equal(reverse_targets(tensor([[1, 2, 3]])), tensor([[3, 2, 1]]))
    # distances to x_0 = 0.5: 0, 1.5, 0.1, 0.4, 0.05
    assert torch.equal(sort_targets(tensor([[0.5, -1.0, 0.4, 0.9, 0.55]])), tensor([[0.5, 0.55, 0.4, 0.9, -1.0]]))


def test_select_targets_by_hand():
    x = tensor([[10, 11, 12, 13, 14], [20, 21, 22, 23, 24]])
    assert torch.equal(select_targets(x, torch.tensor([[1, 3], [0, 4]])), tensor([[11, 13], [20, 24]]))


def test_mips_targets_by_hand_and_only_look_left():
    k = tensor([[[1, 0], [0, 1], [-1, 0]]])
    q = tensor([[[0, 1], [0, 1], [-1, 0]]])  # q_0 would prefer k_1, which is to its right; scores 0, ±1 are exact
    v = tensor([[[1, 0], [0, 1], [0.6, 0.8]]])
    expected = tensor([[[1, 0], [0, 1], [0.6, 0.8]]])  # i' = 0, 1, 2
    assert torch.equal(mips_targets(q, k, v), expected)
    assert torch.equal(mips_targets(q, k, v, max_scores=1), expected)  # one query row at a time


def test_context_shift_targets_by_hand():
    c, s = math.cos(4 * math.pi / 5), math.sin(4 * math.pi / 5)
    x_prime = tensor([[c, s, 0.5, -1, 0.25], [1, 0, 0.5, -1, 0.25]])
    y = context_shift_targets(x_prime, torch.tensor([2, 0]))
    assert torch.allclose(y, tensor([[0, 0, c, s, 0.5], [1, 0, 0.5, -1, 0.25]]))


def test_solve_size_and_inputs_by_hand():
    # largest N with L − N² − N ≥ N; the paper: 63 at L = 4096 and 21 at L = 512
    assert [solve_size(n) for n in (3, 7, 8, 14, 15, 512, 4096)] == [1, 1, 2, 2, 3, 21, 63]
    a, b = tensor([[[1, 2], [3, 4]]]), tensor([[5, 6]])
    assert torch.equal(solve_inputs(a, b, 8), tensor([[1, 2, 5, 3, 4, 6, 0, 0]]))
    with pytest.raises(ValueError, match="too short"):
        solve_inputs(a, b, 5)


def test_r2_uses_one_scalar_mean_over_the_whole_batch():
    # mse 1/3, mean 7/3, var 14/9: R² = 1 − (1/3)/(14/9) = 11/14
    assert r2_score(tensor([1, 2, 3]), tensor([1, 2, 4])) == pytest.approx(11 / 14)
    # global mean 3, var 2, mse 11: −4.5 (a per-row mean would give −10)
    assert r2_score(torch.zeros(2, 2), tensor([[1, 3], [3, 5]])) == pytest.approx(-4.5)
    assert r2_score(tensor([1, 3]), tensor([1, 3])) == 1.0
    assert math.isnan(r2_score(tensor([1, 2]), tensor([2, 2])))
    with pytest.raises(ValueError, match="shape"):
        r2_score(torch.zeros(3), torch.zeros(2))


def test_mqar_matches_zoologys_docstring_example():
    keys, values, gaps = torch.tensor([[2, 4]]), torch.tensor([[8, 7]]), torch.tensor([[4, 1]])
    input_ids, labels = assemble_mqar(keys, values, gaps, seq_len=16)
    assert input_ids.tolist() == [[2, 8, 4, 7, 0, 0, 4, 0, 0, 0, 0, 0, 2, 0, 0, 0]]
    expected = [IGNORE_INDEX] * 16
    expected[6], expected[12] = 7, 8
    assert labels.tolist() == [expected]
    filled, same_labels = assemble_mqar(keys, values, gaps, 16, fill=torch.full((1, 16), 99))
    assert filled.tolist() == [[2, 8, 4, 7, 99, 99, 4, 99, 99, 99, 99, 99, 2, 99, 99, 99]]
    assert torch.equal(same_labels, labels)


def test_mqar_gap_probabilities_by_hand():
    weights = [0.5 * 1, 0.5 * 2**-0.5, 0.5 * 3**-0.5]  # a·g^(a−1), a = 0.5
    expected = torch.tensor([w / sum(weights) for w in weights], dtype=torch.float64)
    assert torch.allclose(mqar_gap_probabilities(3, 0.5), expected)
    assert torch.allclose(mqar_gap_probabilities(4, 1.0), torch.full((4,), 0.25, dtype=torch.float64))


def test_associative_recall_and_induction_head_by_hand():
    input_ids, labels = assemble_associative_recall(
        torch.tensor([[0, 2, 1, 3]]), torch.tensor([[5, 7, 6, 4]]), torch.tensor([0]), separator=8
    )
    assert input_ids.tolist() == [[0, 5, 2, 7, 1, 6, 3, 4, 8, 0]]
    assert labels.tolist() == [[IGNORE_INDEX] * 9 + [5]]
    input_ids, labels = assemble_induction_head(torch.tensor([[4, 1, 5, 7, 3, 0, 2]]), torch.tensor([2]), trigger=9)
    assert input_ids.tolist() == [[4, 1, 9, 7, 3, 0, 9]]
    assert labels.tolist() == [[IGNORE_INDEX] * 6 + [7]]


# ---------------------------------------------------------------- sampled regression batches


SHAPES = {  # name -> (input length, input channels, output length, output channels) at L = 64
    "shift": (64, 3, 64, 8),
    "cumsum": (64, 3, 64, 1),
    "cummax": (64, 3, 64, 1),
    "reverse": (128, 3, 64, 1),
    "sort": (128, 3, 64, 1),
    "select": (128, 4, 32, 1),
    "select_fixed": (128, 4, 32, 1),
    "solve": (64, 3, 7, 1),
    "solve_fixed": (64, 3, 7, 1),
    "mips": (64, 14, 64, 4),
    "context_shift": (64, 3, 64, 1),
}


@pytest.mark.parametrize("name", REGRESSION_TASK_NAMES)
def test_regression_batches_have_the_papers_shapes_position_features_and_seeds(name):
    task = get_synthetic_task(name, 64)
    inputs, targets = task.sample(5, gen(3))
    length, channels, out_length, out_channels = SHAPES[name]
    assert inputs.shape == (5, length, channels) and targets.shape == (5, out_length, out_channels)
    assert (task.input_length, task.input_dim, task.output_length, task.output_dim) == SHAPES[name]
    assert inputs.dtype == targets.dtype == torch.float32
    assert torch.allclose(inputs[..., -2:], position_features(length).expand(5, -1, -1))
    again = task.sample(5, gen(3))  # the same op on the same seed, in this process: the same bits
    assert torch.equal(inputs, again[0]) and torch.equal(targets, again[1])
    assert not torch.equal(inputs, task.sample(5, gen(4))[0])


@pytest.mark.parametrize("name", ["shift", "cumsum", "cummax"])
def test_elementwise_tasks_compose_the_targets_of_a_max_normalized_input(name):
    task = get_synthetic_task(name, 32)
    inputs, targets = task.sample(4, gen())
    x = inputs[..., 0]
    assert torch.allclose(x.abs().amax(-1), torch.ones(4))
    expected = {"shift": shift_targets(x, 8), "cumsum": cumsum_targets(x)[..., None]}
    expected["cummax"] = cummax_targets(x)[..., None]
    assert torch.allclose(targets, expected[name])


@pytest.mark.parametrize("name", ["reverse", "sort"])
def test_reverse_and_sort_pad_l_zeros_on_the_right(name):
    inputs, targets = get_synthetic_task(name, 16).sample(3, gen())
    x = inputs[:, :16, 0]
    assert torch.all(inputs[:, 16:, 0] == 0) and torch.allclose(x.abs().amax(-1), torch.ones(3))
    expected = reverse_targets(x) if name == "reverse" else sort_targets(x)
    assert torch.equal(targets[..., 0], expected)  # copies of x's values


def test_select_marks_m_sorted_positions_and_pads_m_zeros():
    task = get_synthetic_task("select", 20, num_selected=4)
    inputs, targets = task.sample(6, gen())
    assert inputs.shape == (6, 28, 4) and targets.shape == (6, 4, 1)
    values, marker = inputs[..., 0], inputs[..., 1]
    assert torch.all(values[:, 24:] == 0) and torch.all(marker[:, 24:] == 0)  # the M pad positions
    assert torch.allclose(values[:, :24].abs().amax(-1), torch.ones(6))  # x ∈ R^{L+M} normalized
    assert torch.all(marker.sum(-1) == 4)
    for row in range(6):
        positions = marker[row].nonzero()[:, 0]
        assert torch.equal(targets[row, :, 0], values[row, positions])  # copies of the selected values
    assert not torch.equal(marker[0], marker[1])  # Select: positions vary per sample


def test_select_fixed_uses_one_set_of_positions_for_every_sample_and_call():
    task = get_synthetic_task("select_fixed", 20, num_selected=4)
    first, second = task.sample(3, gen(0))[0][..., 1], task.sample(2, gen(9))[0][..., 1]
    assert torch.equal(first[0], first[1]) and torch.equal(first[0], second[0])  # 0/1 markers
    assert torch.equal(first[0].nonzero()[:, 0], task.fixed_positions())
    other = get_synthetic_task("select_fixed", 20, num_selected=4, fixed_seed=1)
    assert not torch.equal(other.fixed_positions(), task.fixed_positions())


def test_mips_rows_are_unit_vectors_and_targets_follow_the_causal_argmax():
    inputs, targets = get_synthetic_task("mips", 16).sample(3, gen())
    q, k, v = inputs[..., 0:4], inputs[..., 4:8], inputs[..., 8:12]
    for part in (q, k, v):
        assert torch.allclose(part.norm(dim=-1), torch.ones(3, 16))
    # The causal argmax, from float64 scores (4-term dot products of float32 values: exact products, sums within
    # 1e-15). Every best key leads the runner-up by far more than float32's round-off of a score (~4 EPS32 = 5e-7),
    # so the sampler's float32 argmax picks the same key on any kernel, and its targets are copies of those v rows.
    scores = (q.double() @ k.double().transpose(1, 2)).masked_fill(torch.ones(16, 16).triu(1).bool(), -math.inf)
    top2 = scores[:, 1:].topk(2, dim=-1).values  # query 0 sees a single key
    assert (top2[..., 0] - top2[..., 1]).min() > 1e-4
    best = scores.argmax(-1)  # (3, 16)
    assert torch.equal(targets, v.gather(1, best[..., None].expand(-1, -1, 4)))
    assert torch.equal(targets[:, 0], v[:, 0])  # the first query can only see the first key


def test_context_shift_encodes_s_in_the_first_two_inputs():
    length = 10
    inputs, targets = get_synthetic_task("context_shift", length).sample(50, gen())
    x_prime = inputs[..., 0]
    angle = torch.atan2(x_prime[:, 1], x_prime[:, 0])
    shift = torch.remainder(torch.round(angle * length / (2 * math.pi)), length).long()
    assert int(shift.min()) >= 0 and int(shift.max()) <= length - 2 and len(shift.unique()) > 3
    assert torch.allclose(x_prime[:, 2:].abs().amax(-1), torch.ones(50))
    assert torch.allclose(targets[..., 0], context_shift_targets(x_prime, shift))


@pytest.mark.parametrize("name", ["solve", "solve_fixed"])
def test_solve_inputs_hold_an_orthonormal_system_and_its_unit_solution(name):
    length, n = 30, 4  # 16 + 4 + 4 ≤ 30 < 25 + 5 + 5
    task = get_synthetic_task(name, length)
    inputs, targets = task.sample(3, gen())
    assert task.output_length == n and targets.shape == (3, n, 1)
    rows = inputs[:, : n * (n + 1), 0].reshape(3, n, n + 1)
    a, b, solution = rows[..., :n], rows[..., n], targets[..., 0]
    assert torch.all(inputs[:, n * (n + 1) :, 0] == 0)
    assert torch.allclose(a @ a.transpose(1, 2), torch.eye(n).expand(3, n, n), atol=1e-5)
    assert torch.allclose(solution.norm(dim=-1), torch.ones(3), atol=1e-6)
    assert torch.allclose((a @ solution[..., None])[..., 0], b, atol=1e-6)
    assert torch.equal(a[0], a[1]) == (name == "solve_fixed")  # Solve-Fixed repeats one matrix: a copy
    if name == "solve_fixed":
        assert torch.allclose(a[0], task.fixed_matrix())


# ---------------------------------------------------------------- sampled token batches


def test_mqar_batches_ask_every_key_once_after_the_pairs():
    task = get_synthetic_task("mqar", 64, vocab_size=200, num_kv_pairs=8)
    input_ids, labels = task.sample(20, gen())
    assert input_ids.shape == labels.shape == (20, 64) and input_ids.dtype == torch.long
    for row in range(20):
        keys, values = input_ids[row, 0:16:2], input_ids[row, 1:16:2]
        assert len(keys.unique()) == 8 and int(keys.min()) >= 1 and int(keys.max()) < 100
        assert len(values.unique()) == 8 and int(values.min()) >= 100 and int(values.max()) < 200
        asked = (labels[row] != IGNORE_INDEX).nonzero()[:, 0]
        assert len(asked) == 8 and int(asked.min()) >= 16 and torch.all((asked - 16) % 2 == 0)
        answer = dict(zip(keys.tolist(), values.tolist()))
        assert sorted(input_ids[row, asked].tolist()) == sorted(answer)
        assert all(answer[int(input_ids[row, p])] == int(labels[row, p]) for p in asked)
    again = task.sample(20, gen())
    assert torch.equal(again[0], input_ids) and torch.equal(again[1], labels)


def test_mqar_keys_and_values_are_uniform_distinct_draws_in_random_order():
    task = get_synthetic_task("mqar", 16, vocab_size=20, num_kv_pairs=4, random_non_queries=False)
    input_ids, _ = task.sample(20000, gen())
    keys, values = input_ids[:, 0:8:2], input_ids[:, 1:8:2]  # keys from 1..9, values from 10..19
    for column in range(4):  # every slot is uniform over its range: no position favours small tokens
        counts = keys[:, column].bincount(minlength=10)[1:].double()
        assert counts.min() > 0.9 * 20000 / 9 and counts.max() < 1.1 * 20000 / 9
        counts = values[:, column].bincount(minlength=20)[10:].double()
        assert counts.min() > 0.9 * 20000 / 10 and counts.max() < 1.1 * 20000 / 10
    ascending = (keys.diff(dim=-1) > 0).all(dim=-1).double().mean()
    assert abs(float(ascending) - 1 / 24) < 0.01  # 1 of the 4! orders, as a random permutation


def test_mqar_without_random_fill_leaves_zeros_and_gaps_follow_the_power_law():
    task = get_synthetic_task("mqar", 64, vocab_size=200, num_kv_pairs=4, random_non_queries=False)
    input_ids, labels = task.sample(2000, gen())
    asked = labels != IGNORE_INDEX
    assert torch.all(input_ids[:, 8:][~asked[:, 8:]] == 0)
    gaps = (asked[:, 8:].nonzero()[:, 1] // 2).bincount(minlength=28)
    assert gaps[0] > gaps[5] > gaps[27]  # p(g) ∝ (g+1)^{−0.99}: short gaps are the most frequent


def test_associative_recall_batches_ask_a_key_of_the_sequence():
    task = get_synthetic_task("associative_recall", 12, vocab_size=9)
    input_ids, labels = task.sample(50, gen())
    assert torch.all(input_ids[:, -2] == 8) and torch.all(labels[:, :-1] == IGNORE_INDEX)
    for row in range(50):
        keys, values = input_ids[row, 0:10:2].tolist(), input_ids[row, 1:10:2].tolist()
        assert all(0 <= k < 4 for k in keys) and all(4 <= v < 8 for v in values)
        mapping = {}
        for k, v in zip(keys, values):
            assert mapping.setdefault(k, v) == v  # one value per key within a sequence
        assert int(labels[row, -1]) == mapping[int(input_ids[row, -1])]


def test_induction_head_batches_recall_the_token_after_the_first_trigger():
    task = get_synthetic_task("induction_head", 20, vocab_size=10)
    input_ids, labels = task.sample(50, gen())
    assert torch.all(input_ids[:, -1] == 9) and torch.all(labels[:, :-1] == IGNORE_INDEX)
    for row in range(50):
        triggers = (input_ids[row] == 9).nonzero()[:, 0].tolist()
        assert len(triggers) == 2 and triggers[0] <= 16
        assert int(labels[row, -1]) == int(input_ids[row, triggers[0] + 1])


def test_fixed_eval_set_is_the_same_on_every_call_and_differs_by_seed():
    task = get_synthetic_task("mqar", 32, vocab_size=64, num_kv_pairs=4)
    first, again, other = fixed_eval_set(task, 8), fixed_eval_set(task, 8), fixed_eval_set(task, 8, seed=1)
    assert torch.equal(first[0], again[0]) and not torch.equal(first[0], other[0])
    with pytest.raises(ValueError, match="num_examples"):
        fixed_eval_set(task, 0)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("name", "seq_len", "options", "message"),
    [
        ("nope", 64, {}, "unknown synthetic task 'nope'"),
        ("shift", 4, {}, "seq_len must be an integer >= 8 for shift"),
        ("context_shift", 2, {}, "seq_len must be an integer >= 3 for context_shift"),
        ("solve_fixed", 2, {}, "seq_len must be an integer >= 3 for solve_fixed"),
        ("cumsum", 0, {}, "seq_len must be an integer >= 1"),
        ("select", 8, {"num_selected": 0}, "num_selected must be an integer >= 1"),
        ("mqar", 63, {}, "seq_len must be even for mqar"),
        ("mqar", 64, {"num_kv_pairs": 17}, "num_kv_pairs=17 does not fit seq_len=64"),
        ("mqar", 64, {"num_kv_pairs": 8, "vocab_size": 16}, "vocab_size=16 is too small"),
        ("mqar", 64, {"power_a": 0.0}, "power_a must be a positive number"),
        ("associative_recall", 2, {}, "seq_len must be >= 4 for associative_recall"),
        ("induction_head", 3, {}, "seq_len must be >= 4 for induction_head"),
    ],
)
def test_bad_task_arguments_name_the_argument(name, seq_len, options, message):
    with pytest.raises(ValueError, match=message):
        get_synthetic_task(name, seq_len, **options)


def test_every_task_name_builds_at_a_small_length():
    for name in SYNTHETIC_TASK_NAMES:
        options = {"num_kv_pairs": 2, "vocab_size": 32} if name == "mqar" else {}
        task = get_synthetic_task(name, 16, **options)
        assert task.sample(2, gen())[0].shape[0] == 2
