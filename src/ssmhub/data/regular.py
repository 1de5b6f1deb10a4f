"""Regular-language transduction tasks: Sum(M), EvenPair(M), ModArith(M), CycleNavigation and Parity.

Exact, seeded generators for the tasks of Fan, Chi & Rudnicky, *Advancing Regular Language Reasoning
in Linear RNNs* (arXiv:2309.07412, §4.1-4.2, Table 1), which take them from Deletang et al. 2023,
*Neural Networks and the Chomsky Hierarchy* (ICLR'23). Tokens are i.i.d. uniform; every sequence in
a batch has the same length; every label is a *per-token* label of the running answer (the answer
for the prefix that ends at that token), and the full-sequence answer is the label at the last
supervised position (:func:`last_supervised_label`). Positions without a label hold
:data:`IGNORE_INDEX` (``-100``, what ``torch.nn.functional.cross_entropy`` ignores).

Tasks (``M`` is ``modulus``; ``s_t`` is the token at position ``t = 0..n-1``):

``sum``  (Sum(M); the paper's ``cycle_task``)
    tokens ``0..M-1``; ``y_t = (s_0 + ... + s_t) mod M``; ``M`` classes. Sum(2) is PARITY.
    Example (M=5): ``0 3 2 4 -> 0 3 0 4``.
``even_pair``  (EvenPair(M); the paper's ``pair_task``)
    tokens ``0..M-1``; ``y_t = 1 if s_t == s_0 else 0`` (so ``y_0 = 1``); 2 classes.
    Example: ``0 3 2 0 -> 1 0 0 1``.
``mod_arith``  (ModArith(M) without brackets; the paper's ``arith_task_original``)
    odd length ``n``; numbers ``0..M-1`` at even positions, operators at odd positions with ids
    ``M`` = ``+``, ``M+1`` = ``-``, ``M+2`` = ``×``. The label at a number position is the value of
    the expression up to and including that number, mod M (non-negative), with ``×`` binding
    tighter than ``+`` and ``-``; operator positions hold ``-100``. ``M + 3`` token ids, ``M``
    classes. Example (M=5): ``1 + 2 - 3 × 4 -> 1 . 3 . 0 . 1`` (``1+2-12 = -9 ≡ 1``).
``cycle_navigation``  (Deletang et al.'s CycleNavigation, ``tasks/regular/cycle_navigation.py``)
    tokens ``0, 1, 2`` are the moves ``-1`` (left), ``0`` (stay), ``+1`` (right), i.e. move = token - 1,
    on a cycle of ``M`` positions (Deletang: 5, the default) starting at position 0;
    ``y_t = (Σ_{i≤t} (s_i - 1)) mod M``; ``M`` classes. Deletang's example ``1 -1 0 -1 -1 -> class 3``
    is the token string ``2 0 1 0 0`` here, with labels ``1 0 0 4 3``.
``parity``  (Deletang et al.'s ParityCheck, ``tasks/regular/parity_check.py``)
    tokens ``0, 1``; ``y_t`` = number of 1s in ``s_0..s_t`` mod 2; 2 classes (``modulus`` is not
    used). Example: ``1 0 1 0 1 0 0 -> 1 1 0 0 1 1 1``.

Deletang et al. score only the final answer; here every prefix is labelled. Train / test lengths are the
paper's (§4.2, Table 1: 40 / 500; 39 / 499 for ModArith, which needs odd lengths); the online sampling and
the last-position metric are those of the authors' code (github.com/tinghanf/RegluarLRNN). The Deletang
tasks use 40 / 500, their training and largest test lengths.

:func:`reference_labels` is a slow pure-Python oracle written from the definitions above and
independently of the vectorized generators.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "IGNORE_INDEX",
    "TASK_NAMES",
    "RegularTask",
    "fixed_test_set",
    "get_task",
    "last_supervised_label",
    "last_supervised_position",
    "reference_labels",
]

IGNORE_INDEX = -100
TASK_NAMES: tuple[str, ...] = ("sum", "even_pair", "mod_arith", "cycle_navigation", "parity")

# name -> (train length, test length); Table 1 of the paper, 40 / 500 for the Deletang tasks.
_LENGTHS = {
    "sum": (40, 500),
    "even_pair": (40, 500),
    "mod_arith": (39, 499),
    "cycle_navigation": (40, 500),
    "parity": (40, 500),
}


def _check_name(name: str) -> None:
    if name not in TASK_NAMES:
        raise ValueError(f"unknown regular task {name!r}; expected one of {list(TASK_NAMES)}")


def _check_modulus(modulus: int) -> None:
    if isinstance(modulus, bool) or not isinstance(modulus, int) or modulus < 2:
        raise ValueError(f"modulus must be an integer >= 2, got {modulus!r}")


@dataclass(frozen=True)
class RegularTask:
    """One regular transduction task: its sizes, its Table 1 lengths and a seeded batch sampler.

    ``modulus`` is M for ``sum``, ``even_pair`` and ``mod_arith``, the cycle length for
    ``cycle_navigation``, and 2 for ``parity``. Build with :func:`get_task`.
    """

    name: str
    vocab_size: int
    num_classes: int
    train_length: int
    test_length: int
    modulus: int

    def sample(
        self, batch_size: int, length: int, generator: torch.Generator
    ) -> tuple[torch.LongTensor, torch.LongTensor]:
        """Sample ``batch_size`` sequences of ``length`` tokens and their per-token labels.

        The tensors are made on ``generator.device`` and depend only on the generator's state.

        Returns:
            ``(input_ids, labels)``, both int64 of shape ``(batch_size, length)``; ``labels`` is
            :data:`IGNORE_INDEX` where a position is not supervised (ModArith operators).

        Raises:
            ValueError: ``batch_size`` < 0, ``length`` < 1, or an even ``length`` for ``mod_arith``.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
            raise ValueError(f"batch_size must be an integer >= 0, got {batch_size!r}")
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"length must be an integer >= 1, got {length!r}")
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        m = self.modulus
        kw = {"generator": generator, "device": generator.device, "dtype": torch.long}
        shape = (batch_size, length)

        if self.name in ("sum", "parity"):
            tokens = torch.randint(0, m, shape, **kw)
            return tokens, tokens.cumsum(dim=1) % m
        if self.name == "even_pair":
            tokens = torch.randint(0, m, shape, **kw)
            return tokens, (tokens == tokens[:, :1]).long()
        if self.name == "cycle_navigation":
            tokens = torch.randint(0, 3, shape, **kw)
            return tokens, torch.remainder((tokens - 1).cumsum(dim=1), m)
        if self.name == "mod_arith":
            return self._sample_mod_arith(batch_size, length, kw)
        raise AssertionError(f"unhandled task {self.name!r}")  # get_task only builds known names

    def _sample_mod_arith(self, batch_size: int, length: int, kw: dict) -> tuple[torch.Tensor, torch.Tensor]:
        if length % 2 == 0:
            raise ValueError(f"length must be odd for mod_arith (numbers and operators alternate), got {length}")
        m = self.modulus
        n_nums = (length + 1) // 2
        nums = torch.randint(0, m, (batch_size, n_nums), **kw)
        ops = torch.randint(m, m + 3, (batch_size, n_nums - 1), **kw)

        # Left to right over the numbers, vectorized over the batch: ``done`` is the sum of the
        # finished terms and ``term`` the signed product of the current one, both kept mod M.
        answers = torch.empty_like(nums)
        done = torch.zeros_like(nums[:, 0])
        term = nums[:, 0].clone()
        answers[:, 0] = term
        for j in range(1, n_nums):
            op, num = ops[:, j - 1], nums[:, j]
            is_mul = op == m + 2
            done = torch.where(is_mul, done, (done + term) % m)
            new_term = torch.where(op == m, num, torch.remainder(-num, m))
            term = torch.where(is_mul, (term * num) % m, new_term)
            answers[:, j] = (done + term) % m

        tokens = torch.empty((batch_size, length), dtype=torch.long, device=nums.device)
        tokens[:, 0::2] = nums
        tokens[:, 1::2] = ops
        labels = torch.full_like(tokens, IGNORE_INDEX)
        labels[:, 0::2] = answers
        return tokens, labels


