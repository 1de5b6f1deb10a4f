"""``Trainer`` hooks that score with ssmhub's ``evaluate`` modules, shared by the examples and users' scripts.

A causal LM's logits are reduced batch by batch (``preprocess_logits_for_metrics``) to what the metrics
need, each position's NLL and its 5 most likely ids, so an evaluation never holds ``(N, L, vocab)``
logits; ``compute_metrics`` then pools exact sums: token perplexity from summed NLL, top-1/top-5 accuracy.
Works for packed batches too (``DataCollatorWithFlattening`` marks each document's first label -100).
"""

from __future__ import annotations

import numpy as np
import torch

from ..data.regular import IGNORE_INDEX
from .functional import token_nll, top_k_ids

__all__ = ["CausalLMMetrics", "ClassificationMetrics", "preprocess_causal_lm_logits"]

TOP_K = 5


def preprocess_causal_lm_logits(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(nll, top_ids)`` of every predicted position: ``(B, L - 1)`` NLL of ``labels[:, 1:]`` (0 where
    ignored) and ``(B, L - 1, 5)`` ids, from ``(B, L, V)`` logits (position t predicts label t + 1)."""
    if isinstance(logits, tuple):  # a model returning extra outputs: the logits come first
        logits = logits[0]
    shifted = logits[:, :-1]  # (B, L-1, V)
    return token_nll(shifted, labels[:, 1:]), top_k_ids(shifted, TOP_K)


class CausalLMMetrics:
    """``compute_metrics`` for a ``Trainer`` given :func:`preprocess_causal_lm_logits`: ``token_perplexity``,
    ``nll_per_token``, ``top_1_accuracy`` and ``top_5_accuracy`` over every labelled position."""

    def __init__(self):
        from . import load_metric

        self.perplexity = load_metric("nll_perplexity")
        self.top_k = load_metric("top_k_accuracy")

    def __call__(self, eval_prediction) -> dict[str, float]:
        nll, top_ids = eval_prediction.predictions
        targets = np.asarray(eval_prediction.label_ids)[:, 1:]
        scored = targets != IGNORE_INDEX  # also the padding Trainer adds between batches of other lengths
        nll = np.where(scored, np.asarray(nll, dtype=np.float64), 0.0)
        result = self.perplexity.compute(nll_sums=nll.sum(axis=1).tolist(), num_tokens=scored.sum(axis=1).tolist())
        top = self.top_k.compute(
            predictions=np.asarray(top_ids)[scored].tolist(), references=targets[scored].tolist(), k=[1, TOP_K]
        )
        return {**result, **{name: value for name, value in top.items() if name != "num_scored"}}


class ClassificationMetrics:
    """``compute_metrics`` of a classifier: the argmax of the logits scored by an ``evaluate`` module, ssmhub's
    by name (default ``listops_accuracy``; config ``"subtrees"``: per-token tags, -100 skipped) or any other
    that takes ``predictions`` and ``references``."""

    def __init__(self, name: str = "listops_accuracy", config_name: str | None = None):
        from . import METRIC_NAMES, load_metric

        if name in METRIC_NAMES:
            self.metric = load_metric(name, config_name)
        else:  # any module evaluate.load finds: a local path, or a Hub name (then it needs the network)
            import evaluate

            self.metric = evaluate.load(name, config_name)
        self.per_token = config_name == "subtrees"

    def __call__(self, eval_prediction) -> dict[str, float]:
        logits = eval_prediction.predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        predictions, references = np.asarray(logits).argmax(-1), np.asarray(eval_prediction.label_ids)
        if self.per_token:
            result = self.metric.compute(predictions=predictions.tolist(), references=references.tolist())
        else:
            result = self.metric.compute(
                predictions=predictions.ravel().tolist(), references=references.ravel().tolist()
            )
        return {name: value for name, value in result.items() if name != "num_scored"}
