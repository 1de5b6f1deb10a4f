"""Regular-language transduction tasks: hand examples, vectorized generators vs the pure-Python oracle, seeding."""

from __future__ import annotations

import pytest
import torch

from ssmhub.data import (
    IGNORE_INDEX,
    TASK_NAMES,
    RegularTask,
    fixed_test_set,
    get_task,
    last_supervised_label,
    reference_labels,
)

P, S, X = 5, 6, 7  # ModArith(5) operator ids: +, -, ×
_ = None  # unlabelled (operator) position in reference_labels


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _as_reference(labels: torch.Tensor) -> list[int | None]:
    return [None if v == IGNORE_INDEX else v for v in labels.tolist()]


# ----------------------------------------------------------------------------- hand examples
@pytest.mark.parametrize(
    ("name", "modulus", "tokens", "expected"),
    [
        # Sum(5): 0324 -> 4 (paper §4.1); prefixes 0, 3, 5, 9.
        ("sum", 5, [0, 3, 2, 4], [0, 3, 0, 4]),
        ("sum", 2, [1, 1, 0, 1], [1, 0, 0, 1]),  # Sum(2) is PARITY
        # EvenPair(5): 0320 -> 1 (paper §4.1).
        ("even_pair", 5, [0, 3, 2, 0], [1, 0, 0, 1]),
        ("even_pair", 5, [4, 4, 1, 3], [1, 1, 0, 0]),
        # ModArith(5): 1+2-3×4 = -9 ≡ 1 (paper §4.1); prefixes 1, 3, 0, -9.
        ("mod_arith", 5, [1, P, 2, S, 3, X, 4], [1, _, 3, _, 0, _, 1]),
        # several × in a row: 2, 6, 24.
        ("mod_arith", 5, [2, X, 3, X, 4], [2, _, 1, _, 4]),
        # negative subtraction: 0-4 = -4 ≡ 1.
        ("mod_arith", 5, [0, S, 4], [0, _, 1]),
        # 3, 3-4 = -1, 3-8 = -5, 3-24 = -21, 3-24+1 = -20.
        ("mod_arith", 5, [3, S, 4, X, 2, X, 3, P, 1], [3, _, 4, _, 0, _, 4, _, 0]),
        # × after -: 4-2×2 = 0, then ×4 -> 4-16 = -12 ≡ 3, then -1 -> -13 ≡ 2.
        ("mod_arith", 5, [4, S, 2, X, 2, X, 4, S, 1], [4, _, 2, _, 0, _, 3, _, 2]),
        ("mod_arith", 5, [3], [3]),
        # CycleNavigation (Deletang): "1 -1 0 -1 -1 -> class 3" and "1 1 1 -1 -> 2"; token = move + 1.
        ("cycle_navigation", 5, [2, 0, 1, 0, 0], [1, 0, 0, 4, 3]),
        ("cycle_navigation", 5, [2, 2, 2, 0], [1, 2, 3, 2]),
        # Parity (Deletang): "1010100 -> 1", "01111 -> 0".
        ("parity", 5, [1, 0, 1, 0, 1, 0, 0], [1, 1, 0, 0, 1, 1, 1]),
        ("parity", 2, [0, 1, 1, 1, 1], [0, 1, 0, 1, 0]),
    ],
)
def test_reference_hand_examples(name, modulus, tokens, expected):
    assert reference_labels(name, tokens, modulus) == expected


def test_paper_final_answers_through_last_supervised_label():
    labels = torch.tensor([[1, IGNORE_INDEX, 3, IGNORE_INDEX, 0, IGNORE_INDEX, 1], [0, 3, 0, 4, 4, 4, 4]])
    assert last_supervised_label(labels).tolist() == [1, 4]
    assert last_supervised_label(torch.tensor([[7]])).tolist() == [7]


# ----------------------------------------------------------------------------- vectorized == reference
_CASES = [
    (name, modulus, length)
    for name in TASK_NAMES
    for modulus in ((2, 3, 5, 7) if name != "parity" else (5,))
    for length in ((1, 3, 39, 499) if name == "mod_arith" else (1, 2, 39, 40, 500))
]


@pytest.mark.parametrize(("name", "modulus", "length"), _CASES)
def test_vectorized_matches_reference(name, modulus, length):
    task = get_task(name, modulus)
    batch = 6 if length >= 499 else 24
    tokens, labels = task.sample(batch, length, _gen(modulus * 1000 + length))
    assert tokens.shape == labels.shape == (batch, length)
    assert tokens.dtype == labels.dtype == torch.long
    assert 0 <= tokens.min() and tokens.max() < task.vocab_size
    supervised = labels[labels != IGNORE_INDEX]
    assert 0 <= supervised.min() and supervised.max() < task.num_classes
    for row_tokens, row_labels in zip(tokens, labels):
        assert _as_reference(row_labels) == reference_labels(name, row_tokens.tolist(), modulus)


