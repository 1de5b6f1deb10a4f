"""Unbounded-context (stateful) perplexity: each document scored start to end with its recurrent state carried.

The sliding-window protocol (:mod:`.perplexity`) forgets everything before its window, which hides what a
recurrent model is for: context no attention window can afford. Here each document runs from its first to its
last token in consecutive windows of ``max_length`` input tokens; every window continues from the state the
previous one left in the model's :class:`~ssmhub.cache.RecurrentCache`
(``model(input_ids, cache=cache, use_cache=True)``). So every token but the document's first is scored once,
conditioned on *all* of its document before it, and the memory is that of one window plus the cache, flat in
the document's length. The numbers are those of one forward pass over the whole document (to float32
round-off): the windows only bound the memory.

Perplexity is also reported by the token's position in its document (the number of document tokens before
it), in buckets (default 0–1K, 1K–4K, 4K–16K, 16K–64K, 64K+ tokens): a recurrent model that uses long
context keeps getting better deeper into a book (the PG-19 context curve, issue 26 §4).

Only models whose cache has a fixed size can do this: ssmhub's recurrent families, and hybrids with attention
layers only with a sliding attention window (``attention_window``, :class:`~ssmhub.layers.AttentionOptions`);
``ssmhub-eval --stateful`` checks that before any work.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import torch
from tqdm.auto import tqdm

from ..models.cache_argument import CACHE_FIELD
from .perplexity import PerplexityResult, token_scores

__all__ = ["POSITION_BUCKETS", "StatefulPerplexityResult", "bucket_name", "evaluate_perplexity_stateful"]

# First position of each bucket; the last bucket is open-ended: 0–1K, 1K–4K, 4K–16K, 16K–64K, 64K+.
POSITION_BUCKETS = (0, 1024, 4096, 16384, 65536)


def _short(position: int) -> str:
    """1024 -> "1K", 65536 -> "64K", 100 -> "100"."""
    return f"{position // 1024}K" if position and position % 1024 == 0 else str(position)


def bucket_name(begin: int, end: int | None) -> str:
    """``"0-1K"`` for positions [0, 1024), ``"64K+"`` for [65536, ∞)."""
    return f"{_short(begin)}+" if end is None else f"{_short(begin)}-{_short(end)}"


@dataclass
class StatefulPerplexityResult(PerplexityResult):
    """The sums of :class:`~ssmhub.evaluation.PerplexityResult` over all scored tokens, and the same sums per
    position bucket.

    Attributes:
        bucket_starts: first position of each bucket (increasing, starting at 0); the last is open-ended.
        by_position: one :class:`PerplexityResult` per bucket; its ``num_documents`` counts the documents
            with at least one scored token in the bucket (documents long enough to reach it).
    """

    bucket_starts: tuple[int, ...] = POSITION_BUCKETS
    by_position: list[PerplexityResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        starts = tuple(self.bucket_starts)
        if not starts or starts[0] != 0 or any(b <= a for a, b in pairwise(starts)):
            raise ValueError(f"bucket_starts must increase from 0; got {starts}")
        self.bucket_starts = starts
        if not self.by_position:
            self.by_position = [PerplexityResult() for _ in starts]

    def bucket_ranges(self) -> list[tuple[int, int | None]]:
        """``(begin, end)`` positions of each bucket; ``end`` None for the last."""
        return list(zip(self.bucket_starts, [*self.bucket_starts[1:], None]))

    def add_window(self, logits: torch.Tensor, targets: torch.Tensor, first_position: int) -> None:
        """Score ``targets`` (T,) at document positions ``first_position ...`` from ``logits`` (T, V), into the
        totals and into the buckets the positions fall in."""
        scores = token_scores(logits, targets)
        self.add_scores(*scores)
        last = first_position + len(targets)  # one past the window's last position
        for bucket, (begin, end) in zip(self.by_position, self.bucket_ranges()):
            lo, hi = max(begin, first_position), last if end is None else min(end, last)
            if lo < hi:
                bucket.add_scores(*(s[lo - first_position : hi - first_position] for s in scores))

    def count_document(self, length: int) -> None:
        """Count a document of ``length`` tokens, overall and in every bucket it reaches (positions 1..length-1
        are scored)."""
        self.num_documents += 1
        for bucket, (begin, _) in zip(self.by_position, self.bucket_ranges()):
            if max(begin, 1) < length:
                bucket.num_documents += 1

    def to_dict(self) -> dict:
        """The overall sums and metrics, and ``by_position``: per bucket its name, first position, end
        (None: open) and its own sums and metrics (word perplexity is overall only)."""
        overall = PerplexityResult(
            self.total_nll, self.num_tokens, self.num_top1, self.num_top5, self.num_documents, self.num_words
        ).to_dict()
        buckets = []
        for bucket, (begin, end) in zip(self.by_position, self.bucket_ranges()):
            metrics = {k: v for k, v in bucket.to_dict().items() if k not in ("num_words", "word_perplexity")}
            where = {"positions": bucket_name(begin, end), "first_position": begin, "end_position": end}
            buckets.append({**where, **metrics})
        return {**overall, "by_position": buckets}


def _score_document(model, ids: torch.Tensor, max_length: int, result: StatefulPerplexityResult) -> None:
    """Run one document through ``model`` in windows of ``max_length`` inputs, the cache carried from each
    window to the next; the inputs are tokens 0..n-2, each predicting the next (so every target is scored
    once, and the last token is never fed)."""
    device = next(model.parameters()).device
    cache = None
    for begin in range(0, len(ids) - 1, max_length):
        end = min(begin + max_length, len(ids) - 1)
        inputs = ids[begin:end].to(device)[None]  # (1, L)
        outputs = model(input_ids=inputs, cache=cache, use_cache=True)
        cache = getattr(outputs, CACHE_FIELD)  # the forward continued from it and updated it in place
        result.add_window(outputs.logits[0], ids[begin + 1 : end + 1].to(device), first_position=begin + 1)
    result.count_document(len(ids))


@torch.inference_mode()
def evaluate_perplexity_stateful(
    model,
    documents: Iterable[Sequence[int] | torch.Tensor],
    max_length: int,
    num_words: int | None = None,
    progress: bool = False,
    bucket_starts: Sequence[int] = POSITION_BUCKETS,
) -> StatefulPerplexityResult:
    """Score ``documents`` statefully (see the module docstring): each from start to end, in windows of
    ``max_length`` tokens that carry the model's recurrent cache.

    Args:
        model: an ssmhub causal LM (its forward takes ``cache`` and, with ``use_cache=True``, returns the
            updated :class:`~ssmhub.cache.RecurrentCache`); put in eval mode.
        documents: token ids, one sequence per document; consumed lazily, one document at a time.
        max_length: input tokens per forward pass (at least 1): it bounds the memory, not the context.
        num_words: words of the evaluated text, for word-level perplexity.
        progress: show a progress bar over documents.
        bucket_starts: first position of each position bucket (default :data:`POSITION_BUCKETS`).
    """
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be a positive integer (tokens per window); got {max_length!r}")
    model.eval()
    result = StatefulPerplexityResult(num_words=num_words, bucket_starts=tuple(bucket_starts))
    for document in tqdm(documents, desc="documents", unit="doc", disable=not progress):
        _score_document(model, torch.as_tensor(document, dtype=torch.long).flatten(), max_length, result)
    return result
