"""Sums of per-token scores (NLL, top-1, top-5), overall and by the token's position in its document.

Both evaluation protocols add their windows here: :func:`~ssmhub.evaluation.evaluate_perplexity` (sliding
windows) and :func:`~ssmhub.evaluation.evaluate_perplexity_stateful` (whole documents, state carried). The
log-softmax is taken in float32 from the model's logits and the NLL summed in float64, so the sums are exact.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from itertools import pairwise

import torch

from ..metrics.functional import perplexity, token_nll, top_k_ids

__all__ = [
    "POSITION_BUCKETS",
    "PerplexityResult",
    "PositionPerplexityResult",
    "bucket_name",
    "token_scores",
]


def token_scores(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per scored token: its NLL in nats (float64, from a float32 log-softmax of ``logits``), whether it is the
    argmax, and whether it is among the 5 most likely tokens (the math of :mod:`ssmhub.metrics.functional`).
    ``logits`` (T, V) predict ``targets`` (T,)."""
    nll = token_nll(logits, targets).double()  # (T,)
    hits = top_k_ids(logits, 5) == targets[:, None]  # (T, k)
    return nll, hits[:, 0], hits.any(dim=-1)


@dataclass
class PerplexityResult:
    """Sums over all scored tokens, and the metrics they give.

    Attributes:
        total_nll: summed negative log-likelihood of the scored tokens, in nats.
        num_tokens: number of scored (predicted) tokens.
        num_top1: scored tokens whose target is the model's argmax.
        num_top5: scored tokens whose target is among the model's 5 most likely tokens.
        num_documents: documents evaluated.
        num_words: words of the evaluated text (when given), for word-level perplexity.
    """

    total_nll: float = 0.0
    num_tokens: int = 0
    num_top1: int = 0
    num_top5: int = 0
    num_documents: int = 0
    num_words: int | None = None

    @property
    def nll_per_token(self) -> float:
        """Mean NLL per scored token (nats); NaN when nothing was scored."""
        return self.total_nll / self.num_tokens if self.num_tokens else math.nan

    @property
    def token_perplexity(self) -> float:
        """``exp(total_nll / num_tokens)``."""
        return perplexity(self.total_nll, self.num_tokens)

    @property
    def word_perplexity(self) -> float | None:
        """``exp(total_nll / num_words)``, or None when no word count was given."""
        return perplexity(self.total_nll, self.num_words) if self.num_words else None

    @property
    def top1_accuracy(self) -> float:
        return self.num_top1 / self.num_tokens if self.num_tokens else math.nan

    @property
    def top5_accuracy(self) -> float:
        return self.num_top5 / self.num_tokens if self.num_tokens else math.nan

    def add_scores(self, nll: torch.Tensor, top1: torch.Tensor, top5: torch.Tensor) -> None:
        """Add the per-token scores of :func:`token_scores` (float64 NLL, bool hits) to the sums."""
        self.total_nll += nll.sum().item()
        self.num_tokens += nll.numel()
        self.num_top1 += int(top1.sum())
        self.num_top5 += int(top5.sum())

    def add_window(self, logits: torch.Tensor, targets: torch.Tensor, first_position: int) -> None:
        """Score ``targets`` (T,) from ``logits`` (T, V); ``first_position``, the document position of
        ``targets[0]``, matters only to :class:`PositionPerplexityResult`."""
        self.add_scores(*token_scores(logits, targets))

    def count_document(self, length: int) -> None:
        """Count one evaluated document of ``length`` tokens."""
        self.num_documents += 1

    def to_dict(self) -> dict:
        """The sums and the derived metrics, JSON-ready."""
        metrics = {
            name: getattr(self, name)
            for name in ("nll_per_token", "token_perplexity", "word_perplexity", "top1_accuracy", "top5_accuracy")
        }
        return {**asdict(self), **metrics}


# First position of each bucket; the last bucket is open-ended: 0–1K, 1K–4K, 4K–16K, 16K–64K, 64K+.
POSITION_BUCKETS = (0, 1024, 4096, 16384, 65536)


def _short(position: int) -> str:
    """1024 -> "1K", 65536 -> "64K", 100 -> "100"."""
    return f"{position // 1024}K" if position and position % 1024 == 0 else str(position)


def bucket_name(begin: int, end: int | None) -> str:
    """``"0-1K"`` for positions [0, 1024), ``"64K+"`` for [65536, ∞)."""
    return f"{_short(begin)}+" if end is None else f"{_short(begin)}-{_short(end)}"


@dataclass
class PositionPerplexityResult(PerplexityResult):
    """The sums of :class:`PerplexityResult` over all scored tokens, and the same sums per bucket of the
    token's position in its document (the number of document tokens before it).

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
