"""The states of a static decode: every layer's state preallocated in fixed shapes before the first token.

A compiled decode step (``torch.compile(fullgraph=True)``) and an exported one (``torch.export``, ONNX) need a
step whose inputs have the same shapes at every token and whose state is a fixed set of tensors. Recurrent
mixers have such a state already; attention layers of hybrids get a key/value buffer of ``max_length`` tokens
(:meth:`ssmhub.layers.mixer.TokenMixer.static_state`). :func:`static_states` builds them, after the checks that
every caller needs (:func:`check_static_decode`).
"""

from __future__ import annotations

import torch

__all__ = ["check_static_decode", "static_states"]


def check_static_decode(model, batch_size: int, max_length: int) -> None:
    """Raise a ValueError naming the argument unless ``model`` is an ssmhub causal LM whose every layer has a
    state to carry, and ``batch_size`` and ``max_length`` are positive integers."""
    if not callable(getattr(model, "static_cache", None)):  # RecurrentForCausalLM's (no import: it imports us)
        raise ValueError(
            f"model must be an ssmhub causal language model (a ...ForCausalLM); got {type(model).__name__}"
        )
    for name, value in (("batch_size", batch_size), ("max_length", max_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer; got {value!r}")
    for idx, block in enumerate(model.backbone.layers):
        if not block.mixer.causal:
            raise ValueError(f"model cannot decode token by token: layer {idx}: {block.mixer.noncausal_reason()}")


def static_states(model, batch_size: int, max_length: int, device=None) -> list[dict[str, torch.Tensor]]:
    """Per layer, the state before the first token, preallocated for up to ``max_length`` tokens (prompt and
    generated tokens together), on ``device`` (default: the model's) in the model's dtype."""
    check_static_decode(model, batch_size, max_length)
    device = model.device if device is None else device
    return [
        block.mixer.static_state(batch_size, max_length, device=device, dtype=model.dtype)
        for block in model.backbone.layers
    ]
