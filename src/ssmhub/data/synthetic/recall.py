"""Token-recall tasks: multi-query associative recall, associative recall and induction heads.

Each task gives ``(input_ids, labels)`` of shape ``(B, L)``. A label is the token the model must
predict *at that position* (the value recalled there), so a causal token classifier (or a causal LM
whose logits at position t are scored against ``labels[:, t]``, no shift) is trained with cross
entropy at the labelled positions; every other position holds :data:`IGNORE_INDEX` (-100).

``mqar``  (Arora, Eyuboglu et al. 2023, *Zoology*, §3; ``zoology/data/associative_recall.py``)
    V = ``vocab_size`` (8192), P = ``num_kv_pairs``, L even with 4P ≤ L. Keys are P distinct tokens
    of 1..V/2−1, values P distinct tokens of V/2..V−1. The sequence opens with the pairs
    ``k_1 v_1 … k_P v_P``; then each key is asked once, at position ``2P + 2g`` where the gaps
    g (P distinct values of 0..(L−2P)/2−1) are drawn without replacement with probability
    ∝ ``a·g'^{a−1}``, ``g' = g + 1``, a = ``power_a`` = 0.01 (a power law: short gaps are likely).
    The label at a query is its key's value. With ``random_non_queries`` (default, as Zoology) every
    other position of the query region holds a uniform token of 0..V−1, else 0. Zoology's example
    (V = 12, keys 2, 4, values 8, 7, gaps 4, 1, L = 16, no random fill)::

        inputs  2 8 4 7 0 0 4 0 0 0 0 0 2 0 0 0
        labels  . . . . . . 7 . . . . . 8 . . .

``associative_recall``  (the classic single-query task of H3, Fu, Dao et al. 2023, §3.1; safari's
``generate_assoc_recall`` with one-token keys)
    L even, n = (L − 2)/2 pairs. Tokens 0..V−2 are ordinary, V−1 is the separator S. Keys are
    0..K−1 and values K..V−2 with K = ⌊(V−1)/2⌋; each sequence draws its own key→value map, then n
    keys uniformly *with* replacement (a repeated key keeps its value). The sequence is
    ``k_1 v_1 … k_n v_n S q`` with q the key of a uniformly chosen pair; the only label is at the
    last position: q's value. Example: pairs (0, 5) (2, 7) (1, 6) (3, 4), query pair 0, S = 8::

        inputs  0 5 2 7 1 6 3 4 8 0
        labels  . . . . . . . . . 5

``induction_head``  (H3 §3.1; safari's ``generate_induction_head`` with one trigger)
    Tokens 0..V−2 uniform, S = V−1. S is written at a position p uniform in 0..L−4 and at L−1;
    the only label is at L−1: the token after the first S. Example (S = 9, p = 2)::

        inputs  4 1 9 7 3 0 9
        labels  . . . . . . 7

The ``assemble_*`` functions build a batch from given choices, so that hand-written examples can
check them; :class:`TokenTask` draws the choices from a ``torch.Generator``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "IGNORE_INDEX",
    "TOKEN_TASK_NAMES",
    "TokenTask",
    "assemble_associative_recall",
    "assemble_induction_head",
    "assemble_mqar",
    "get_token_task",
    "mqar_gap_probabilities",
]

IGNORE_INDEX = -100
TOKEN_TASK_NAMES: tuple[str, ...] = ("mqar", "associative_recall", "induction_head")


def mqar_gap_probabilities(space: int, power_a: float = 0.01) -> torch.Tensor:
    """Zoology's power law over the gaps 0..space−1: ``p_g ∝ a·(g+1)^{a−1}``, normalized, float64."""
    ranks = torch.arange(1, space + 1, dtype=torch.float64)
    weights = power_a * ranks ** (power_a - 1)
    return weights / weights.sum()


