"""The one recurrent-state cache every ssmhub family decodes with.

Per layer it holds a small dict of fixed-shape tensors (a DLR layer: its complex state; later
families: conv windows, shift registers, block states, attention key/values of hybrid layers).
States are allocated lazily by the first forward that asks for them and updated in place after that.
For recurrent layers the memory never grows with the context: that is the product's promise, and
:meth:`RecurrentCache.memory_bytes` lets benchmarks and tests check it.

In a training forward (gradients enabled) the cache keeps the new states *with* their autograd graph, so a
window's loss can reach back into earlier windows if the caller wants that; truncated backpropagation
through time calls :meth:`RecurrentCache.detach_` between windows, which cuts the graph and keeps the values.

It travels through ``generate`` as ``cache`` (``past_key_values`` before transformers 5.24). Only the
few hooks ``generate`` uses are implemented (``get_seq_length``, ``is_linear``, ``reorder_cache``), so
it does not depend on the internals of transformers' ``Cache`` classes, which changed five times in
two years.
"""

from __future__ import annotations

import torch

__all__ = ["RecurrentCache"]


class RecurrentCache:
    """Recurrent state of every layer of a model, plus the number of tokens it has absorbed.

    Args:
        num_layers: number of layers whose state it holds.
    """

    is_compileable = False
    is_croppable = False

    def __init__(self, num_layers: int):
        if num_layers < 1:
            raise ValueError(f"num_layers must be positive; got {num_layers}")
        self.layers: list[dict[str, torch.Tensor] | None] = [None] * num_layers
        self.seen_tokens = 0

    def __len__(self) -> int:
        return len(self.layers)

    def __repr__(self) -> str:
        filled = sum(state is not None for state in self.layers)
        return (
            f"RecurrentCache(num_layers={len(self)}, filled={filled}, seen_tokens={self.seen_tokens}, "
            f"memory_bytes={self.memory_bytes()})"
        )

    def get(self, layer_idx: int) -> dict[str, torch.Tensor] | None:
        """State of layer ``layer_idx``, or None before its first token."""
        return self.layers[layer_idx]

    def has_previous_state(self, layer_idx: int = 0) -> bool:
        return self.layers[layer_idx] is not None

    def update(self, layer_idx: int, state: dict[str, torch.Tensor]) -> None:
        """Store a layer's new state, in place when the shapes allow (the buffers keep their address).

        A state that carries gradients (a training forward) is stored as it is, graph included: writing it
        into the old buffers would both cut the graph and overwrite a tensor the backward pass still needs
        (the old state, saved by the forward that read it). :meth:`detach_` cuts the graph later."""
        if torch.is_grad_enabled() and any(tensor.requires_grad for tensor in state.values()):
            self.layers[layer_idx] = dict(state)
            return
        current = self.layers[layer_idx]
        if current is None or current.keys() != state.keys():
            self.layers[layer_idx] = {name: tensor.detach().clone() for name, tensor in state.items()}
            return
        for name, tensor in state.items():
            if current[name].shape == tensor.shape and current[name].dtype == tensor.dtype:
                current[name].copy_(tensor.detach())
            else:  # e.g. the key/value cache of an attention layer grows
                current[name] = tensor.detach().clone()

    def advance(self, num_tokens: int) -> None:
        """Record that a forward pass absorbed ``num_tokens`` more tokens into every layer."""
        self.seen_tokens += num_tokens

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Number of tokens (padding included) the cache has absorbed."""
        return self.seen_tokens

    @property
    def is_linear(self) -> list[bool]:
        """Per layer, whether it is one of transformers' linear-attention cache layers: never.

        ``generate`` (transformers >= 5.24) trims a prompt to the tokens the cache has not absorbed,
        ``get_seq_length()`` of them, only when some layer is not such a layer, since those do not count
        tokens. This cache counts them exactly, so a ``generate`` that continues from a returned cache
        feeds only the new tokens.
        """
        return [False] * len(self.layers)

    def detach_(self) -> RecurrentCache:
        """Cut every state from the autograd graph that computed it, keeping its values (in place; returns
        the cache). Truncated backpropagation through time calls it between windows: the next window then
        starts from the last window's final state, but its gradients stop at the window's start."""
        for state in self.layers:
            if state is not None:
                for name, tensor in state.items():
                    state[name] = tensor.detach()
        return self

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Select batch rows (beam search): row i becomes the old row ``beam_idx[i]``."""
        for state in self.layers:
            if state is None:
                continue
            for name, tensor in state.items():
                state[name] = tensor.index_select(0, beam_idx.to(tensor.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every batch row ``repeats`` times (expanding a prompt's state to several beams or samples)."""
        for state in self.layers:
            if state is None:
                continue
            for name, tensor in state.items():
                state[name] = tensor.repeat_interleave(repeats, dim=0)

    def reset(self) -> None:
        """Forget every state (the next forward starts a fresh sequence)."""
        self.layers = [None] * len(self.layers)
        self.seen_tokens = 0

    def memory_bytes(self) -> int:
        """Bytes held by all state tensors."""
        return sum(t.numel() * t.element_size() for state in self.layers if state for t in state.values())
