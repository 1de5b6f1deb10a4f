"""Sliding-window (strided) perplexity of any causal language model, per document, with exact sums.

The protocol is the one of transformers' guide "Perplexity of fixed-length models": windows of
``max_length`` tokens advance by ``stride``; each window scores only the tokens no earlier window
scored (the labels of the overlap are -100 there), so every scored token sees at least
``max_length - stride`` tokens of context. It runs on each document separately, so context never
crosses a document boundary; to score one concatenated stream (the usual WikiText protocol), pass the
whole stream as a single document.

Exactly as in that guide, the first token of every window that scores from its own start has no
context inside the window and is not scored: the first token of each document always, and with
``stride == max_length`` the first token of every window (the protocol then equals scoring
non-overlapping chunks independently). With ``stride < max_length`` every token of a document but its
first is scored exactly once.

The log-softmax is taken in float32 from the model's logits (not the model's own loss), so the NLL is an
exact sum (accumulated in float64 across windows) and top-1 / top-5 next-token accuracy come for free.
Where the model's ``forward`` takes ``logits_to_keep``, only the logits of scored positions are computed.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence

import torch
from tqdm.auto import tqdm

from .scores import PerplexityResult, PositionPerplexityResult, token_scores

__all__ = ["PerplexityResult", "evaluate_perplexity", "sliding_windows", "token_scores"]


def sliding_windows(length: int, max_length: int, stride: int) -> list[tuple[int, int, int]]:
    """The windows of a document of ``length`` tokens, as ``(begin, end, first_scored)``.

    The window feeds tokens ``[begin, end)`` to the model and scores the tokens ``[first_scored, end)``
    (each predicted from the logits one position earlier). Windows that would score nothing are left out.
    """
    if max_length < 2:
        raise ValueError(f"max_length must be at least 2 (a window must predict a token); got {max_length}")
    if not 0 < stride <= max_length:
        raise ValueError(f"stride must be in [1, max_length={max_length}]; got {stride}")
    windows = []
    prev_end = 0
    for begin in range(0, length, stride):
        end = min(begin + max_length, length)
        first_scored = max(prev_end, begin + 1)
        if first_scored < end:
            windows.append((begin, end, first_scored))
        prev_end = end
        if end == length:
            break
    return windows


def _batches(windows: list[tuple[int, int, int]], batch_size: int) -> Iterable[list[tuple[int, int, int]]]:
    """Consecutive windows grouped into batches of equal-length windows (no padding ever needed)."""
    batch: list[tuple[int, int, int]] = []
    for window in windows:
        if batch and (len(batch) == batch_size or window[1] - window[0] != batch[0][1] - batch[0][0]):
            yield batch
            batch = []
        batch.append(window)
    if batch:
        yield batch


def _accepts_logits_to_keep(model) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def _score_batch(model, ids: torch.Tensor, batch: list[tuple[int, int, int]], result: PerplexityResult) -> None:
    """Run one batch of equal-length windows and add their sums to ``result``."""
    device = next(model.parameters()).device
    input_ids = torch.stack([ids[begin:end] for begin, end, _ in batch]).to(device)  # (B, L)
    length = input_ids.shape[1]
    # Logits are needed from one position before the first scored token; skip the others where the model can.
    keep = max(end - first_scored + 1 for _, end, first_scored in batch)
    kwargs = {"logits_to_keep": keep} if keep < length and _accepts_logits_to_keep(model) else {}
    logits = model(input_ids=input_ids, use_cache=False, **kwargs).logits
    offset = length - logits.shape[1]  # position of logits[:, 0] in the window
    for row, (begin, end, first_scored) in enumerate(batch):
        scored_logits = logits[row, first_scored - begin - 1 - offset : end - begin - 1 - offset]  # (T, V)
        result.add_window(scored_logits, ids[first_scored:end].to(device), first_position=first_scored)


@torch.inference_mode()
def evaluate_perplexity(
    model,
    documents: Iterable[Sequence[int] | torch.Tensor],
    max_length: int,
    stride: int | None = None,
    num_words: int | None = None,
    batch_size: int = 1,
    progress: bool = False,
    bucket_starts: Sequence[int] | None = None,
) -> PerplexityResult:
    """Score ``documents`` with the sliding-window protocol (see the module docstring).

    Args:
        model: any causal LM whose ``model(input_ids=..., use_cache=False)`` returns ``.logits`` of shape
            ``(B, L, vocab)`` (every ``AutoModelForCausalLM``). It is put in eval mode.
        documents: token ids, one sequence per document; consumed lazily, one document at a time.
        max_length: tokens per window (at least 2).
        stride: how far a window advances; default ``max_length`` (non-overlapping chunks).
        num_words: words of the evaluated text, for word-level perplexity (e.g. summed
            :func:`ssmhub.data.pg19_word_count` of the books).
        batch_size: equal-length windows of one document run through the model together.
        progress: show a progress bar over documents.
        bucket_starts: also sum by the token's position in its document, in buckets starting at these
            positions (e.g. :data:`~ssmhub.evaluation.POSITION_BUCKETS`); the result is then a
            :class:`~ssmhub.evaluation.PositionPerplexityResult`, comparable with the stateful protocol's.
    """
    stride = max_length if stride is None else stride
    sliding_windows(0, max_length, stride)  # validates max_length and stride before any work
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive; got {batch_size}")
    model.eval()
    if bucket_starts is None:
        result = PerplexityResult(num_words=num_words)
    else:
        result = PositionPerplexityResult(num_words=num_words, bucket_starts=tuple(bucket_starts))
    for document in tqdm(documents, desc="documents", unit="doc", disable=not progress):
        ids = torch.as_tensor(document, dtype=torch.long).flatten()
        for batch in _batches(sliding_windows(len(ids), max_length, stride), batch_size):
            _score_batch(model, ids, batch, result)
        result.count_document(len(ids))
    return result
