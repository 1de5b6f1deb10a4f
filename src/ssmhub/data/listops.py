"""ListOps as the Long Range Arena released it, and the ListOps-SubTrees tagging variant.

LRA's ListOps (Tay et al. 2021, *Long Range Arena*, arXiv:2011.04006, §3.1; the generator
``lra_benchmarks/data/listops.py`` of its release; the task is Nangia & Bowman 2018's) asks for the value
(a digit, 10 classes) of a nested prefix expression such as ``[MAX 2 9 [MIN 4 7 ] 0 ]`` (= 9):

- operators ``[MIN``, ``[MAX``, ``[MED`` (the median, truncated to an integer as ``int(np.median(...))``
  does: ``[MED 1 2 7 9 ]`` is 4) and ``[SM`` (sum modulo 10); ``]`` closes an operator; values 0-9;
- a tree is drawn top-down from depth 1: below ``max_depth`` a node is an operator with probability
  :data:`OPERATOR_PROBABILITY` (0.25), else a uniform digit; at ``max_depth`` it is a digit; an operator
  takes a uniform number of arguments in ``2..max_args`` and then a uniform operator;
- an expression is kept when its length (operators, closing brackets and digits) lies strictly between
  ``min_length`` and ``max_length``; duplicates are dropped; the release's defaults are ``max_depth`` 10,
  ``max_args`` 10, lengths 500-2,000 and 96,000 / 2,000 / 2,000 train / validation / test expressions.

The release's files write the parentheses of its nested-pair representation (``( ( [MAX 2 ) 9 ) ...``);
its input pipeline drops them, so a sequence is exactly the counted tokens. Here the text carries no
parentheses, and :func:`parse_listops` reads either form (the release's ``.tsv`` files included).

ListOps-SubTrees (Gupta, Mehta & Berant, *Simplifying and Understanding State Space Models with Diagonal
Linear RNNs*, arXiv:2212.00768, §3.4) tags every closing bracket with the value of the sub-expression it
closes; every other position is :data:`IGNORE_INDEX`. The paper's
example: ``[MAX 2 6 [MED [SM 3 1 6 ] 8 3 ] 4 5 ]`` is tagged ``- - - - - - - - 0 - - 3 - - 6``. Its
expressions are 7,000-8,192 tokens long (the authors' script: ``--max_args 9 --max_depth 15``), 96/2/2
thousand: :data:`LISTOPS_SUBTREES`.

A tree is a digit (``int``) or an ``(operator, [arguments])`` pair. Drawing follows the release's order
of random calls, so a ``random.Random`` seeded alike draws the same trees.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from .regular import IGNORE_INDEX

__all__ = [
    "CLOSE",
    "LISTOPS",
    "LISTOPS_SUBTREES",
    "NUM_CLASSES",
    "OPERATORS",
    "OPERATOR_PROBABILITY",
    "VOCABULARY",
    "ListOpsSpec",
    "apply_operator",
    "draw_tree",
    "generate_listops",
    "listops_example",
    "listops_splits",
    "listops_value",
    "parse_listops",
    "tree_tokens",
]

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")  # the release's order, which its random.choice draws from
CLOSE = "]"
NUM_CLASSES = 10  # the values 0-9
OPERATOR_PROBABILITY = 0.25  # the release's VALUE_P: a node below max_depth is an operator when r <= 0.25
# Token ids: padding 0, unknown 1, then the 15 tokens the release's pipeline keeps (17 ids, as its encoder's
# vocabulary size: padding, the 15 tokens and one out-of-vocabulary id; the order here is fixed, not by count).
VOCABULARY = ("<pad>", "<unk>", *(str(digit) for digit in range(10)), *OPERATORS, CLOSE)


@dataclass(frozen=True)
class ListOpsSpec:
    """The limits and split sizes of a ListOps data set (defaults: the LRA release's flags).

    ``min_length`` and ``max_length`` are exclusive, as in the release (``min_length < length < max_length``).
    ``subtrees`` adds the ListOps-SubTrees tags (``subtree_labels``) to every example.
    """

    max_depth: int = 10
    max_args: int = 10
    min_length: int = 500
    max_length: int = 2000
    num_train: int = 96_000
    num_validation: int = 2_000
    num_test: int = 2_000
    subtrees: bool = False

    def __post_init__(self):
        for name in ("max_depth", "max_length", "num_train"):
            _check_int(name, getattr(self, name), 1)
        _check_int("max_args", self.max_args, 2)
        _check_int("min_length", self.min_length, 0)
        _check_int("num_validation", self.num_validation, 0)
        _check_int("num_test", self.num_test, 0)
        if self.max_length - self.min_length < 2:
            raise ValueError(
                f"max_length ({self.max_length}) must exceed min_length ({self.min_length}) by at least 2: "
                "both are exclusive"
            )

    @property
    def num_examples(self) -> int:
        """Train, validation and test expressions together."""
        return self.num_train + self.num_validation + self.num_test


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")


LISTOPS = ListOpsSpec()
LISTOPS_SUBTREES = ListOpsSpec(max_depth=15, max_args=9, min_length=7000, max_length=8192, subtrees=True)


def apply_operator(operator: str, values: list[int]) -> int:
    """The value of ``operator`` (one of :data:`OPERATORS`) on the digits ``values``."""
    if not values:
        raise ValueError(f"operator {operator} needs at least one argument; got none")
    if operator == "[MIN":
        return min(values)
    if operator == "[MAX":
        return max(values)
    if operator == "[MED":
        ordered, middle = sorted(values), len(values) // 2
        # int(np.median(...)) of the release: the mean of the two middle values, truncated (values are >= 0)
        return ordered[middle] if len(values) % 2 else (ordered[middle - 1] + ordered[middle]) // 2
    if operator == "[SM":
        return sum(values) % 10
    raise ValueError(f"operator must be one of {OPERATORS}; got {operator!r}")


def draw_tree(rng: random.Random, max_depth: int, max_args: int, depth: int = 1) -> tuple[object, int]:
    """A random tree and its length in tokens, drawn as the release's ``generate_tree`` draws it."""
    r = rng.random() if depth < max_depth else 1.0
    if r > OPERATOR_PROBABILITY:
        return rng.choice(range(10)), 1
    length = 2  # the operator and its closing bracket
    arguments = []
    for _ in range(rng.randint(2, max_args)):
        argument, argument_length = draw_tree(rng, max_depth, max_args, depth + 1)
        arguments.append(argument)
        length += argument_length
    return (rng.choice(OPERATORS), arguments), length


def _flatten(tree, tokens: list[str], tags: list[int]) -> int:
    """Append ``tree``'s tokens and SubTrees tags to the lists; return its value."""
    if isinstance(tree, int):
        tokens.append(str(tree))
        tags.append(IGNORE_INDEX)
        return tree
    operator, arguments = tree
    tokens.append(operator)
    tags.append(IGNORE_INDEX)
    value = apply_operator(operator, [_flatten(argument, tokens, tags) for argument in arguments])
    tokens.append(CLOSE)
    tags.append(value)
    return value


def tree_tokens(tree) -> tuple[list[str], list[int], int]:
    """``(tokens, subtree_labels, value)`` of a tree: its prefix notation without parentheses, the value
    of every sub-expression at its closing bracket (:data:`IGNORE_INDEX` elsewhere), and its value."""
    tokens: list[str] = []
    tags: list[int] = []
    value = _flatten(tree, tokens, tags)
    return tokens, tags, value


def listops_example(tree, subtrees: bool = False) -> dict:
    """The example of a tree: ``{"text", "label"}``, plus ``"subtree_labels"`` (one per token of the
    whitespace-separated ``text``) when ``subtrees``."""
    tokens, tags, value = tree_tokens(tree)
    example = {"text": " ".join(tokens), "label": value}
    if subtrees:
        example["subtree_labels"] = tags
    return example


def generate_listops(num_examples: int, spec: ListOpsSpec = LISTOPS, seed: int = 0) -> Iterator[dict]:
    """``num_examples`` distinct ListOps examples (see :func:`listops_example`) within ``spec``'s limits.

    Seeded and exact: the same ``(spec, seed)`` gives the same examples in the same order, and the first
    ``n`` examples of a longer run are those of a shorter one. ``spec``'s split sizes are not used here.
    """
    _check_int("num_examples", num_examples, 0)
    rng, seen = random.Random(seed), set()
    while len(seen) < num_examples:
        tree, length = draw_tree(rng, spec.max_depth, spec.max_args)
        if spec.min_length < length < spec.max_length:
            example = listops_example(tree, spec.subtrees)
            if example["text"] not in seen:
                seen.add(example["text"])
                yield example


def listops_splits(spec: ListOpsSpec = LISTOPS, seed: int = 0) -> dict[str, list[dict]]:
    """``{"train", "validation", "test"}`` lists of ``spec``'s sizes, cut in that order from one seeded
    stream of distinct expressions (as the release cuts its set), so no expression is in two splits."""
    examples = list(generate_listops(spec.num_examples, spec, seed))
    first, second = spec.num_train, spec.num_train + spec.num_validation
    return {"train": examples[:first], "validation": examples[first:second], "test": examples[second:]}


def parse_listops(text: str):
    """The tree of an expression: tokens separated by whitespace; parentheses (the release's files) are
    ignored. Raises ValueError naming ``text``'s problem (an unknown token, an unbalanced bracket)."""
    tokens = text.replace("(", " ").replace(")", " ").split()
    tree, end = _parse(tokens, 0)
    if end != len(tokens):
        raise ValueError(f"text has tokens after its expression, from position {end}: {tokens[end:][:5]}")
    return tree


def _parse(tokens: list[str], position: int):
    """The sub-tree starting at ``tokens[position]`` and the position after it."""
    if position >= len(tokens):
        raise ValueError("text ends inside an expression (a missing ']'?)")
    token = tokens[position]
    if token.isdigit() and len(token) == 1:
        return int(token), position + 1
    if token not in OPERATORS:
        raise ValueError(f"text has an unknown token {token!r} at position {position}")
    start, arguments, position = position, [], position + 1
    while position < len(tokens) and tokens[position] != CLOSE:
        argument, position = _parse(tokens, position)
        arguments.append(argument)
    if position >= len(tokens):
        raise ValueError(f"text never closes the {token} at its token {start} (a missing ']')")
    return (token, arguments), position + 1


def listops_value(text: str) -> int:
    """The value of a ListOps expression (either form, see :func:`parse_listops`)."""
    return tree_tokens(parse_listops(text))[2]
