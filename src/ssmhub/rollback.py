"""Exact rollback of a :class:`~ssmhub.cache.RecurrentCache`, for assisted and prompt-lookup decoding.

Speculative decoding (Leviathan et al., arXiv 2211.17192, §2 and Algorithm 1) checks k draft tokens with one
forward of the target model and keeps the accepted prefix; transformers then calls ``cache.crop`` to forget the
rest. A recurrent state cannot be rewound, so while a cache records (``cache.activate_past_recording()``, which
transformers' assisted decoding calls) it holds a :class:`Rollback`, and each forward files a :class:`_Record` with
it: each layer's state before the forward and the forward's first-layer inputs (B, L, H). The forward itself is an
ordinary parallel one, so checking k drafts costs one forward, not k steps. A crop to the state after j of its
tokens puts back the states before it and replays its first j inputs through the layers: at once, or, when
:attr:`Rollback.defer_replay` (``generate``'s assisted decoding, where a forward follows every crop), ahead of the
next forward's own tokens in the same pass, so a round still costs one forward.

The cache then holds the states of a cache fed those j tokens (and, when merged, the next forward's), to float32
round-off: the replay runs the same layers on the same inputs, but inside a forward of another length, whose BLAS
and FFT kernels may block and round the sums differently (by thread count, instruction set, device). So greedy
assisted decoding gives plain greedy's tokens unless two logits tie within that round-off. The records live until
the next crop; a cache that does not record keeps nothing. A field that grows with the tokens (attention's keys,
values and key mask) is not copied: keys are only ever appended, so its snapshot is the length of a prefix of the
live tensor.

The model's forward reaches this module through one hook, :func:`run_with_rollback`. A *layer pass* is the
model's block stack as a callable ``layers(hidden_states, mask, cache) -> (output, per-layer inputs)`` that reads
each layer's state with ``cache.get(idx)`` and stores the new one with ``cache.update(idx, state)`` (it does not
count tokens: the forward advances the cache by its own new tokens afterwards).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

__all__ = ["Rollback", "run_with_rollback"]

LayerPass = Callable  # (hidden_states (B, L, H), mask (B, L) or None, cache) -> (output, per-layer inputs)


class _Prefix(NamedTuple):
    """A snapshot of a growing field: the first ``length`` entries of the live tensor along ``dim``."""

    dim: int
    length: int


class _Record(NamedTuple):
    """What a recorded piece of a forward leaves so that a crop can return to the state after any of its tokens:
    the tokens absorbed before it, each layer's state then (:func:`_snapshot`), its first-layer inputs (B, L, H) and
    mask (B, L) or None, and the layer pass that ran it (which replays them)."""

    start: int
    incoming: list[dict | None]
    inputs: torch.Tensor
    mask: torch.Tensor | None
    layers: LayerPass

    @property
    def stop(self) -> int:
        return self.start + self.inputs.shape[1]


def _snapshot(state: dict | None, final: dict, handed_over: bool = False) -> dict | None:
    """``state`` kept safe from later in-place updates of the cache: copied, or as it is when ``handed_over`` (the
    cache stops using its tensors, see :meth:`_RecordingCache.update`); a field whose shape differs from ``final``'s
    grows with the tokens (keys are only appended) and is kept as a :class:`_Prefix`."""
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


def _restore(snapshot: dict | None, live: dict | None) -> dict | None:
    """The layer state a snapshot stands for: its tensors (restored once: a crop drops every record), and
    prefixes cut from the live tensors."""
    if snapshot is None:
        return None
    return {
        name: live[name].narrow(kept.dim, 0, kept.length).clone() if isinstance(kept, _Prefix) else kept
        for name, kept in snapshot.items()
    }


class _RecordingCache:
    """The cache as the layers of a recorded piece see it: reads pass through, and each update first keeps the
    layer's state before the piece, in ``incoming``."""

    def __init__(self, cache):
        self.cache = cache
        self.incoming: list[dict | None] = []

    def get(self, layer_idx: int) -> dict | None:
        return self.cache.get(layer_idx)

    def update(self, layer_idx: int, state: dict) -> None:
        if not self._hand_over(layer_idx, state):
            self.incoming.append(_snapshot(self.cache.layers[layer_idx], state))
            self.cache.update(layer_idx, state)

    def _hand_over(self, layer_idx: int, state: dict) -> bool:
        """Without gradients: keep the layer's old tensors as its snapshot and hold the piece's new ones instead of
        copying them in (saves a copy each way). Not for a preallocated cache (its buffers keep their address) or a
        state that shares memory with the old one; False when not done."""
        old = self.cache.layers[layer_idx]
        if self.cache.is_compileable or old is None or old.keys() != state.keys() or torch.is_grad_enabled():
            return False
        old_memory = {t.untyped_storage().data_ptr() for t in old.values()}
        if any(t.untyped_storage().data_ptr() in old_memory for t in state.values()):
            return False
        self.incoming.append(_snapshot(old, state, handed_over=True))
        self.cache.layers[layer_idx] = {name: tensor.detach() for name, tensor in state.items()}
        return True

    def record(self, start: int, inputs: torch.Tensor, mask: torch.Tensor | None, layers: LayerPass) -> _Record:
        """The piece's record, once its layer pass has updated every layer once."""
        if len(self.incoming) != len(self.cache):
            raise ValueError(
                f"a recorded layer pass must update every layer once; it updated {len(self.incoming)} of "
                f"{len(self.cache)}"
            )
        return _Record(start, self.incoming, inputs.detach(), None if mask is None else mask.detach(), layers)


