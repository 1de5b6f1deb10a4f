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
:func:`evaluate_perplexity_stateful` and ``ssmhub-eval --stateful`` check that before any work.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from tqdm.auto import tqdm

from ..models.cache_argument import CACHE_FIELD
from ..preflight import check_stateful_model
from .scores import POSITION_BUCKETS, PositionPerplexityResult

__all__ = ["evaluate_perplexity_stateful"]


def _score_document(model, ids: torch.Tensor, max_length: int, result: PositionPerplexityResult) -> None:
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
) -> PositionPerplexityResult:
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
    check_stateful_model(
        model.config,
        f"the model ({type(model).__name__})",
        "score it with evaluate_perplexity (sliding windows)",
        "load it with a sliding attention window, e.g. from_pretrained(folder, attention_window=W), or score it "
        "with evaluate_perplexity (sliding windows)",
        caller="evaluate_perplexity_stateful",
    )
    model.eval()
    result = PositionPerplexityResult(num_words=num_words, bucket_starts=tuple(bucket_starts))
    for document in tqdm(documents, desc="documents", unit="doc", disable=not progress):
        _score_document(model, torch.as_tensor(document, dtype=torch.long).flatten(), max_length, result)
    return result