def test_mod_arith_layout():
    task = get_task("mod_arith", 5)
    tokens, labels = task.sample(64, 39, _gen(0))
    assert (labels[:, 1::2] == IGNORE_INDEX).all() and (labels[:, 0::2] != IGNORE_INDEX).all()
    assert (tokens[:, 0::2] < 5).all() and (tokens[:, 1::2] >= 5).all() and (tokens[:, 1::2] <= 7).all()
    assert set(tokens[:, 1::2].unique().tolist()) == {5, 6, 7}
    assert last_supervised_label(labels).tolist() == labels[:, -1].tolist()


def test_other_tasks_supervise_every_position():
    for name in ("sum", "even_pair", "cycle_navigation", "parity"):
        tokens, labels = get_task(name).sample(16, 40, _gen(1))
        assert (labels != IGNORE_INDEX).all()
        assert last_supervised_label(labels).tolist() == labels[:, -1].tolist()
        assert set(tokens.unique().tolist()) == set(range(get_task(name).vocab_size))


# ----------------------------------------------------------------------------- task table
def test_task_table():
    expected = {  # name: (vocab, classes, train length, test length) for M = 5
        "sum": (5, 5, 40, 500),
        "even_pair": (5, 2, 40, 500),
        "mod_arith": (8, 5, 39, 499),
        "cycle_navigation": (3, 5, 40, 500),
        "parity": (2, 2, 40, 500),
    }
    assert set(TASK_NAMES) == set(expected)
    for name, sizes in expected.items():
        task = get_task(name)
        assert isinstance(task, RegularTask) and task.name == name
        assert (task.vocab_size, task.num_classes, task.train_length, task.test_length) == sizes
    assert get_task("parity", 7).modulus == 2
    assert (get_task("sum", 2).vocab_size, get_task("sum", 2).num_classes) == (2, 2)


# ----------------------------------------------------------------------------- seeding
@pytest.mark.parametrize("name", TASK_NAMES)
def test_deterministic_given_seed_and_seeds_differ(name):
    task = get_task(name)
    length = task.train_length
    a = task.sample(32, length, _gen(7))
    b = task.sample(32, length, _gen(7))
    c = task.sample(32, length, _gen(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    gen = _gen(7)
    first, second = task.sample(32, length, gen), task.sample(32, length, gen)
    assert torch.equal(first[0], a[0]) and not torch.equal(first[0], second[0])


def test_fixed_test_set():
    task = get_task("mod_arith")
    tokens, labels = fixed_test_set(task, num_sequences=50)
    assert tokens.shape == labels.shape == (50, 499)
    again = fixed_test_set(task, num_sequences=50)
    assert torch.equal(tokens, again[0]) and torch.equal(labels, again[1])
    assert not torch.equal(tokens, fixed_test_set(task, num_sequences=50, seed=1)[0])
    assert fixed_test_set(get_task("sum"), num_sequences=3, length=7)[0].shape == (3, 7)
    default_tokens, _labels = fixed_test_set(get_task("parity"))
    assert default_tokens.shape == (2000, 500)


# ----------------------------------------------------------------------------- bad arguments
def test_bad_arguments_raise():
    with pytest.raises(ValueError, match=r"unknown regular task.*'sum'"):
        get_task("summ")
    with pytest.raises(ValueError, match="modulus"):
        get_task("sum", 1)
    with pytest.raises(ValueError, match="modulus"):
        reference_labels("sum", [0, 1], 0)
    with pytest.raises(ValueError, match="unknown regular task"):
        reference_labels("nope", [0])
    with pytest.raises(ValueError, match="length"):
        get_task("mod_arith").sample(2, 40, _gen(0))
    with pytest.raises(ValueError, match="length"):
        reference_labels("mod_arith", [1, 5])
    with pytest.raises(ValueError, match="length"):
        get_task("sum").sample(2, 0, _gen(0))
    with pytest.raises(ValueError, match="batch_size"):
        get_task("sum").sample(-1, 4, _gen(0))
    with pytest.raises(ValueError, match="num_sequences"):
        fixed_test_set(get_task("sum"), num_sequences=0)
    with pytest.raises(ValueError, match="no supervised"):
        last_supervised_label(torch.tensor([[1, 2], [IGNORE_INDEX, IGNORE_INDEX]]))
    with pytest.raises(ValueError, match="2-D"):
        last_supervised_label(torch.tensor([1, 2]))