def _pieces(seq_len: int, recorded: int, replayed: int = 0) -> list[tuple[int, int, bool]]:
    """``(start, stop, record)`` runs of a forward. A recording forward files the ``recorded`` last tokens as a
    record (a crop replays its kept part); a long head before them (a prompt with its first drafts) runs first as
    an ordinary pass, so a crop never replays it, while a short one (the last accepted token before the drafts,
    after the ``replayed`` tokens a crop left pending) joins the record, so verifying k drafts stays one forward."""
    if not recorded:
        return [(0, seq_len, False)]
    head = seq_len - recorded
    if head <= recorded + replayed:
        return [(0, seq_len, True)]
    return [(0, head, False), (head, seq_len, True)]


def _after_pending(pending: _Record, hidden_states: torch.Tensor, mask: torch.Tensor | None):
    """The first-layer inputs and mask of the tokens a crop kept (``pending``: (B, j, H), (B, j) or None) followed
    by a forward's own (B, L, H) and (B, L) or None: (B, j + L, H) and (B, j + L) or None."""
    if mask is not None or pending.mask is not None:
        ones = mask if mask is not None else pending.mask
        mask = torch.cat([
            pending.mask if pending.mask is not None else ones.new_ones(pending.inputs.shape[:2]),
            mask if mask is not None else ones.new_ones(hidden_states.shape[:2]),
        ], dim=1)  # fmt: skip
    return torch.cat([pending.inputs.to(hidden_states.dtype), hidden_states], dim=1), mask


def _rows_mapped(record: _Record, fn: Callable[[torch.Tensor], torch.Tensor]) -> _Record:
    """``record`` with ``fn`` applied to its inputs and mask (its states are mapped in place by the caller)."""
    return record._replace(inputs=fn(record.inputs), mask=None if record.mask is None else fn(record.mask))


def _joined(pieces: list[tuple], replayed: int) -> tuple[torch.Tensor, tuple]:
    """The layer passes' outputs (and per-layer inputs) of consecutive pieces as one pass's, without the first
    ``replayed`` tokens (those a crop kept, run ahead of the forward's own)."""
    outputs, inputs = zip(*pieces)
    hidden_states = (outputs[0] if len(outputs) == 1 else torch.cat(outputs, 1))[:, replayed:]
    return hidden_states, tuple((h[0] if len(h) == 1 else torch.cat(h, 1))[:, replayed:] for h in zip(*inputs))


