"""What ssmhub adds to transformers' assisted and prompt-lookup decoding: argument checks, the caches' recording,
and how far back a verification forward must be able to roll its cache.

transformers' assisted decoding (``generate(..., assistant_model=...)`` or ``prompt_lookup_num_tokens=n``;
speculative decoding, Leviathan et al., arXiv 2211.17192) runs the verifier on the candidate tokens in one forward,
keeps the accepted prefix and calls ``cache.crop`` to forget the rest (:mod:`ssmhub.rollback`); a forward follows
every crop, so the replay a crop needs waits for it (:func:`record_for_assisted_decoding`). The verifier asks for the
logits of the candidates and one more (``logits_to_keep = candidates + 1``), so the forward keeps the states to drop
every candidate (:func:`rollback_reach`); an assistant asks for one logit, and transformers re-feeds its last
accepted token, so it rolls back at most one token of a forward. The tokens before those run as an ordinary forward,
so the prompt's prefill is the one plain decoding runs.
"""

from __future__ import annotations

import torch

__all__ = ["check_assisted_decoding_arguments", "record_for_assisted_decoding", "rollback_reach"]


def rollback_reach(logits_to_keep: int | torch.Tensor, inputs: torch.Tensor | None) -> int:
    """How many of a forward's new tokens a crop may remove afterwards (used only by a recording cache,
    :func:`ssmhub.rollback.run_with_rollback`).

    A caller that reads the last n logits (``logits_to_keep`` = n) verifies n − 1 candidates, so removes at most
    n − 1 tokens; transformers' assistant reads one logit and re-feeds its last token, so removes at most one.
    Hence max(n − 1, 1); ``logits_to_keep`` 0 (every logit) or a tensor of indices: every new token."""
    length = 0 if inputs is None else inputs.shape[1]
    if isinstance(logits_to_keep, int) and logits_to_keep > 0:
        return min(max(logits_to_keep - 1, 1), length)
    return length


def record_for_assisted_decoding(cache) -> None:
    """Make ``cache`` (a :class:`~ssmhub.cache.RecurrentCache`) record for assisted decoding, each crop's replay
    deferred to the next forward (:attr:`ssmhub.rollback.Rollback.defer_replay`): transformers runs one after every
    crop (the assistant's next drafts, the verifier's next check), so a round costs one forward per model. The
    verifier's ``generate`` replays what the last crop kept when it returns (``deactivate_past_recording``)."""
    cache.activate_past_recording()
    cache.rollback.defer_replay = True


def _generation_option(model, kwargs: dict, name: str):
    """A ``generate`` option as transformers resolves it: the keyword, else the ``generation_config`` passed,
    else the model's."""
    if name in kwargs:
        return kwargs[name]
    config = kwargs.get("generation_config") or model.generation_config
    return getattr(config, name, None)


def check_assisted_decoding_arguments(model, kwargs: dict) -> None:
    """Raise a ValueError naming the argument, before any decoding, for ``prompt_lookup_num_tokens`` < 1 (transformers
    would silently decode without lookup for 0) and for an ``assistant_model`` whose vocabulary differs from the
    model's (its draft tokens would mean other words)."""
    lookup = _generation_option(model, kwargs, "prompt_lookup_num_tokens")
    if lookup is not None and (isinstance(lookup, bool) or not isinstance(lookup, int) or lookup < 1):
        raise ValueError(
            f"prompt_lookup_num_tokens must be a positive integer (the number of tokens to copy from the prompt "
            f"as candidates); got {lookup!r}"
        )
    assistant = kwargs.get("assistant_model")
    if assistant is None:
        return
    ours = model.config.get_text_config().vocab_size
    theirs = getattr(getattr(assistant, "config", None), "vocab_size", None)
    if theirs != ours:
        raise ValueError(
            f"assistant_model has a vocabulary of {theirs} tokens but the model has {ours}: the assistant must "
            f"share the model's tokenizer"
        )
