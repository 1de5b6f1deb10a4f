"""Checks on what a user hands a model, run before any computation, with errors that name the problem;
the padding mask and pooling of the classification heads."""

from __future__ import annotations

import torch
from transformers.utils import logging

__all__ = ["check_generation_prompt", "check_model_inputs", "infer_padding_mask", "pool_hidden_states"]

logger = logging.get_logger(__name__)


def check_model_inputs(
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    vocab_size: int,
    hidden_size: int,
    past_length: int,
    read_values: bool = True,
) -> None:
    """Validate the inputs of a forward pass.

    ``attention_mask`` may cover only the new tokens, or the tokens already in the cache plus the
    new ones (what ``generate`` passes): its length must be L or ``past_length + L``. The token ids' range is
    read back from their device only with ``read_values`` (the model asks where a sequence enters: a forward
    without history outside training, e.g. ``generate``'s prefill), never in a decode step or a training
    forward, where it would be a host synchronization per token or per batch.
    """
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("pass exactly one of input_ids and inputs_embeds")
    if input_ids is not None:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape (batch, sequence); got {tuple(input_ids.shape)}")
        if input_ids.dtype.is_floating_point or input_ids.is_complex():
            raise ValueError(f"input_ids must hold integer token ids; got dtype {input_ids.dtype}")
        batch, length = input_ids.shape
    else:
        if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != hidden_size:
            raise ValueError(
                f"inputs_embeds must have shape (batch, sequence, {hidden_size}); got {tuple(inputs_embeds.shape)}"
            )
        batch, length = inputs_embeds.shape[:2]
    if batch == 0 or length == 0:
        raise ValueError(f"the input is empty (batch {batch}, sequence length {length}); give at least one token")
    if read_values and input_ids is not None and not torch.compiler.is_compiling():  # reading breaks a traced graph
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"input_ids contains token id {bad}, outside the vocabulary [0, {vocab_size})")
    if attention_mask is not None:
        allowed = {length, past_length + length}
        if attention_mask.dim() != 2 or attention_mask.shape[0] != batch or attention_mask.shape[1] not in allowed:
            expected = " or ".join(f"({batch}, {n})" for n in sorted(allowed))
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}; expected {expected}")


def check_generation_prompt(
    input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, bos_token_id: int | None
) -> None:
    """Validate the prompt handed to ``generate`` before transformers touches it.

    An empty prompt (``input_ids`` of shape (B, 0)) would otherwise fail deep inside transformers'
    ``generate`` with an IndexError; a recurrent model has no state to continue from without at least
    one token. None (no prompt) is left to transformers, which starts from ``bos_token_id``. ``input_ids`` of
    shape (B, 0) beside non-empty ``inputs_embeds`` is a prompt given as embeddings (the ids only collect the
    generated tokens), as transformers' GPT-2 and Mamba take it.
    """
    given_as_embeddings = isinstance(inputs_embeds, torch.Tensor) and inputs_embeds.dim() == 3
    given_as_embeddings = given_as_embeddings and inputs_embeds.shape[1] > 0
    for name, prompt in (("input_ids", input_ids), ("inputs_embeds", inputs_embeds)):
        if not isinstance(prompt, torch.Tensor) or prompt.dim() < 2:
            continue
        if name == "input_ids" and given_as_embeddings and prompt.shape[1] == 0:
            if prompt.shape[0] != inputs_embeds.shape[0]:
                raise ValueError(
                    f"input_ids has shape {tuple(prompt.shape)} and inputs_embeds {tuple(inputs_embeds.shape)}: "
                    f"they must have the same number of rows"
                )
            continue
        if prompt.shape[1] == 0:
            bos = "a BOS token" if bos_token_id is None else f"a BOS token (bos_token_id={bos_token_id})"
            bos = bos if name == "input_ids" else f"the embedding of {bos}"
            raise ValueError(
                f"{name} has shape {tuple(prompt.shape)}: a prompt needs at least one token; start it with {bos}"
            )
        if prompt.shape[0] == 0:
            raise ValueError(f"{name} has shape {tuple(prompt.shape)}: generate needs at least one prompt")


def infer_padding_mask(
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    pad_token_id: int | None,
) -> torch.Tensor | None:
    """The attention mask a classifier uses: ``attention_mask`` when given, else one inferred from padding.

    transformers' sequence classifiers (e.g. ``GPT2ForSequenceClassification``) find the last real token
    of a batch given without a mask from ``config.pad_token_id``; ssmhub pools with "max", "mean" or
    "last" and has bidirectional mixers, so the whole mask is inferred and also given to the backbone.
    The padding is the run of ``pad_token_id`` at either end of a row (right or left padding); a pad id
    between real tokens (a tokenizer whose pad token is also its EOS) stays a real token. Where padding
    cannot be found, a warning is logged once (as transformers does) and every position counts:
    ``inputs_embeds`` carry no token ids, and without ``pad_token_id`` a batch of several rows may hold
    padding nobody can see.
    """
    if attention_mask is not None:
        return attention_mask
    if input_ids is None:
        logger.warning_once(
            "a classifier given inputs_embeds without attention_mask cannot detect padding: every position is "
            "pooled; pass attention_mask for a padded batch"
        )
        return None
    if pad_token_id is None:
        if input_ids.shape[0] > 1:
            logger.warning_once(
                "config.pad_token_id is None: a classifier given a batch without attention_mask cannot detect "
                "padding and pools every position; set pad_token_id or pass attention_mask"
            )
        return None
    real = input_ids != pad_token_id
    after_first = real.cumsum(dim=1) > 0
    up_to_last = real.flip(1).cumsum(dim=1).flip(1) > 0
    return (after_first & up_to_last).long()


def pool_hidden_states(hidden: torch.Tensor, mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """Pool (B, L, H) hidden states to (B, H) over the real tokens of ``mask`` (B, L). A row with no real token
    (an empty text in a padded batch) pools to zeros under every pooling, so its logits are the head's bias:
    finite, and independent of what its padding holds."""
    if mask is None:
        mask = torch.ones(hidden.shape[:2], dtype=torch.bool, device=hidden.device)
    mask = mask.bool()
    if pooling == "max":
        pooled = hidden.masked_fill(~mask.unsqueeze(-1), torch.finfo(hidden.dtype).min).amax(dim=1)
    elif pooling == "mean":
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)
    elif pooling == "last":
        positions = torch.arange(mask.shape[1], device=mask.device)
        last = torch.where(mask, positions, -1).amax(dim=1).clamp(min=0)  # (B,) index of the last real token
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    else:
        raise ValueError(f"pooling must be 'max', 'mean' or 'last'; got {pooling!r}")
    return pooled.masked_fill(~mask.any(dim=1, keepdim=True), 0)  # rows of padding only: zeros
