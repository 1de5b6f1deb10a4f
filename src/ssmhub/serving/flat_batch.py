"""A serving engine's flat batch, mapped onto the mixer protocol: written once for every family.

An engine with continuous batching (vLLM) runs one forward over the tokens of many requests at once, flattened
into one dimension, with each request's recurrent state in a slot of a preallocated table:

- the batch holds ``num_decodes`` decode rows first (one token each), then prefill segments (a prompt, or a chunk
  of one), at the token offsets ``query_start_loc`` (R + 1,);
- ``seq_lens`` (R,) counts each request's tokens so far, this step's included: a segment continues the state its
  request's earlier chunk stored when ``seq_lens[r]`` exceeds its length, else it starts a new request;
- ``slots`` (R,) is each request's row in the state tables.

:func:`mix_flat_batch` runs a :class:`~ssmhub.layers.mixer.TokenMixer` on such a batch: the decode rows as one
batched :meth:`~ssmhub.layers.mixer.TokenMixer.step` from their slots' states, each prefill segment as the mixer's
own parallel forward from its stored state (or from the start), and writes every request's new state back into its
slot in place. No family's math is written here: the numbers are those of ``forward`` and ``step``. A one-token
request that is new (``seq_lens`` 1; an engine counts it among the decodes) starts from the state before a first
token, not from whatever its slot held before, so a reused slot starts clean.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

import torch

from ..layers.mixer import MixerState, TokenMixer

__all__ = ["Decode", "FlatBatch", "StepBatches", "compiled_decode", "decode_rows", "mix_flat_batch"]

Decode = Callable[[TokenMixer, torch.Tensor, MixerState, torch.Tensor, torch.Tensor, MixerState], torch.Tensor]


@dataclass(frozen=True)
class FlatBatch:
    """Where each request's tokens and state are: host-side integers (read once per engine step, not per layer).

    ``starts``/``lengths``: each request's token offset and count in the flat batch; ``continues``: whether it
    continues a stored state; ``slots``: its row in the state tables; the first ``num_decodes`` requests are one-token
    decode rows."""

    num_decodes: int
    starts: tuple[int, ...]
    lengths: tuple[int, ...]
    continues: tuple[bool, ...]
    slots: torch.Tensor  # (R,) int64, on the states' device

    @classmethod
    def from_offsets(cls, num_decodes: int, query_start_loc, seq_lens, slots: torch.Tensor) -> FlatBatch:
        """From an engine's ``query_start_loc`` (R + 1,), ``seq_lens`` (R,) and slot indices (≥ R,)."""
        offsets = [int(v) for v in query_start_loc.tolist()]
        lengths = tuple(b - a for a, b in pairwise(offsets))
        seen = [int(v) for v in seq_lens.tolist()][: len(lengths)]
        continues = tuple(total > length for total, length in zip(seen, lengths))
        if any(length != 1 for length in lengths[:num_decodes]):
            raise ValueError(f"decode rows must hold one token each; got lengths {lengths[:num_decodes]}")
        return cls(num_decodes, tuple(offsets[:-1]), lengths, continues, slots[: len(lengths)].long())

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    @functools.cached_property
    def fresh_decodes(self) -> torch.Tensor:
        """(num_decodes,) bool on the slots' device: the decode rows that start a new request (none of its state
        stored), which start from the state before a first token."""
        return torch.tensor([not c for c in self.continues[: self.num_decodes]], device=self.slots.device)

    def with_slots(self, slots: torch.Tensor) -> FlatBatch:
        """The same requests at other slot indices (≥ R,): another state table's (an engine's KV-cache group)."""
        return dataclasses.replace(self, slots=slots[: len(self.lengths)].long())


class StepBatches:
    """The flat batch of the engine step running now, read once and handed to every layer of the step.

    Reading a batch's offsets into host integers (:meth:`FlatBatch.from_offsets`) costs a few device reads and some
    Python; an engine gives every layer of a step the same offsets, so they are read at the step's first layer and
    kept while ``step`` (an object the engine makes anew for each step, held here so that identity names it) and
    the offsets tensor stay the same. A layer whose slot indices are another tensor (its own KV-cache group) gets
    the kept batch with its slots."""

    def __init__(self):
        self._key: tuple[object, torch.Tensor, torch.Tensor] | None = None  # (step, offsets, slots) read
        self._batch: FlatBatch | None = None

    def batch(self, step: object, num_decodes: int, query_start_loc, seq_lens, slots: torch.Tensor) -> FlatBatch:
        """The step's :class:`FlatBatch` (the arguments as :meth:`FlatBatch.from_offsets` takes them)."""
        key = self._key
        if key is None or key[0] is not step or key[1] is not query_start_loc:
            self._batch = FlatBatch.from_offsets(num_decodes, query_start_loc, seq_lens, slots)
        elif key[2] is not slots:
            self._batch = self._batch.with_slots(slots)
        self._key = (step, query_start_loc, slots)
        return self._batch


def _gather(tables: MixerState, slots: torch.Tensor) -> MixerState:
    return {name: table.index_select(0, slots) for name, table in tables.items()}