def get_task(name: str, modulus: int = 5) -> RegularTask:
    """The task ``name`` (one of :data:`TASK_NAMES`) with modulus / cycle length ``modulus``.

    ``parity`` always uses 2 (``modulus`` is only checked). Raises ValueError for an unknown
    ``name`` or a ``modulus`` below 2.
    """
    _check_name(name)
    _check_modulus(modulus)
    train_length, test_length = _LENGTHS[name]
    if name == "parity":
        modulus = 2
    if name in ("sum", "parity"):
        vocab_size, num_classes = modulus, modulus
    elif name == "even_pair":
        vocab_size, num_classes = modulus, 2
    elif name == "mod_arith":
        vocab_size, num_classes = modulus + 3, modulus
    else:  # cycle_navigation
        vocab_size, num_classes = 3, modulus
    return RegularTask(name, vocab_size, num_classes, train_length, test_length, modulus)


def fixed_test_set(
    task: RegularTask, num_sequences: int = 2000, length: int | None = None, seed: int = 1234
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """A fixed test set: ``task.sample`` on a CPU generator seeded with ``seed``.

    ``length`` defaults to ``task.test_length``. The same arguments always give the same tensors.
    """
    if isinstance(num_sequences, bool) or not isinstance(num_sequences, int) or num_sequences < 1:
        raise ValueError(f"num_sequences must be an integer >= 1, got {num_sequences!r}")
    generator = torch.Generator().manual_seed(seed)
    return task.sample(num_sequences, task.test_length if length is None else length, generator)


def last_supervised_position(labels: torch.Tensor) -> torch.LongTensor:
    """Index of each row's last supervised (not ``-100``) position, shape ``(batch,)``.

    Raises ValueError if ``labels`` is not 2-D or a row has no supervised position.
    """
    if labels.dim() != 2:
        raise ValueError(f"labels must be 2-D (batch, length), got shape {tuple(labels.shape)}")
    supervised = labels != IGNORE_INDEX
    if labels.shape[1] == 0 or not bool(supervised.any(dim=1).all()):
        raise ValueError("labels has a row with no supervised position (all -100)")
    positions = torch.arange(labels.shape[1], device=labels.device).expand_as(labels)
    return torch.where(supervised, positions, -1).max(dim=1).values


def last_supervised_label(labels: torch.Tensor) -> torch.LongTensor:
    """Each row's label at its last supervised position (the full-sequence answer), shape ``(batch,)``.

    Raises ValueError if ``labels`` is not 2-D or a row has no supervised position.
    """
    last = last_supervised_position(labels)
    return labels.gather(1, last.unsqueeze(1)).squeeze(1).long()


def reference_labels(task_name: str, tokens: Sequence[int], modulus: int = 5) -> list[int | None]:
    """Slow pure-Python labels of one token sequence, straight from the definitions (a test oracle).

    Returns one entry per token: the running answer, or None where no label exists (ModArith
    operators). ``modulus`` is ignored for ``parity``.
    """
    _check_name(task_name)
    _check_modulus(modulus)
    tokens = [int(t) for t in tokens]
    m = modulus
    out: list[int | None] = []
    if task_name == "sum":
        for t in range(len(tokens)):
            out.append(sum(tokens[: t + 1]) % m)
    elif task_name == "parity":
        for t in range(len(tokens)):
            out.append(tokens[: t + 1].count(1) % 2)
    elif task_name == "even_pair":
        for t in range(len(tokens)):
            out.append(1 if tokens[t] == tokens[0] else 0)
    elif task_name == "cycle_navigation":
        position = 0
        for token in tokens:
            position = (position + {0: -1, 1: 0, 2: +1}[token]) % m
            out.append(position)
    else:  # mod_arith
        if len(tokens) % 2 == 0:
            raise ValueError(f"length must be odd for mod_arith, got {len(tokens)}")
        symbols = {m: "+", m + 1: "-", m + 2: "*"}
        for t in range(len(tokens)):
            if t % 2 == 1:
                out.append(None)
                continue
            # Evaluate the prefix as text: split into +/- terms, each term a product of numbers.
            text = "".join(str(tok) if i % 2 == 0 else symbols[tok] for i, tok in enumerate(tokens[: t + 1]))
            total, sign = 0, 1
            for piece in _split_terms(text):
                if piece in "+-":
                    sign = 1 if piece == "+" else -1
                    continue
                value = 1
                for factor in piece.split("*"):
                    value *= int(factor)
                total += sign * value
            out.append(total % m)
    return out


def _split_terms(text: str) -> list[str]:
    """``"1+2*3-4"`` -> ``["1", "+", "2*3", "-", "4"]``."""
    pieces: list[str] = []
    current = ""
    for char in text:
        if char in "+-":
            pieces += [current, char]
            current = ""
        else:
            current += char
    pieces.append(current)
    return pieces