def assemble_mqar(
    keys: torch.Tensor, values: torch.Tensor, gaps: torch.Tensor, seq_len: int, fill: torch.Tensor | None = None
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """An MQAR batch from its choices: ``keys``, ``values``, ``gaps`` all (B, P) -> (input_ids, labels) (B, L).

    Pairs at 0..2P−1, key i asked at ``2P + 2·gaps_i`` with label ``values_i``. Positions that are
    neither pairs nor queries take ``fill`` (B, L) when given, else 0.
    """
    batch, pairs = keys.shape
    context = 2 * pairs
    input_ids = torch.zeros(batch, seq_len, dtype=torch.long, device=keys.device)
    input_ids[:, 0:context:2] = keys
    input_ids[:, 1:context:2] = values
    query_positions = context + 2 * gaps  # (B, P)
    input_ids.scatter_(1, query_positions, keys)
    labels = torch.full_like(input_ids, IGNORE_INDEX).scatter_(1, query_positions, values)
    if fill is not None:
        free = torch.ones_like(input_ids, dtype=torch.bool)
        free[:, :context] = False
        free.scatter_(1, query_positions, False)
        input_ids = torch.where(free, fill, input_ids)
    return input_ids, labels


def assemble_associative_recall(
    pair_keys: torch.Tensor, pair_values: torch.Tensor, query_index: torch.Tensor, separator: int
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """``k_1 v_1 … k_n v_n S q`` from ``pair_keys``, ``pair_values`` (B, n) and ``query_index`` (B,).

    The label at the last position is the value of the queried pair; the rest is ``-100``.
    """
    batch, n = pair_keys.shape
    rows = torch.arange(batch, device=pair_keys.device)
    input_ids = torch.empty(batch, 2 * n + 2, dtype=torch.long, device=pair_keys.device)
    input_ids[:, 0 : 2 * n : 2] = pair_keys
    input_ids[:, 1 : 2 * n : 2] = pair_values
    input_ids[:, -2] = separator
    input_ids[:, -1] = pair_keys[rows, query_index]
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[:, -1] = pair_values[rows, query_index]
    return input_ids, labels


def assemble_induction_head(
    tokens: torch.Tensor, trigger_position: torch.Tensor, trigger: int
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Write the trigger S at ``trigger_position`` (B,) and at the end of ``tokens`` (B, L).

    The label at L−1 is the token after the first S; the rest is ``-100``.
    """
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    input_ids = tokens.clone()
    input_ids[rows, trigger_position] = trigger
    input_ids[:, -1] = trigger
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[:, -1] = input_ids[rows, trigger_position + 1]
    return input_ids, labels


def _distinct(batch: int, low: int, high: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """(batch, count) distinct tokens drawn uniformly from low..high−1, in random order.

    The positions of the ``count`` smallest of ``high − low`` uniform scores, smallest first: what
    ``scores.argsort()[:, :count]`` gives, found by ``topk`` in linear time rather than by a full sort, which
    would make data generation a large share of a small model's MQAR step.
    """
    scores = torch.rand(batch, high - low, generator=generator, device=generator.device)
    return scores.topk(count, dim=-1, largest=False).indices + low


@dataclass(frozen=True)
class TokenTask:
    """One token-recall task; build with :func:`get_token_task`. ``num_labels`` equals ``vocab_size``."""

    name: str
    seq_len: int
    vocab_size: int = 8192
    num_kv_pairs: int = 8
    power_a: float = 0.01
    random_non_queries: bool = True

    kind = "token"

    @property
    def num_labels(self) -> int:
        return self.vocab_size

    def sample(self, batch_size: int, generator: torch.Generator) -> tuple[torch.LongTensor, torch.LongTensor]:
        """``batch_size`` fresh sequences: ``(input_ids, labels)``, int64 (B, L), on ``generator.device``."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        kw = {"generator": generator, "device": generator.device}
        vocab, length, batch = self.vocab_size, self.seq_len, batch_size
        if self.name == "mqar":
            pairs, half = self.num_kv_pairs, vocab // 2
            keys = _distinct(batch, 1, half, pairs, generator)
            values = _distinct(batch, half, vocab, pairs, generator)
            space = (length - 2 * pairs) // 2
            probabilities = mqar_gap_probabilities(space, self.power_a).float().to(generator.device)
            gaps = torch.multinomial(probabilities.expand(batch, space), pairs, replacement=False, generator=generator)
            fill = torch.randint(0, vocab, (batch, length), **kw) if self.random_non_queries else None
            return assemble_mqar(keys, values, gaps, length, fill)
        if self.name == "associative_recall":
            n, num_keys = (length - 2) // 2, (vocab - 1) // 2
            value_of_key = torch.randint(num_keys, vocab - 1, (batch, num_keys), **kw)  # this sequence's map
            pair_keys = torch.randint(0, num_keys, (batch, n), **kw)
            pair_values = value_of_key.gather(1, pair_keys)
            query_index = torch.randint(0, n, (batch,), **kw)
            return assemble_associative_recall(pair_keys, pair_values, query_index, separator=vocab - 1)
        if self.name == "induction_head":
            tokens = torch.randint(0, vocab - 1, (batch, length), **kw)
            trigger_position = torch.randint(0, length - 3, (batch,), **kw)  # 0..L−4
            return assemble_induction_head(tokens, trigger_position, trigger=vocab - 1)
        raise AssertionError(f"unhandled task {self.name!r}")  # get_token_task only builds known names


def get_token_task(
    name: str,
    seq_len: int,
    vocab_size: int = 8192,
    num_kv_pairs: int = 8,
    power_a: float = 0.01,
    random_non_queries: bool = True,
) -> TokenTask:
    """The token task ``name`` with input length ``seq_len``; ``num_kv_pairs`` and ``power_a`` are MQAR's.

    Raises ValueError naming the argument that does not fit: an odd ``seq_len`` for MQAR and
    associative recall, ``4 * num_kv_pairs > seq_len`` for MQAR (the queries need as much room as the
    pairs, as in Zoology), a vocabulary too small for distinct keys and values, ``power_a <= 0``.
    """
    if name not in TOKEN_TASK_NAMES:
        raise ValueError(f"unknown token task {name!r}; expected one of {list(TOKEN_TASK_NAMES)}")
    for arg, value in (("seq_len", seq_len), ("vocab_size", vocab_size), ("num_kv_pairs", num_kv_pairs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{arg} must be a positive integer, got {value!r}")
    if not isinstance(power_a, (int, float)) or isinstance(power_a, bool) or not power_a > 0:
        raise ValueError(f"power_a must be a positive number, got {power_a!r}")
    if name in ("mqar", "associative_recall") and seq_len % 2:
        raise ValueError(f"seq_len must be even for {name} (key-value pairs and query slots), got {seq_len}")
    if name == "mqar":
        if 4 * num_kv_pairs > seq_len:
            raise ValueError(
                f"num_kv_pairs={num_kv_pairs} does not fit seq_len={seq_len}: MQAR needs seq_len >= 4 * num_kv_pairs "
                f"(= {4 * num_kv_pairs}), the pairs and as many query slots"
            )
        if vocab_size // 2 - 1 < num_kv_pairs:
            raise ValueError(
                f"vocab_size={vocab_size} is too small for {num_kv_pairs} distinct keys in 1..vocab_size/2-1 "
                f"(needs vocab_size >= {2 * num_kv_pairs + 2})"
            )
    elif name == "associative_recall":
        if seq_len < 4:
            raise ValueError(
                f"seq_len must be >= 4 for associative_recall (a pair, the separator, a query), got {seq_len}"
            )
        if vocab_size < 3:
            raise ValueError(
                f"vocab_size must be >= 3 for associative_recall (a key, a value, the separator), got {vocab_size}"
            )
    else:  # induction_head
        if seq_len < 4:
            raise ValueError(f"seq_len must be >= 4 for induction_head (S, its token, S at the end), got {seq_len}")
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2 for induction_head (a token and the trigger), got {vocab_size}")
    return TokenTask(name, seq_len, vocab_size, num_kv_pairs, float(power_a), bool(random_non_queries))