def _scatter(tables: MixerState, slots: torch.Tensor, state: MixerState) -> None:
    for name, table in tables.items():
        table.index_copy_(0, slots, state[name].to(table.dtype))


def _step(
    mixer: TokenMixer, x: torch.Tensor, state: MixerState, coefficients: MixerState | None
) -> tuple[torch.Tensor, MixerState]:
    return mixer.step(x, state, coefficients)


def decode_rows(
    mixer: TokenMixer,
    x: torch.Tensor,
    tables: MixerState,
    slots: torch.Tensor,
    new: torch.Tensor,
    coefficients: MixerState | None = None,
    step=None,
) -> torch.Tensor:
    """Decode rows x (N, D) as one batched step of their slots' states, in place
    (:meth:`~ssmhub.layers.mixer.TokenMixer.step_rows_`; ``new`` (N,) bool: those reset to the state before a first
    token; ``coefficients`` the mixer's :meth:`~ssmhub.layers.mixer.TokenMixer.step_coefficients`, None: its kept
    ones; ``step`` a compiled stand-in for its step). Returns (N, D_out)."""
    return mixer.step_rows_(x, tables, slots, new, coefficients, step)


@functools.cache
def _compiled(function):
    return torch.compile(function, dynamic=True)  # one graph for every layer of a family and every number of rows


def compiled_decode(mixer: TokenMixer) -> Decode:
    """:func:`decode_rows` compiled for ``mixer`` (``torch.compile``, dynamic batch): as it is where the mixer steps
    its rows in one pass with a kernel of its own (``not mixer.compiles_whole_step``); whole where its state is one
    tensor, so the gather, the state update and the write-back fuse into one pass over the slots; else the step
    alone, gathered and written back eagerly (several states are views of one byte page, whose in-place update
    torch.compile refuses). The same numbers as eager up to float32 round-off (fused, reordered sums)."""
    if not mixer.compiles_whole_step:  # its own kernel: nothing left for Inductor to fuse
        return decode_rows
    if len(mixer.state_layout(1)) == 1:
        return _eager_on_failure(_compiled(decode_rows), decode_rows)
    return _eager_on_failure(functools.partial(decode_rows, step=_compiled(_step)), decode_rows)


def _eager_on_failure(compiled: Decode, eager: Decode) -> Decode:
    """``compiled``, or ``eager`` from the first call torch.compile fails on (it fails while compiling, before the
    graph touches a slot), with a warning naming the failure: a serving engine keeps serving."""
    chosen = [compiled]

    def decode(*args):
        if chosen[0] is compiled:
            try:
                return compiled(*args)
            except torch._dynamo.exc.TorchDynamoException as error:
                warnings.warn(f"torch.compile failed on the decode rows ({type(error).__name__}: {error}"[:300]
                              + "); decoding them eagerly", RuntimeWarning, stacklevel=2)  # fmt: skip
                chosen[0] = eager
        return eager(*args)

    return decode


def _decode(mixer: TokenMixer, x: torch.Tensor, batch: FlatBatch, tables: MixerState, decode: Decode) -> torch.Tensor:
    """The decode rows, x (N, D); new requests among them start from a fresh state. The mixer's step coefficients
    come from here, formed eagerly once for as long as its weights do not change
    (:meth:`~ssmhub.layers.mixer.TokenMixer.kept_step_coefficients`), and enter a compiled ``decode`` as inputs:
    inside its graph they would be recomputed for every row they fuse into."""
    slots = batch.slots[: batch.num_decodes]
    return decode(mixer, x, tables, slots, batch.fresh_decodes, mixer.kept_step_coefficients())


def _prefill(mixer: TokenMixer, x: torch.Tensor, request: int, batch: FlatBatch, tables: MixerState) -> torch.Tensor:
    """One prefill segment, x (L, D), by the mixer's parallel forward from its stored state or from the start."""
    slot = batch.slots[request : request + 1]
    state = _gather(tables, slot) if batch.continues[request] else None
    y, state = mixer(x[None], state=state, return_state=True)  # (1, L, D_out)
    _scatter(tables, slot, state)
    return y[0]


def mix_flat_batch(
    mixer: TokenMixer, x: torch.Tensor, batch: FlatBatch, tables: MixerState, decode: Decode = decode_rows
) -> torch.Tensor:
    """``mixer`` over a flat batch: x (T, D), T ≥ ``batch.num_tokens`` (rows past them, an engine's padding, give
    zeros); ``tables`` the mixer's state names -> (slots, *shape) tensors, updated in place; ``decode`` runs the
    decode rows (:func:`decode_rows`, or it compiled). Returns (T, D_out)."""
    parts = []
    if batch.num_decodes:
        parts.append(_decode(mixer, x[: batch.num_decodes], batch, tables, decode))
    for request in range(batch.num_decodes, len(batch.lengths)):
        start, length = batch.starts[request], batch.lengths[request]
        parts.append(_prefill(mixer, x[start : start + length], request, batch, tables))
    out_size = getattr(mixer, "output_size", mixer.hidden_size)
    padding = x.shape[0] - batch.num_tokens
    if padding:
        parts.append(x.new_zeros(padding, out_size))
    return torch.cat(parts) if parts else x.new_zeros(0, out_size)
