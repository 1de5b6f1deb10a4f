"""The math of ssmhub's metrics, written once: ``ssmhub-eval``, ``ssmhub-regular``, the ``evaluate`` modules
beside this file and the examples all call these functions.

Inputs are tensors or anything ``torch.as_tensor`` takes (lists, NumPy arrays, as ``evaluate`` and
``Trainer`` hand them over); results are Python numbers. Positions labelled :data:`IGNORE_INDEX` (-100,
what ``cross_entropy`` ignores) are never scored. Needs torch only (not ``evaluate`` nor ``datasets``).
"""

from __future__ import annotations

import math

import torch

from ..data.regular import IGNORE_INDEX, last_supervised_position

__all__ = [
    "accuracy_counts",
    "last_token_accuracy",
    "perplexity",
    "token_nll",
    "top_k_hit_counts",
    "top_k_ids",
]


MAX_LOG_PERPLEXITY = 700.0  # exp(700) ≈ 1e304: a diverged run reports a huge finite number, not an OverflowError


def perplexity(total_nll: float, count: int | None) -> float | None:
    """``exp(total_nll / count)``: token perplexity with ``count`` scored tokens, word perplexity with the
    text's words (PG-19's convention); a mean loss is ``perplexity(loss, 1)``. The exponent is capped at
    :data:`MAX_LOG_PERPLEXITY`. NaN when ``count`` is 0, None when it is None (no word count)."""
    if count is None:
        return None
    if count < 0:
        raise ValueError(f"count must be >= 0; got {count}")
    return math.exp(min(total_nll / count, MAX_LOG_PERPLEXITY)) if count else math.nan


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood (nats) of each target under its logits, the log-softmax taken in float32:
    ``(..., V), (...) -> (...)``; 0 where the target is :data:`IGNORE_INDEX`. Sum it for perplexity."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    scored = targets != IGNORE_INDEX
    picked = log_probs.gather(-1, torch.where(scored, targets, 0).unsqueeze(-1)).squeeze(-1)
    return torch.where(scored, -picked, 0.0)


def top_k_ids(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The ``min(k, vocab)`` most likely ids at each position, best first: ``(..., V) -> (..., k)``."""
    if k < 1:
        raise ValueError(f"k must be >= 1; got {k}")
    return logits.topk(min(k, logits.shape[-1]), dim=-1).indices


def top_k_hit_counts(ranked_ids, targets, ks: tuple[int, ...] = (1, 5)) -> dict[int, int]:
    """For each ``k`` of ``ks``: how many targets are among their position's ``k`` first ranked ids.

    Args:
        ranked_ids: ``(N, K)`` candidate ids per scored position, best first (:func:`top_k_ids`).
        targets: ``(N,)`` true ids; positions holding :data:`IGNORE_INDEX` are not counted.
    """
    ranked, targets = torch.as_tensor(ranked_ids), torch.as_tensor(targets)
    if ranked.ndim != 2 or targets.shape != ranked.shape[:1]:
        raise ValueError(
            f"ranked_ids must be (N, K) and targets (N,); got {tuple(ranked.shape)}, {tuple(targets.shape)}"
        )
    if any(k < 1 for k in ks):  # a k beyond the ranked ids counts them all (a vocabulary smaller than k)
        raise ValueError(f"every k of ks must be >= 1; got {ks}")
    hits = ranked == targets[:, None]  # (N, K)
    hits &= (targets != IGNORE_INDEX)[:, None]
    return {k: int(hits[:, :k].any(dim=-1).sum()) for k in ks}


def accuracy_counts(predictions, references) -> tuple[int, int]:
    """``(correct, scored)`` over matching positions of any shape, skipping :data:`IGNORE_INDEX` references:
    a class per example (ListOps), or a tag per token (ListOps-SubTrees, token classification)."""
    predictions, references = torch.as_tensor(predictions), torch.as_tensor(references)
    if predictions.shape != references.shape:
        raise ValueError(
            f"predictions and references must have one shape; got {tuple(predictions.shape)}, {tuple(references.shape)}"
        )
    scored = references != IGNORE_INDEX
    return int((predictions[scored] == references[scored]).sum()), int(scored.sum())


def last_token_accuracy(predictions, labels) -> float:
    """Accuracy at each row's last supervised position (the full-sequence answer of a per-prefix task).

    Args:
        predictions, labels: ``(N, L)`` class ids; ``labels`` is :data:`IGNORE_INDEX` where a position is
            not supervised, and every row has at least one supervised position.
    """
    predictions, labels = torch.as_tensor(predictions), torch.as_tensor(labels)
    if predictions.shape != labels.shape or labels.ndim != 2:
        raise ValueError(
            f"predictions and labels must both be (N, L); got {tuple(predictions.shape)}, {tuple(labels.shape)}"
        )
    last = last_supervised_position(labels)
    picked = predictions.gather(1, last[:, None])[:, 0]
    answers = labels.gather(1, last[:, None])[:, 0]
    return (picked == answers).float().mean().item()