class Rollback:
    """The records of a recording cache and the crop that returns to them (see the module docstring).

    ``defer_replay``: a crop leaves the kept tokens' replay to the next forward (:meth:`forward`), which runs them
    ahead of its own in one pass; until then the cache counts them but its states are those before them (only
    :meth:`settle` and that forward read them). For a caller that runs a forward after every crop, as transformers'
    assisted decoding does; off, a crop replays at once and the cache can be read right after it.

    ``states_to_keep``: transformers' ``recurrent_states_to_keep`` (5.25), the number of a forward's last tokens a
    crop may remove whatever the forward's own reach (:func:`ssmhub.models.generation.rollback_reach`); 0 adds none.
    """

    def __init__(self, defer_replay: bool = False, states_to_keep: int = 0):
        self.defer_replay = defer_replay
        self.states_to_keep = states_to_keep
        self.records: list[_Record] = []  # the recorded pieces since the last crop, oldest first
        self.pending: _Record | None = None  # the kept part of a record that a deferred crop has not replayed

    def __repr__(self) -> str:
        pending = 0 if self.pending is None else self.pending.inputs.shape[1]
        return (
            f"Rollback(records={len(self.records)}, pending_replay={pending}, defer_replay={self.defer_replay}, "
            f"states_to_keep={self.states_to_keep})"
        )

    def forward(self, layers: LayerPass, hidden_states, mask, cache, *, use_cache: bool, packed: bool, reach: int):
        """The layer pass of a forward on ``cache`` (:func:`run_with_rollback`): the tokens a deferred crop kept run
        ahead of the forward's own, and the last ``reach`` tokens are recorded so that a crop can remove them.
        Packed rows (``packed``) cannot be recorded; a forward that does not update the cache records nothing."""
        if not use_cache or packed:
            if use_cache and self._recorded(hidden_states.shape[1], reach):
                raise ValueError(
                    "a recording cache (assisted decoding) cannot take packed rows (position_ids restarting, seq_idx)"
                )
            self.settle(cache)
            return layers(hidden_states, mask, cache)
        replayed = 0 if self.pending is None else self.pending.inputs.shape[1]
        recorded = self._recorded(replayed + hidden_states.shape[1], reach)
        if self.pending is not None:
            hidden_states, mask = _after_pending(self.pending, hidden_states, mask)  # (B, replayed + L, H), (B, ...)
            self.pending = None
        first = cache.seen_tokens - replayed  # the tokens absorbed before the pass (the kept ones are counted)
        pieces = _pieces(hidden_states.shape[1], recorded, replayed)
        return _joined([self._run_piece(layers, hidden_states, mask, cache, first, p) for p in pieces], replayed)

    def _run_piece(self, layers: LayerPass, hidden_states, mask, cache, first: int, piece: tuple[int, int, bool]):
        """One ``(start, stop, record)`` piece of a pass that starts after the cache's ``first`` tokens, filed as a
        record if ``record``."""
        start, stop, record = piece
        inputs, mask = hidden_states[:, start:stop], None if mask is None else mask[:, start:stop]
        if not record:
            return layers(inputs, mask, cache)
        recording = _RecordingCache(cache)
        outputs = layers(inputs, mask, recording)
        self.records.append(recording.record(first + start, inputs, mask, layers))
        return outputs

    def _recorded(self, num_tokens: int, reach: int) -> int:
        """How many of a pass's ``num_tokens`` tokens a crop may remove afterwards: its last ``reach``, or
        :attr:`states_to_keep` if more."""
        if isinstance(reach, bool) or not isinstance(reach, int) or reach < 0:
            raise ValueError(f"rollback must be a non-negative integer; got {reach!r}")
        return min(num_tokens, max(reach, self.states_to_keep))

    def settle(self, cache) -> None:
        """Replay the tokens a deferred crop kept (one pass through the layers): the states are then those after
        every token the cache counts."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.layers(pending.inputs, pending.mask, cache)

    def crop(self, cache, tokens_to_remove: int) -> None:
        """:meth:`ssmhub.cache.RecurrentCache.crop`: return ``cache`` to the state after fewer tokens, exactly, and
        drop every record. The record of the piece that absorbed the token count asked for gives the states before
        it; its first inputs up to that count are replayed through the layers (at once, or by the next forward when
        :attr:`defer_replay`)."""
        target = self._target(cache, tokens_to_remove)
        if target != cache.seen_tokens:
            record = self._reaching(target)
            cache.layers = [_restore(kept, live) for kept, live in zip(record.incoming, cache.layers)]
            kept = target - record.start
            mask = None if record.mask is None else record.mask[:, :kept]
            self.pending = record._replace(incoming=[], inputs=record.inputs[:, :kept], mask=mask) if kept else None
            cache.seen_tokens = target
        self.records = []
        if not self.defer_replay:
            self.settle(cache)

    def _reaching(self, target: int) -> _Record | None:
        """The record of the piece after whose first tokens the cache had absorbed ``target`` (None: none)."""
        return next((r for r in self.records if r.start <= target < r.stop), None)

    def _target(self, cache, tokens_to_remove: int) -> int:
        """The token count a crop returns to, checked (see :meth:`ssmhub.cache.RecurrentCache.crop`)."""
        integral = isinstance(tokens_to_remove, torch.Tensor) and tokens_to_remove.numel() == 1
        if integral and not (tokens_to_remove.is_floating_point() or tokens_to_remove.dtype == torch.bool):
            tokens_to_remove = int(tokens_to_remove)  # what transformers 5.17 passes: a 0-dim tensor
        if isinstance(tokens_to_remove, bool) or not isinstance(tokens_to_remove, int):
            raise ValueError(f"tokens_to_remove must be an integer; got {tokens_to_remove!r}")
        target = cache.seen_tokens + tokens_to_remove if tokens_to_remove <= 0 else tokens_to_remove
        if target < 0 or target > cache.seen_tokens:
            raise ValueError(
                f"tokens_to_remove={tokens_to_remove} asks for the state after {target} tokens, but the cache has "
                f"absorbed {cache.seen_tokens}"
            )
        if target != cache.seen_tokens and self._reaching(target) is None:
            how = (
                "only a forward after activate_past_recording() keeps earlier states"
                if not cache.record_past
                else f"it kept the states after {self.lengths(cache)} tokens"
            )
            raise ValueError(
                f"tokens_to_remove={tokens_to_remove}: the cache cannot return to the state after {target} "
                f"tokens: {how}"
            )
        return target

    def lengths(self, cache) -> list[int]:
        """The token counts a crop of ``cache`` can return to now (the current one included)."""
        return sorted({cache.seen_tokens, *(n for r in self.records for n in range(r.start, r.stop + 1))})

    def snapshot_bytes(self) -> int:
        """Bytes held by the records (states before a recorded piece, its inputs)."""
        states = (kept for record in self.records for kept in record.incoming if kept)
        tensors = [t for kept in states for t in kept.values() if not isinstance(t, _Prefix)]
        tensors += [t for r in self.records for t in (r.inputs, r.mask) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Apply ``fn`` to every batch-first tensor held (the records' states and inputs, a pending replay's
        inputs): how the cache's batch rows are reordered or repeated."""
        for kept in (kept for record in self.records for kept in record.incoming if kept):
            for name, tensor in kept.items():
                if not isinstance(tensor, _Prefix):
                    kept[name] = fn(tensor)
        self.records = [_rows_mapped(record, fn) for record in self.records]
        self.pending = None if self.pending is None else _rows_mapped(self.pending, fn)

    def forget(self) -> None:
        """Drop every record and any pending replay (the cache's states were reset)."""
        self.records, self.pending = [], None


def run_with_rollback(layers: LayerPass, hidden_states, mask, cache, *, use_cache: bool, packed: bool, reach: int):
    """The model forward's one hook into rollback: ``layers(hidden_states, mask, cache)`` (see the module docstring),
    or, while ``cache`` records, :meth:`Rollback.forward` (``reach``: how many of the new tokens a crop may remove,
    :func:`ssmhub.models.generation.rollback_reach`; ``packed``: rows holding several documents)."""
    if cache is None or cache.rollback is None:
        return layers(hidden_states, mask, cache)
    return cache.rollback.forward(layers, hidden_states, mask, cache, use_cache=use_cache, packed=packed, reach=reach)
