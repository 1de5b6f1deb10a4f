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

Rollback. A recurrent state cannot be rewound, so while recording (:meth:`RecurrentCache.
activate_past_recording`, which transformers' assisted decoding calls) a forward files a record with the cache: each
layer's state before it and the forward's first-layer inputs (B, L, H). The forward itself is an ordinary parallel
one, so checking k draft tokens costs one forward, not k steps. :meth:`RecurrentCache.crop` to the state after j of
its tokens puts back the states before it and replays its first j inputs through the layers: the model's next
forward runs them ahead of its own tokens (:meth:`RecurrentCache.take_pending`), so a round of assisted decoding
still costs one forward, and anything that reads the states before that replays them at once (one ordinary forward).
The cache then holds the states of a cache that was fed those j tokens (and, when merged, the next forward's in the
same pass), to float32 round-off: the replay runs the same layers on the same inputs, but inside a forward of
another length, whose BLAS and FFT kernels may block and round the sums differently (by thread count, instruction
set, device). So greedy assisted decoding gives plain greedy's tokens unless two logits tie within that round-off.
The records live until the next ``crop``; without recording a forward files nothing and the cache keeps nothing. A
field that grows with the tokens (attention's keys, values and key mask) is not copied: keys are only ever appended,
so its snapshot is the length of a prefix of the live tensor.

Static decoding: :meth:`RecurrentCache.preallocated` makes a cache whose every layer holds its state from the
start, in fixed shapes (attention layers: a key/value buffer of a fixed number of tokens, see
:meth:`ssmhub.layers.attention.CausalSelfAttention.static_state`). Every forward then writes into the same tensors
(:meth:`update` copies in place) and the cache's structure never changes, so ``is_compileable`` is True: a decode
step compiles with ``torch.compile(fullgraph=True)``, and transformers' ``generate`` compiles it itself on an
accelerator (``compile_config`` elsewhere), with CUDA graphs (its default ``mode="reduce-overhead"``): the states
are marked as static addresses, which a graph that writes into its inputs needs (as transformers' ``StaticCache``).

Persistence and forks: :meth:`RecurrentCache.save` / :meth:`RecurrentCache.load` (a prefilled prompt kept
on disk, :mod:`ssmhub.cache_files`) and :meth:`RecurrentCache.fork` (an independent copy).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

import torch

from .cache_files import read_cache_file, write_cache_file

__all__ = ["RecurrentCache"]

LayerState = dict[str, torch.Tensor]


class _Prefix(NamedTuple):
    """A snapshot of a growing field: the first ``length`` entries of the live tensor along ``dim``."""

    dim: int
    length: int


class _Record(NamedTuple):
    """What a recording forward leaves so that :meth:`RecurrentCache.crop` can return to the state after any
    of its tokens: the tokens absorbed before it, each layer's state then (:func:`_snapshot`), its first-layer
    inputs (B, L, H) and mask (B, L) or None, and ``replay(cache, inputs, mask)``, which runs the model's
    layers on inputs from the cache's states and updates them (the model's ``replay_layers``)."""

    start: int
    incoming: list[dict | None]
    inputs: torch.Tensor
    mask: torch.Tensor | None
    replay: Callable

    @property
    def stop(self) -> int:
        return self.start + self.inputs.shape[1]


def _snapshot(state: LayerState | None, final: LayerState, handed_over: bool = False) -> dict | None:
    """``state`` kept safe from later in-place updates of the cache: copied, or as it is when ``handed_over`` (the
    cache stops using its tensors, see :meth:`RecurrentCache.update`); a field whose shape differs from
    ``final``'s grows with the tokens (keys are only appended) and is kept as a :class:`_Prefix`."""
    if state is None:
        return None
    kept = {}
    for name, tensor in state.items():
        live = final[name]
        if tensor.shape == live.shape:
            kept[name] = tensor if handed_over else tensor.detach().clone()
        else:
            dim = next(d for d, (a, b) in enumerate(zip(tensor.shape, live.shape)) if a != b)
            kept[name] = _Prefix(dim, tensor.shape[dim])
    return kept


def _restore(snapshot: dict | None, live: LayerState | None) -> LayerState | None:
    """The layer state a snapshot stands for: its tensors (restored once: a crop drops every record), and
    prefixes cut from the live tensors."""
    if snapshot is None:
        return None
    return {
        name: live[name].narrow(kept.dim, 0, kept.length).clone() if isinstance(kept, _Prefix) else kept
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
        self._layers: list[dict[str, torch.Tensor] | None] = [None] * num_layers
        self._pending: tuple | None = None  # (inputs, mask, replay) a crop left for the next forward to absorb
        self.seen_tokens = 0
        self.max_length: int | None = None  # a preallocated cache's bound on its tokens, if it has one
        self.record_past = False
        self._records: list[_Record] = []  # the recording forwards since the last crop, oldest first
        self._recording: tuple | None = None  # (inputs, mask, replay) of the recording forward under way
        self._incoming: list[dict | None] = []  # per layer, its state before the recording forward

    @classmethod
    def preallocated(cls, states: list[LayerState], max_length: int | None = None) -> RecurrentCache:
        """A cache holding ``states`` (one fixed-shape dict per layer, each the state before the first token) from
        the start, updated in place by every forward: what a compiled decode step needs (``is_compileable``).
        ``max_length``: the tokens its fixed buffers hold (attention's key/value slots), checked on the host by
        :meth:`check_room` before each forward; None: no bound (recurrent states only)."""
        if not states or any(not isinstance(state, dict) or not state for state in states):
            raise ValueError("states must be a non-empty list with one non-empty dict of tensors per layer")
        cache = cls(len(states))
        cache.max_length = max_length
        cache.layers = [dict(state) for state in states]
        cache.is_compileable = True
        _mark_static_addresses(cache.layers)
        return cache

    @property
    def layers(self) -> list[dict[str, torch.Tensor] | None]:
        """Each layer's state dict (None before its first token), after any replay a :meth:`crop` left pending."""
        if self._pending is not None:
            self._flush()
        return self._layers

    @layers.setter
    def layers(self, states: list[dict[str, torch.Tensor] | None]) -> None:
        self._layers, self._pending = states, None

    def __len__(self) -> int:
        return len(self._layers)

    def __repr__(self) -> str:  # reads ``_layers``: printing a cache never runs a pending replay
        filled = sum(state is not None for state in self._layers)
        held = sum(t.numel() * t.element_size() for state in self._layers if state for t in state.values())
        pending = 0 if self._pending is None else self._pending[0].shape[1]
        return (
            f"RecurrentCache(num_layers={len(self)}, filled={filled}, seen_tokens={self.seen_tokens}, "
            f"memory_bytes={held}" + (f", pending_replay={pending}" if pending else "") + ")"
        )

    def get(self, layer_idx: int) -> dict[str, torch.Tensor] | None:
        """State of layer ``layer_idx``, or None before its first token."""
        return self.layers[layer_idx]

    def has_previous_state(self, layer_idx: int = 0) -> bool:
        return self.layers[layer_idx] is not None

    def update(self, layer_idx: int, state: LayerState) -> None:
        """Store a layer's new state, in place when the shapes allow (the buffers keep their address).

        A state that carries gradients (a training forward) is stored as it is, graph included: writing it
        into the old buffers would both cut the graph and overwrite a tensor the backward pass still needs
        (the old state, saved by the forward that read it). :meth:`detach_` cuts the graph later. During a
        recording forward (:meth:`begin_record`) the layer's state before it is kept first.
        """
        if self._recording is not None and self._hand_over(layer_idx, state):
            return
        if self._recording is not None:
            self._incoming.append(_snapshot(self.layers[layer_idx], state))
        if torch.is_grad_enabled() and any(tensor.requires_grad for tensor in state.values()):
            self.layers[layer_idx] = dict(state)
            return
        current = self.layers[layer_idx]
        if current is None or current.keys() != state.keys():
            self.layers[layer_idx] = {name: tensor.detach().clone() for name, tensor in state.items()}
            return
        for name, tensor in state.items():
            if current[name].shape == tensor.shape and current[name].dtype == tensor.dtype:
                current[name].copy_(tensor)  # no state here carries gradients (the branch above)
            else:  # e.g. the key/value cache of an attention layer grows
                current[name] = tensor.detach().clone()

    def _hand_over(self, layer_idx: int, state: LayerState) -> bool:
        """During a recording forward without gradients: keep the layer's old tensors as its snapshot and hold the
        forward's new ones instead of copying them in (saves a copy each way). Not for a preallocated cache (its
        buffers keep their address) or a state that shares memory with the old one; False when not done."""
        old = self._layers[layer_idx]
        if self.is_compileable or old is None or old.keys() != state.keys() or torch.is_grad_enabled():
            return False
        old_memory = {t.untyped_storage().data_ptr() for t in old.values()}
        if any(t.untyped_storage().data_ptr() in old_memory for t in state.values()):
            return False
        self._incoming.append(_snapshot(old, state, handed_over=True))
        self._layers[layer_idx] = {name: tensor.detach() for name, tensor in state.items()}
        return True

    def begin_record(self, inputs: torch.Tensor, mask: torch.Tensor | None, replay: Callable) -> None:
        """Announce a recording forward of ``inputs`` (B, L, H), the first layer's inputs, and ``mask`` (B, L) or
        None: each layer's :meth:`update` keeps its state before the forward, and :meth:`advance` files them
        with the inputs as a record that :meth:`crop` can replay (``replay(cache, inputs, mask)``)."""
        if not self.record_past:
            raise ValueError("only a recording cache keeps records; call activate_past_recording() first")
        self._recording = (inputs.detach(), None if mask is None else mask.detach(), replay)
        self._incoming = []

    def advance(self, num_tokens: int) -> None:
        """Record that a forward pass absorbed ``num_tokens`` more tokens into every layer (and, after a
        recording forward, file its record)."""
        if self._recording is not None:
            inputs, mask, replay = self._recording
            self._recording = None
            if len(self._incoming) != len(self._layers) or inputs.shape[1] != num_tokens:
                raise ValueError(
                    f"a recording forward must update every layer once and advance by its {inputs.shape[1]} "
                    f"tokens; got {len(self._incoming)} of {len(self._layers)} layers and {num_tokens} tokens"
                )
            self._records.append(_Record(self.seen_tokens, self._incoming, inputs, mask, replay))
            self._incoming = []
        self.seen_tokens += num_tokens

    def check_room(self, num_tokens: int) -> None:
        """Raise ValueError when ``num_tokens`` more would overflow a preallocated cache's buffers (host integers:
        nothing is read back from the device)."""
        if self.max_length is not None and self.seen_tokens + num_tokens > self.max_length:
            raise ValueError(
                f"the static cache holds {self.max_length} tokens; it has {self.seen_tokens} and got {num_tokens} "
                f"more (preallocate a larger max_length)"
            )

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
        return [False] * len(self._layers)

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
        """Stop recording and drop every record (ordinary decoding keeps none)."""
        self.record_past = False
        self._drop_records()

    def _drop_records(self) -> None:
        self._records, self._recording, self._incoming = [], None, []

    def states_to_record(self, num_tokens: int, rollback: int) -> int:
        """How many of a forward's ``num_tokens`` new tokens a crop may remove afterwards (its last ``rollback``):
        0 unless recording, so ordinary forwards pay nothing. The model records them (:meth:`begin_record`), or
        the whole forward where the tokens before them are few."""
        if not self.record_past:
            return 0
        if isinstance(rollback, bool) or not isinstance(rollback, int) or rollback < 0:
            raise ValueError(f"rollback must be a non-negative integer; got {rollback!r}")
        return min(num_tokens, rollback)

    def rollback_lengths(self) -> list[int]:
        """The token counts :meth:`crop` can return to now (the current one included)."""
        return sorted({self.seen_tokens, *(n for r in self._records for n in range(r.start, r.stop + 1))})

    def crop(self, tokens_to_remove: int) -> None:
        """Return to the state after fewer tokens, exactly, and drop every record.

        Args:
            tokens_to_remove: transformers' convention (5.24): a negative number removes that many of the last
                tokens; 0 removes none (it only drops the records). A positive number is the older convention,
                the number of tokens to keep (transformers' ``DynamicCache.crop(max_length)`` before 5.24).

        The record of the forward that absorbed the token count asked for gives the states before that forward;
        its first inputs up to that count are replayed through the layers (one ordinary forward). The replay is
        deferred: the model's next forward takes those inputs ahead of its own (:meth:`take_pending`), so an
        assisted-decoding round costs one forward, not two; anything that reads the states first (``layers``,
        :meth:`get`, :meth:`save`, :meth:`fork`, ...) runs the replay itself. Either way the states are those of
        a cache fed exactly the kept tokens (and, when merged, the next ones in the same forward). Raises a
        ValueError naming ``tokens_to_remove`` for a crop to more tokens than were absorbed, or to a token count
        no record reaches (only a recording forward keeps one, see :meth:`activate_past_recording`).
        """
        target = self._crop_target(tokens_to_remove)
        if target != self.seen_tokens:
            record = self._record_reaching(target)
            self.layers = [_restore(kept, live) for kept, live in zip(record.incoming, self.layers)]
            self.seen_tokens = record.start  # what the replay continues from
            kept = target - record.start
            if kept:
                mask = None if record.mask is None else record.mask[:, :kept]
                self._pending = (record.inputs[:, :kept], mask, record.replay)
            self.seen_tokens = target
        self._drop_records()

    def take_pending(self) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The first-layer inputs (B, j, H) and mask (B, j) or None of the j tokens a :meth:`crop` kept but has
        not replayed yet, handed to a forward that runs them ahead of its own tokens (the token count steps back
        by j, and the forward's ``advance`` counts them again); None when there are none."""
        if self._pending is None:
            return None
        inputs, mask, _ = self._pending
        self._pending = None
        self.seen_tokens -= inputs.shape[1]
        return inputs, mask

    def _flush(self) -> None:
        """Replay the inputs a crop left pending (one ordinary forward through the layers)."""
        inputs, mask, replay = self._pending
        self._pending = None
        self.seen_tokens -= inputs.shape[1]
        replay(self, inputs, mask)
        self.seen_tokens += inputs.shape[1]

    def _record_reaching(self, target: int) -> _Record | None:
        """The record of the forward after whose first tokens the cache had absorbed ``target`` (None: none)."""
        return next((r for r in self._records if r.start <= target < r.stop), None)

    def _crop_target(self, tokens_to_remove: int) -> int:
        """The token count a crop returns to, checked (see :meth:`crop`)."""
        integral = isinstance(tokens_to_remove, torch.Tensor) and tokens_to_remove.numel() == 1
        if integral and not (tokens_to_remove.is_floating_point() or tokens_to_remove.dtype == torch.bool):
            tokens_to_remove = int(tokens_to_remove)  # what transformers 5.17 passes: a 0-dim tensor
        if isinstance(tokens_to_remove, bool) or not isinstance(tokens_to_remove, int):
            raise ValueError(f"tokens_to_remove must be an integer; got {tokens_to_remove!r}")
        target = self.seen_tokens + tokens_to_remove if tokens_to_remove <= 0 else tokens_to_remove
        if target < 0 or target > self.seen_tokens:
            raise ValueError(
                f"tokens_to_remove={tokens_to_remove} asks for the state after {target} tokens, but the cache has "
                f"absorbed {self.seen_tokens}"
            )
        if target != self.seen_tokens and self._record_reaching(target) is None:
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
        """Apply ``fn`` to every batch-first tensor: the live states and the records' states and inputs."""
        for state in (*self.layers, *(kept for record in self._records for kept in record.incoming)):
            if state is None:
                continue
            for name, tensor in state.items():
                if not isinstance(tensor, _Prefix):
                    state[name] = fn(tensor)
        self._records = [
            r._replace(inputs=fn(r.inputs), mask=None if r.mask is None else fn(r.mask)) for r in self._records
        ]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Select batch rows (beam search): row i becomes the old row ``beam_idx[i]``."""
        self._map_tensors(lambda tensor: tensor.index_select(0, beam_idx.to(tensor.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every batch row ``repeats`` times (expanding a prompt's state to several beams or samples)."""
        self._map_tensors(lambda tensor: tensor.repeat_interleave(repeats, dim=0))

    def reset(self) -> None:
        """Forget every state (the next forward starts a fresh sequence; a preallocated cache stops being one)."""
        self.layers = [None] * len(self._layers)
        self.is_compileable, self.max_length = False, None
        self.seen_tokens = 0
        self._drop_records()

    # ----------------------------------------------------------------------------- size, copies, files
    @property
    def batch_size(self) -> int | None:
        """Rows of the held states, or None before the first forward."""
        return next((next(iter(state.values())).shape[0] for state in self.layers if state), None)

    def memory_bytes(self) -> int:
        """Bytes held by all state tensors (snapshots not included: see :meth:`snapshot_bytes`)."""
        return sum(t.numel() * t.element_size() for state in self.layers if state for t in state.values())

    def snapshot_bytes(self) -> int:
        """Bytes held by rollback records (states before a recording forward, its inputs): 0 outside assisted
        decoding."""
        states = (kept for record in self._records for kept in record.incoming if kept)
        tensors = [t for kept in states for t in kept.values() if not isinstance(t, _Prefix)]
        tensors += [t for r in self._records for t in (r.inputs, r.mask) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    def fork(self) -> RecurrentCache:
        """An independent copy: the same states and token count in new tensors (not recording, no records),
        so that several continuations can start from one prefilled prompt."""
        copy = RecurrentCache(len(self._layers))
        copy.layers = [None if state is None else {n: t.clone() for n, t in state.items()} for state in self.layers]
        copy.seen_tokens, copy.max_length = self.seen_tokens, self.max_length
        copy.is_compileable = self.is_compileable
        if copy.is_compileable:
            _mark_static_addresses(copy.layers)
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


def _mark_static_addresses(states: list[LayerState | None]) -> None:
    """Tell ``torch.compile`` that the tensors of a preallocated cache keep their address: a compiled step that
    writes into them in place can then run as a CUDA graph instead of being skipped for mutating its inputs."""
    if torch.compiler.is_compiling():
        return  # not allowed while tracing; the cache is made before the compiled step
    for state in states:
        for tensor in (state or {}).values():
            torch._dynamo.mark_static_address(tensor)
