"""The one recurrent-state cache every ssmhub family decodes with.

Per layer it holds a small dict of fixed-shape tensors (a DLR layer: its state, real and imaginary planes; later
families: conv windows, shift registers, block states, attention key/values of hybrid layers).
States are allocated lazily by the first forward that asks for them and updated in place after that.
For recurrent layers the memory never grows with the context: that is the product's promise, and
:meth:`RecurrentCache.memory_bytes` lets benchmarks and tests check it.

In a training forward (gradients enabled) the cache keeps the new states *with* their autograd graph, so a
window's loss can reach back into earlier windows if the caller wants that; truncated backpropagation
through time calls :meth:`RecurrentCache.detach_` between windows, which cuts the graph and keeps the values.

It travels through ``generate`` as ``cache`` (``past_key_values`` before transformers 5.24). Only the
few hooks ``generate`` uses are implemented (``get_seq_length``, ``is_linear``, ``reorder_cache``, and for
assisted and prompt-lookup decoding ``activate_past_recording``, ``is_croppable``, ``crop``, and since
transformers 5.25 ``get_recurrent_states_to_keep`` and ``is_recording_past``), so it does
not depend on the internals of transformers' ``Cache`` classes, which changed five times in two years.

Rollback (assisted decoding): a recurrent state cannot be rewound, so :meth:`RecurrentCache.
activate_past_recording` gives the cache a :class:`~ssmhub.rollback.Rollback`, which keeps what forwards need to
return to an earlier state; :meth:`RecurrentCache.crop` and the other rollback hooks delegate to it. Without it the
cache keeps nothing.

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

import torch

from .cache_files import read_cache_file, write_cache_file
from .ops.dlr import dlr_state_planes
from .rollback import Rollback

__all__ = ["RecurrentCache"]

LayerState = dict[str, torch.Tensor]

# How a state written by an older ssmhub becomes today's, per field (applied by RecurrentCache.from_state_dict, where
# every saved state comes back: prompt caches, stateful-training checkpoints). Format 1 held DLR's state as complex64
# (B, H, N); format 2 (issue 45) holds it as float32 real and imaginary planes (B, H, 2, N).
_STATE_UPGRADES = {"dlr_state": lambda tensor: dlr_state_planes(tensor) if tensor.is_complex() else tensor}


class RecurrentCache:
    """Recurrent state of every layer of a model, plus the number of tokens it has absorbed.

    Args:
        num_layers: number of layers whose state it holds.
    """

    is_compileable = False
    is_croppable = True  # while recording, crop rolls back exactly (ssmhub.rollback)

    def __init__(self, num_layers: int):
        if num_layers < 1:
            raise ValueError(f"num_layers must be positive; got {num_layers}")
        self.layers: list[LayerState | None] = [None] * num_layers  # each layer's state (None before its first token)
        self.seen_tokens = 0
        self.max_length: int | None = None  # a preallocated cache's bound on its tokens, if it has one
        self.rollback: Rollback | None = None  # while recording (assisted decoding): what a crop returns to

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
    def record_past(self) -> bool:
        """Whether forwards keep what a :meth:`crop` returns to (:meth:`activate_past_recording`)."""
        return self.rollback is not None

    def __len__(self) -> int:
        return len(self.layers)

    def __repr__(self) -> str:
        filled = sum(state is not None for state in self.layers)
        return (
            f"RecurrentCache(num_layers={len(self)}, filled={filled}, seen_tokens={self.seen_tokens}, "
            f"memory_bytes={self.memory_bytes()}" + (f", {self.rollback!r}" if self.rollback else "") + ")"
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
        (the old state, saved by the forward that read it). :meth:`detach_` cuts the graph later.
        """
        if torch.is_grad_enabled() and any(tensor.requires_grad for tensor in state.values()):
            self.layers[layer_idx] = dict(state)
            return
        current = self.layers[layer_idx]
        if current is None or current.keys() != state.keys():
            self.layers[layer_idx] = {name: _buffer(tensor) for name, tensor in state.items()}
            return
        for name, tensor in state.items():
            if current[name].shape == tensor.shape and current[name].dtype == tensor.dtype:
                current[name].copy_(tensor)  # no state here carries gradients (the branch above)
            else:  # e.g. the key/value cache of an attention layer grows
                current[name] = _buffer(tensor)

    def advance(self, num_tokens: int) -> None:
        """Record that a forward pass absorbed ``num_tokens`` more tokens into every layer."""
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

    # ----------------------------------------------------------------------------- rollback (ssmhub.rollback)
    def activate_past_recording(self, recurrent_states_to_keep: int | None = None) -> None:
        """Keep, from the next forward on, the states a :meth:`crop` can return to (transformers' assisted
        decoding calls this on the verifier's cache; ssmhub's ``generate`` on the verifier's and an assistant's,
        :func:`ssmhub.models.generation.record_for_assisted_decoding`): the cache gets a
        :class:`~ssmhub.rollback.Rollback`, or keeps the one it has.

        Args:
            recurrent_states_to_keep: transformers' protocol (5.25): a crop may remove up to this many of a
                forward's last tokens. transformers' own linear-attention layers compute and keep that many
                intermediate states; ssmhub keeps the states before the forward and its inputs, and a crop replays
                the kept tokens (:mod:`ssmhub.rollback`), which is exact at every state kind (attention keys, shift
                windows, modal, block and resampled states). None leaves the number as it was (0 at first: each
                forward's own reach, :func:`~ssmhub.models.generation.rollback_reach`).
        """
        keep = recurrent_states_to_keep
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 0):
            raise ValueError(f"recurrent_states_to_keep must be a non-negative integer or None; got {keep!r}")
        if self.rollback is None:
            self.rollback = Rollback()
        if keep is not None:
            self.rollback.states_to_keep = keep

    def is_recording_past(self, layer_idx: int = 0) -> bool:
        """transformers' ``Cache.is_recording_past``: whether forwards keep what a :meth:`crop` returns to (every
        layer alike)."""
        return self.record_past

    def get_recurrent_states_to_keep(self, layer_idx: int | None = None) -> int:
        """transformers' ``Cache.get_recurrent_states_to_keep`` (5.25): how many of a forward's last tokens a crop
        may remove, as set by :meth:`activate_past_recording`; 0 when not recording. ssmhub's layers never read it:
        the rollback records the states before a forward instead of the layers computing intermediate ones."""
        return self.rollback.states_to_keep if self.rollback is not None else 0

    def deactivate_past_recording(self) -> None:
        """Stop recording and drop every record (ordinary decoding keeps none), after replaying what a deferred
        crop kept (:meth:`ssmhub.rollback.Rollback.settle`)."""
        if self.rollback is not None:
            self.rollback.settle(self)
        self.rollback = None

    def crop(self, tokens_to_remove: int) -> None:
        """Return to the state after fewer tokens, exactly, and drop every record (transformers' ``crop``).

        Args:
            tokens_to_remove: transformers' convention (5.24): a negative number removes that many of the last
                tokens; 0 removes none (it only drops the records). A positive number is the older convention,
                the number of tokens to keep (transformers' ``DynamicCache.crop(max_length)`` before 5.24).

        The states are then those of a cache fed exactly the kept tokens (:meth:`ssmhub.rollback.Rollback.crop`).
        Raises a ValueError naming ``tokens_to_remove`` for a crop to more tokens than were absorbed, or to a token
        count no record reaches (only a forward after :meth:`activate_past_recording` keeps one).
        """
        (self.rollback or Rollback()).crop(self, tokens_to_remove)

    def rollback_lengths(self) -> list[int]:
        """The token counts :meth:`crop` can return to now (the current one included)."""
        return self.rollback.lengths(self) if self.rollback else [self.seen_tokens]

    def snapshot_bytes(self) -> int:
        """Bytes held by rollback records (states before a recording forward, its inputs): 0 outside assisted
        decoding."""
        return self.rollback.snapshot_bytes() if self.rollback else 0

    # ----------------------------------------------------------------------------- batch rows
    def _map_tensors(self, fn) -> None:
        """Apply ``fn`` to every batch-first tensor: the live states and what a rollback keeps."""
        for state in self.layers:
            for name, tensor in (state or {}).items():
                state[name] = fn(tensor)
        if self.rollback is not None:
            self.rollback.map_tensors(fn)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Select batch rows (beam search): row i becomes the old row ``beam_idx[i]``."""
        self._map_tensors(lambda tensor: tensor.index_select(0, beam_idx.to(tensor.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every batch row ``repeats`` times (expanding a prompt's state to several beams or samples)."""
        self._map_tensors(lambda tensor: tensor.repeat_interleave(repeats, dim=0))

    def reset(self) -> None:
        """Forget every state (the next forward starts a fresh sequence; a preallocated cache stops being one)."""
        self.layers = [None] * len(self.layers)
        self.is_compileable, self.max_length = False, None
        self.seen_tokens = 0
        if self.rollback is not None:
            self.rollback.forget()

    # ----------------------------------------------------------------------------- size, copies, files
    @property
    def batch_size(self) -> int | None:
        """Rows of the held states, or None before the first forward."""
        return next((next(iter(state.values())).shape[0] for state in self.layers if state), None)

    def memory_bytes(self) -> int:
        """Bytes held by all state tensors (snapshots not included: see :meth:`snapshot_bytes`)."""
        return sum(t.numel() * t.element_size() for state in self.layers if state for t in state.values())

    def fork(self) -> RecurrentCache:
        """An independent copy: the same states and token count in new tensors (not recording, no records),
        so that several continuations can start from one prefilled prompt."""
        copy = RecurrentCache(len(self.layers))
        copy.layers = [None if state is None else {n: t.clone() for n, t in state.items()} for state in self.layers]
        copy.seen_tokens, copy.max_length = self.seen_tokens, self.max_length
        copy.is_compileable = self.is_compileable
        if copy.is_compileable:
            _mark_static_addresses(copy.layers)
        return copy

    # ----------------------------------------------------------------------------- the one state format
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The cache as flat tensors: ``layers.<i>.<field>`` for each layer's state (detached; a layer with no state
        yet has no entry) and ``seen_tokens`` (a 0-d int64 tensor). The one format of every state ssmhub writes or
        hands over: prompt caches on disk (:meth:`save`), the carried states of stateful-training checkpoints and
        :meth:`from_state_dict`. A replay that a deferred crop left pending runs first."""
        if self.rollback is not None:
            self.rollback.settle(self)
        tensors = {
            f"layers.{i}.{name}": tensor.detach()
            for i, state in enumerate(self.layers)
            if state is not None
            for name, tensor in state.items()
        }
        return {**tensors, "seen_tokens": torch.tensor(self.seen_tokens, dtype=torch.int64, device="cpu")}

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor], num_layers: int, device=None) -> RecurrentCache:
        """A cache holding ``state`` (:meth:`state_dict`'s format, or an older one: see ``_STATE_UPGRADES``), its
        tensors moved to ``device`` if given. A ValueError names a key that is not ``seen_tokens`` or
        ``layers.<i>.<field>`` with i < ``num_layers``."""
        cache = cls(num_layers)
        for key, tensor in state.items():
            if key == "seen_tokens":
                cache.seen_tokens = int(tensor)
                continue
            _, index, field = [*key.split(".", 2), "", ""][:3]
            if not key.startswith("layers.") or not index.isdigit() or int(index) >= num_layers or not field:
                raise ValueError(
                    f"state has key {key!r}; expected 'seen_tokens' or 'layers.<i>.<field>' with i < {num_layers}"
                )
            layer = cache.layers[int(index)] or {}
            tensor = _STATE_UPGRADES.get(field, lambda kept: kept)(tensor)
            layer[field] = tensor if device is None else tensor.to(device)
            cache.layers[int(index)] = layer
        return cache

    def save(self, path: str | os.PathLike, model) -> None:
        """Write the cache (a prefilled prompt of ``model``) to one safetensors file, atomically, with what
        identifies ``model`` (:mod:`ssmhub.cache_files`). A ValueError names ``cache`` if it is empty."""
        write_cache_file(self.state_dict(), path, model)

    @classmethod
    def load(cls, path: str | os.PathLike, model, batch_size: int | None = None) -> RecurrentCache:
        """Read a cache written by :meth:`save` for ``model``, on its device, ready for ``generate(...,
        cache=...)``. A file written for another model, dtype or ``batch_size`` (if given) is a ValueError
        naming the mismatch (``model_type``, ``config_hash``, ``weights_fingerprint``, ``dtype``,
        ``batch_size``)."""
        state = read_cache_file(path, model, batch_size)
        return cls.from_state_dict(state, model.config.num_hidden_layers, device=model.device)


def _mark_static_addresses(states: list[LayerState | None]) -> None:
    """Tell ``torch.compile`` that the tensors of a preallocated cache keep their address: a compiled step that
    writes into them in place can then run as a CUDA graph instead of being skipped for mutating its inputs."""
    if torch.compiler.is_compiling():
        return  # not allowed while tracing; the cache is made before the compiled step
    for state in states:
        for tensor in (state or {}).values():
            torch._dynamo.mark_static_address(tensor)


def _buffer(tensor: torch.Tensor) -> torch.Tensor:
    """A detached, row-major copy of ``tensor``: the cache's buffer for it. A forward may return a state in whatever
    layout its last op left (H3's modal state with the batch innermost); the one-pass decode kernels
    (:mod:`ssmhub.ops.row_tables`) read a buffer in place only where each row's block is contiguous."""
    return tensor.detach().clone(memory_format=torch.contiguous_format)
