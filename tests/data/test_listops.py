"""ssmhub.data.listops: hand-computed values and SubTrees tags, the LRA release's limits, seeded splits."""

from __future__ import annotations

import random

import pytest

from ssmhub.data.listops import (
    CLOSE,
    LISTOPS,
    LISTOPS_SUBTREES,
    OPERATORS,
    VOCABULARY,
    ListOpsSpec,
    apply_operator,
    draw_tree,
    generate_listops,
    listops_splits,
    listops_value,
    parse_listops,
    tree_tokens,
)

IGNORED = -100


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
        ("[MIN 4 [MAX 0 9 ] ]", 4),
        ("[SM 9 9 9 ]", 7),  # 27 mod 10
        ("[SM 5 5 ]", 0),
        ("[MED 3 8 1 ]", 3),
        ("[MED 1 2 7 9 ]", 4),  # (2 + 7) / 2 = 4.5, truncated as int(np.median(...))
        ("[MED 1 2 ]", 1),
        ("[MAX 2 6 [MED [SM 3 1 6 ] 8 3 ] 4 5 ]", 6),  # paper 000 §3.4's example
        ("7", 7),
        ("( ( ( [MAX 2 ) 9 ) ] )", 9),  # the release's file form, with its parentheses
    ],
)
def test_hand_computed_values(text, value):
    assert listops_value(text) == value


def test_subtree_tags_of_the_papers_example():
    """Paper 000 §3.4: ``[MAX 2 6 [MED [SM 3 1 6 ] 8 3 ] 4 5 ]`` is tagged ``- - - - - - - - 0 - - 3 - - 6``."""
    tokens, tags, value = tree_tokens(parse_listops("[MAX 2 6 [MED [SM 3 1 6 ] 8 3 ] 4 5 ]"))
    assert " ".join(tokens) == "[MAX 2 6 [MED [SM 3 1 6 ] 8 3 ] 4 5 ]"
    assert " ".join("-" if tag == IGNORED else str(tag) for tag in tags) == "- - - - - - - - 0 - - 3 - - 6"
    assert value == 6


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[MAX 2 3", "never closes"),
        ("[MAX 2 ] 3", "after its expression"),
        ("[MAX 12 ]", "unknown token"),
        ("[MAX ]", "at least one argument"),
        ("", "ends inside"),
    ],
)
def test_bad_expressions_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        listops_value(text)


def test_unknown_operator_is_refused_by_name():
    with pytest.raises(ValueError, match="operator must be one of"):
        apply_operator("[FIRST", [1, 2])


def test_lra_release_limits_and_sizes():
    assert OPERATORS == ("[MIN", "[MAX", "[MED", "[SM")
    assert (LISTOPS.max_depth, LISTOPS.max_args, LISTOPS.min_length, LISTOPS.max_length) == (10, 10, 500, 2000)
    assert (LISTOPS.num_train, LISTOPS.num_validation, LISTOPS.num_test) == (96_000, 2_000, 2_000)
    assert len(VOCABULARY) == 17 and VOCABULARY[0] == "<pad>"
    assert (LISTOPS_SUBTREES.min_length, LISTOPS_SUBTREES.max_length, LISTOPS_SUBTREES.subtrees) == (7000, 8192, True)


def _depth_and_widths(tree, depth=1):
    """(deepest operator level, argument counts) of a tree; a root operator is at depth 1."""
    if isinstance(tree, int):
        return 0, []
    _, arguments = tree
    below = [_depth_and_widths(argument, depth + 1) for argument in arguments]
    return max([depth] + [d for d, _ in below]), [len(arguments)] + [w for _, ws in below for w in ws]


def test_drawn_trees_keep_depth_and_argument_limits():
    rng = random.Random(3)
    for _ in range(200):
        tree, length = draw_tree(rng, max_depth=4, max_args=3)
        tokens, _, _ = tree_tokens(tree)
        assert length == len(tokens)
        depth, widths = _depth_and_widths(tree)
        assert depth <= 3  # a node at max_depth is always a digit
        assert all(2 <= width <= 3 for width in widths)


def test_generated_examples_are_seeded_distinct_and_within_lengths():
    spec = ListOpsSpec(max_depth=6, max_args=4, min_length=20, max_length=60)
    examples = list(generate_listops(40, spec, seed=1))
    assert examples == list(generate_listops(40, spec, seed=1))
    assert examples[:10] == list(generate_listops(10, spec, seed=1))
    assert examples != list(generate_listops(40, spec, seed=2))
    assert len({example["text"] for example in examples}) == 40
    for example in examples:
        tokens = example["text"].split()
        assert 20 < len(tokens) < 60
        assert set(tokens) <= set(VOCABULARY[2:])
        assert example["label"] == listops_value(example["text"])


def test_default_spec_gives_lra_lengths():
    for example in generate_listops(5, seed=0):
        assert 500 < len(example["text"].split()) < 2000


def test_splits_have_the_spec_sizes_and_share_nothing():
    spec = ListOpsSpec(
        max_depth=5, max_args=4, min_length=10, max_length=40, num_train=30, num_validation=5, num_test=6
    )
    splits = listops_splits(spec, seed=0)
    assert {name: len(rows) for name, rows in splits.items()} == {"train": 30, "validation": 5, "test": 6}
    texts = [{row["text"] for row in rows} for rows in splits.values()]
    assert not (texts[0] & texts[1] or texts[0] & texts[2] or texts[1] & texts[2])


def _closing_values(tokens):
    """An independent oracle: the value of the expression each ``]`` closes, by matching brackets."""
    values, opens = {}, []
    for position, token in enumerate(tokens):
        if token in OPERATORS:
            opens.append(position)
        elif token == CLOSE:
            start = opens.pop()
            values[position] = listops_value(" ".join(tokens[start : position + 1]))
    return values


def test_subtrees_flag_tags_every_closing_bracket():
    spec = ListOpsSpec(max_depth=6, max_args=5, min_length=30, max_length=80, subtrees=True)
    for example in generate_listops(20, spec, seed=4):
        tokens, tags = example["text"].split(), example["subtree_labels"]
        assert len(tags) == len(tokens)
        expected = _closing_values(tokens)
        assert {i: tag for i, tag in enumerate(tags) if tag != IGNORED} == expected
        assert tags[-1] == example["label"]
    assert "subtree_labels" not in next(generate_listops(1, ListOpsSpec(min_length=5, max_length=50)))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"max_args": 1}, "max_args"),
        ({"max_depth": 0}, "max_depth"),
        ({"min_length": 10, "max_length": 11}, "max_length"),
        ({"num_test": -1}, "num_test"),
        ({"num_train": 2.5}, "num_train"),
    ],
)
def test_bad_spec_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ListOpsSpec(**kwargs)


def test_listops_tokenizer_reads_both_forms():
    from ssmhub.data.listops_hf import listops_tokenizer

    tokenizer = listops_tokenizer()
    assert len(tokenizer) == 17 and tokenizer.pad_token_id == 0
    ids = tokenizer("[MAX 2 9 ]")["input_ids"]
    assert ids == tokenizer("( ( ( [MAX 2 ) 9 ) ] )")["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == ["[MAX", "2", "9", "]"]


def test_duplicates_are_dropped_until_every_expression_is_drawn():
    """Depth 2, two arguments, length 4: exactly the 4 x 10 x 10 expressions ``[OP a b ]``, all of them."""
    spec = ListOpsSpec(max_depth=2, max_args=2, min_length=3, max_length=5)
    texts = [example["text"] for example in generate_listops(400, spec, seed=0)]
    assert len(texts) == len(set(texts)) == 400
