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
few hooks ``generate`` uses are implemented (``get_seq_length``, ``is_linear``, ``reorder_cache``, and for
assisted and prompt-lookup decoding ``activate_past_recording``, ``is_croppable`` and ``crop``), so it does
not depend on the internals of transformers' ``Cache`` classes, which changed five times in two years.

Exact rollback. A recurrent state cannot be rewound, so while recording (:meth:`RecurrentCache.
activate_past_recording`, which transformers' assisted decoding calls) a forward hands the cache the states
after each of its last few positions (the mixers' ``forward_with_history``); :meth:`RecurrentCache.crop` then
puts back the state after any of them, bit for bit. Those snapshots live until the next ``crop``; without
recording a forward hands over nothing and the cache keeps nothing. A field that grows with the tokens
(attention's keys, values and key mask) is not copied: keys are only ever appended, so its snapshot is the
length of a prefix of the final tensor.

Persistence and forks: :meth:`RecurrentCache.save` / :meth:`RecurrentCache.load` (a prefilled prompt kept
on disk, :mod:`ssmhub.cache_files`) and :meth:`RecurrentCache.fork` (an independent copy).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

from .cache_files import read_cache_file, write_cache_file

__all__ = ["RecurrentCache"]

LayerState = dict[str, torch.Tensor]


class _Prefix(NamedTuple):
    """A snapshot of a growing field: the first ``length`` entries of the live tensor along ``dim``."""

    dim: int
    length: int


def _snapshot(state: LayerState | None, final: LayerState) -> dict | None:
    """A copy of ``state`` that later in-place updates of the cache cannot touch; a field whose shape differs
    from ``final``'s grows with the tokens (keys are only appended) and is kept as a :class:`_Prefix`."""
    if state is None:
        return None
    kept = {}
    for name, tensor in state.items():
        live = final[name]
        if tensor.shape == live.shape:
            kept[name] = tensor.detach().clone()
        else:
            dim = next(d for d, (a, b) in enumerate(zip(tensor.shape, live.shape)) if a != b)
            kept[name] = _Prefix(dim, tensor.shape[dim])
    return kept


def _restore(snapshot: dict | None, live: LayerState | None) -> LayerState | None:
    """The layer state a snapshot stands for: its tensors, and prefixes cut from the live tensors."""
    if snapshot is None:
        return None
    return {
        name: live[name].narrow(kept.dim, 0, kept.length).clone() if isinstance(kept, _Prefix) else kept.clone()
        for name, kept in snapshot.items()
    }


class RecurrentCache:
    """Recurrent state of every layer of a model, plus the number of tokens it has absorbed.

    Args:
        num_layers: number of layers whose state it holds.
    """

    is_compileable = False
    is_croppable = True  # while recording, crop rolls back exactly (see the module docstring)

    def __init__(self, num_layers: int):
        if num_layers < 1:
            raise ValueError(f"num_layers must be positive; got {num_layers}")
        self.layers: list[dict[str, torch.Tensor] | None] = [None] * num_layers
        self.seen_tokens = 0
        self.record_past = False
        self._snapshots: dict[int, list[dict | None]] = {}  # tokens absorbed -> per layer, the state then
        self._pending: list[list[dict | None]] = []  # per layer, this forward's snapshots, oldest first

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

    def update(self, layer_idx: int, state: LayerState, history: list[LayerState] | None = None) -> None:
        """Store a layer's new state, in place when the shapes allow (the buffers keep their address).

        A state that carries gradients (a training forward) is stored as it is, graph included: writing it
        into the old buffers would both cut the graph and overwrite a tensor the backward pass still needs
        (the old state, saved by the forward that read it). :meth:`detach_` cuts the graph later.

        ``history`` (recording forwards only): the states after each of the forward's last ``len(history)``
        positions, oldest first, the last being ``state`` (``TokenMixer.forward_with_history``). The states
        before the last, and the state the layer had before the forward, become snapshots at :meth:`advance`.
        """
        if history is not None:
            if not self.record_past:
                raise ValueError("history is only kept by a recording cache; call activate_past_recording() first")
            incoming = _snapshot(self.layers[layer_idx], state)
            self._pending.append([incoming] + [_snapshot(past, state) for past in history[:-1]])
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
        """Record that a forward pass absorbed ``num_tokens`` more tokens into every layer (and, after a
        recording forward, file its snapshots under the number of tokens absorbed when each was taken)."""
        if self._pending:
            if len(self._pending) != len(self.layers):
                raise ValueError(
                    f"a recording forward must hand every layer's history to update(); got {len(self._pending)} "
                    f"of {len(self.layers)} layers"
                )
            count = len(self._pending[0])  # len(history): the incoming state + the states before the last
            after = [self.seen_tokens + num_tokens - count + 1 + i for i in range(count - 1)]
            for index, position in enumerate([self.seen_tokens, *after]):
                if index or count == num_tokens:  # the incoming state only where the history reaches back to it
                    self._snapshots[position] = [layer[index] for layer in self._pending]
            self._pending = []
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

    # ----------------------------------------------------------------------------- exact rollback
    def activate_past_recording(self) -> None:
        """Keep, from the next forward on, the states a :meth:`crop` can return to (transformers' assisted
        decoding calls this on the verifier's cache; ssmhub's ``generate`` on an assistant's)."""
        self.record_past = True

    def deactivate_past_recording(self) -> None:
        """Stop recording and drop every snapshot (ordinary decoding keeps none)."""
        self.record_past = False
        self._snapshots.clear()
        self._pending = []

    def states_to_record(self, num_tokens: int, rollback: int) -> int:
        """How many of a forward's ``num_tokens`` new tokens must hand their states to :meth:`update` (each
        block's history) so that a crop can then remove up to ``rollback`` of them: 0 unless recording, so
        ordinary forwards pay nothing. With the state before them (which the cache holds), the states after
        the last ``rollback`` tokens cover every count a crop can return to."""
        if not self.record_past:
            return 0
        if isinstance(rollback, bool) or not isinstance(rollback, int) or rollback < 0:
            raise ValueError(f"rollback must be a non-negative integer; got {rollback!r}")
        return min(num_tokens, rollback)

    def rollback_lengths(self) -> list[int]:
        """The token counts :meth:`crop` can return to now (the current one included)."""
        return sorted({*self._snapshots, self.seen_tokens})

    def crop(self, tokens_to_remove: int) -> None:
        """Return to the state after fewer tokens, exactly, and drop every snapshot.

        Args:
            tokens_to_remove: transformers' convention (5.24): a negative number removes that many of the last
                tokens; 0 removes none (it only drops the snapshots). A positive number is the older convention,
                the number of tokens to keep (transformers' ``DynamicCache.crop(max_length)`` before 5.24).

        Raises a ValueError naming ``tokens_to_remove`` for a crop to more tokens than were absorbed, or to a
        token count whose state was not kept (only a recording forward keeps states, see
        :meth:`activate_past_recording`).
        """
        target = self._crop_target(tokens_to_remove)
        if target != self.seen_tokens:
            snapshot = self._snapshots[target]
            self.layers = [_restore(kept, live) for kept, live in zip(snapshot, self.layers)]
            self.seen_tokens = target
        self._snapshots.clear()

    def _crop_target(self, tokens_to_remove: int) -> int:
        """The token count a crop returns to, checked (see :meth:`crop`)."""
        if isinstance(tokens_to_remove, bool) or not isinstance(tokens_to_remove, int):
            raise ValueError(f"tokens_to_remove must be an integer; got {tokens_to_remove!r}")
        target = self.seen_tokens + tokens_to_remove if tokens_to_remove <= 0 else tokens_to_remove
        if target < 0 or target > self.seen_tokens:
            raise ValueError(
                f"tokens_to_remove={tokens_to_remove} asks for the state after {target} tokens, but the cache has "
                f"absorbed {self.seen_tokens}"
            )
        if target != self.seen_tokens and target not in self._snapshots:
            how = (
                "only a forward after activate_past_recording() keeps earlier states"
                if not self.record_past
                else f"it kept the states after {self.rollback_lengths()} tokens"
            )
            raise ValueError(
                f"tokens_to_remove={tokens_to_remove}: the cache cannot return to the state after {target} "
                f"tokens: {how}"
            )
        return target

    # ----------------------------------------------------------------------------- batch rows
    def _map_tensors(self, fn) -> None:
        """Apply ``fn`` to every batch-first tensor: the live states and the snapshots."""
        for state in (*self.layers, *(kept for snapshot in self._snapshots.values() for kept in snapshot)):
            if state is None:
                continue
            for name, tensor in state.items():
                if not isinstance(tensor, _Prefix):
                    state[name] = fn(tensor)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Select batch rows (beam search): row i becomes the old row ``beam_idx[i]``."""
        self._map_tensors(lambda tensor: tensor.index_select(0, beam_idx.to(tensor.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every batch row ``repeats`` times (expanding a prompt's state to several beams or samples)."""
        self._map_tensors(lambda tensor: tensor.repeat_interleave(repeats, dim=0))

    def reset(self) -> None:
        """Forget every state (the next forward starts a fresh sequence)."""
        self.layers = [None] * len(self.layers)
        self.seen_tokens = 0
        self._snapshots.clear()
        self._pending = []

    # ----------------------------------------------------------------------------- size, copies, files
    @property
    def batch_size(self) -> int | None:
        """Rows of the held states, or None before the first forward."""
        return next((next(iter(state.values())).shape[0] for state in self.layers if state), None)

    def memory_bytes(self) -> int:
        """Bytes held by all state tensors (snapshots not included: see :meth:`snapshot_bytes`)."""
        return sum(t.numel() * t.element_size() for state in self.layers if state for t in state.values())

    def snapshot_bytes(self) -> int:
        """Bytes held by rollback snapshots: 0 outside assisted decoding."""
        return sum(
            t.numel() * t.element_size()
            for snapshot in self._snapshots.values()
            for kept in snapshot
            if kept
            for t in kept.values()
            if not isinstance(t, _Prefix)
        )

    def fork(self) -> RecurrentCache:
        """An independent copy: the same states and token count in new tensors (not recording, no snapshots),
        so that several continuations can start from one prefilled prompt."""
        copy = RecurrentCache(len(self.layers))
        copy.layers = [None if state is None else {n: t.clone() for n, t in state.items()} for state in self.layers]
        copy.seen_tokens = self.seen_tokens
        return copy

    def save(self, path: str | os.PathLike, model) -> None:
        """Write the cache (a prefilled prompt of ``model``) to one safetensors file, atomically, with what
        identifies ``model`` (:mod:`ssmhub.cache_files`). A ValueError names ``cache`` if it is empty."""
        write_cache_file(self.layers, self.seen_tokens, path, model)

    @classmethod
    def load(cls, path: str | os.PathLike, model, batch_size: int | None = None) -> RecurrentCache:
        """Read a cache written by :meth:`save` for ``model``, on its device, ready for ``generate(...,
        cache=...)``. A file written for another model, dtype or ``batch_size`` (if given) is a ValueError
        naming the mismatch (``model_type``, ``config_hash``, ``weights_fingerprint``, ``dtype``,
        ``batch_size``)."""
        layers, seen_tokens = read_cache_file(path, model, batch_size)
        cache = cls(len(layers))
        cache.layers, cache.seen_tokens = layers, seen_tokens
        return cache
