"""The token-mixer protocol, written once: every mixer in :mod:`ssmhub.layers` subclasses :class:`TokenMixer`.

A token mixer maps a sequence ``x`` (B, L, hidden_size) to ``y`` (B, L, output_size) and carries a state of
fixed layout from one call to the next, so a prefill hands over to token-by-token decoding::

    y, state = mixer(x, mask, return_state=True)          # a whole sequence (training, or a prompt)
    y_t, state = mixer.step(x_t, state)                    # one more token, O(1) in the context length
    state = mixer.init_state(batch_size, device, dtype)    # the state before the first token

What the base class does, for every mixer: checks ``x``, ``mask`` and ``state`` before any work; zeroes the
masked positions of ``x`` (padding is the mixer's job: a masked position must add nothing to any state); sends a
one-token call with a state to ``_step``; allocates and checks states from one declared layout; refuses states
to a mixer that reads later tokens; and implements the hook long documents need:

- ``document_starts`` (B, L) bool: a packed row holds several documents back to back; at every True position
  each state restarts as at the start of a sequence (:meth:`TokenMixer.reset_state`).

Packed rows run every document alone, batched through the mixer's own parallel ``_forward``
(:mod:`ssmhub.layers.packing`); a mixer whose ``_forward`` restarts its states at ``starts`` itself (the same
numbers, at the cost of an unpacked row) says so with ``native_packing = True`` and gets them as its last
argument, a :class:`~ssmhub.layers.packing.PackedRows` (``rows.starts`` is the (B, L) bool tensor; a mixer that
runs mixers inside it passes ``rows`` on as their ``document_starts``, so they share its sizes). Exact rollback
(assisted decoding) needs nothing of a mixer: the cache keeps the states before a verification forward and replays
the accepted tokens (:mod:`ssmhub.cache`).

How a new mixer joins:

1. subclass :class:`TokenMixer`; set ``self.hidden_size`` (the width of x) in ``__init__`` (``output_size``,
   the width of y, is ``hidden_size`` unless the mixer says otherwise); set ``causal = False`` if an output
   may depend on later tokens (then it has no state);
2. implement ``_forward(x, mask, state, return_state) -> (y, new_state or None)``: ``x`` is checked and its
   masked positions are zero, ``state`` is None (start of the sequence) or checked;
3. implement ``_step(x_t, state, mask_t) -> (y_t, new_state)``: ``x_t``'s masked rows are zero already;
   ``mask_t`` (None or (B,)) is there for a mixer that must do more at a masked position (hold its state);
4. declare the state in ``state_layout(batch_size, dtype) -> {name: (shape, dtype)}``; ``None`` in a shape is a
   length that grows (attention's keys); :meth:`init_state` fills the layout with zeros, override it where the
   state before the first token is not zero;
5. optionally, where a step derives tensors from the parameters alone (DLR's Λ in float64): return them from
   ``step_coefficients() -> {name: tensor}`` and implement ``_step_with(x_t, state, mask_t, coefficients)``: decoding
   then forms them once for as long as the parameters do not change (:meth:`TokenMixer.kept_step_coefficients`), and
   a serving engine's compiled decode rows take them as inputs instead of recomputing them per row.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

from ..ops.row_tables import table_layout
from .memo import can_keep, kept, tensor_versions
from .packing import PackedRows, Segments

__all__ = ["MixerState", "StateLayout", "TokenMixer", "check_mixer_inputs"]

MixerState = dict[str, torch.Tensor]
StateLayout = dict[str, tuple[tuple[int | None, ...], torch.dtype]]


def check_mixer_inputs(x: torch.Tensor, mask: torch.Tensor | None, hidden_size: int) -> None:
    """Raise a ValueError unless x is (B, L, hidden_size) and mask is None or (B, L)."""
    if x.dim() != 3 or x.shape[-1] != hidden_size:
        raise ValueError(f"x must have shape (B, L, {hidden_size}); got {tuple(x.shape)}")
    if mask is not None and mask.shape != x.shape[:2]:
        raise ValueError(f"mask must have shape {tuple(x.shape[:2])}; got {tuple(mask.shape)}")


def _rows(keep: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A (B,) bool as (B, 1, ..., 1) to broadcast against a batch-first state tensor."""
    return keep.view(-1, *[1] * (like.dim() - 1))


class TokenMixer(nn.Module):
    """Base class of every ssmhub token mixer: the protocol of this module's docstring, in one place."""

    hidden_size: int  # the width of x
    causal: bool = True  # False: an output may depend on later tokens, so there is no state to carry
    native_packing: bool = False  # True: ``_forward(x, mask, state, return_state, rows)`` runs packed rows itself

    # ----------------------------------------------------------------------------- what a mixer implements
    def _forward(self, x: torch.Tensor, mask, state, return_state: bool) -> tuple[torch.Tensor, MixerState | None]:
        raise NotImplementedError(f"{type(self).__name__} must implement _forward")

    def _step(self, x_t: torch.Tensor, state: MixerState, mask_t) -> tuple[torch.Tensor, MixerState]:
        raise NotImplementedError(f"{type(self).__name__} must implement _step")

    def step_coefficients(self) -> MixerState:
        """What every step derives from the parameters alone, as named tensors (none unless a mixer declares some);
        :meth:`step` takes them formed already. Form them again after any parameter update."""
        return {}

    def kept_step_coefficients(self) -> MixerState:
        """:meth:`step_coefficients`, kept between steps until a parameter or buffer of the mixer changes (its
        storage or version counter: an optimizer step, a load, a cast; :mod:`ssmhub.layers.memo`), so that decoding
        forms them once; formed anew while gradients are on or torch.compile traces (then in the graph)."""
        if type(self).step_coefficients is TokenMixer.step_coefficients:
            return {}
        if not can_keep():
            return self.step_coefficients()
        key = tensor_versions(itertools.chain(self.parameters(), self.buffers()))
        return kept(self, "_kept_step_coefficients", key, self.step_coefficients)

    def _step_with(self, x_t: torch.Tensor, state: MixerState, mask_t, coefficients: MixerState):
        """``_step`` from :meth:`step_coefficients` formed already (the same numbers); a mixer that declares
        coefficients overrides it, and its ``_step`` forms them and calls it."""
        return self._step(x_t, state, mask_t)

    def state_layout(self, batch_size: int, dtype: torch.dtype | None = None) -> StateLayout:
        """``{name: (shape, dtype)}`` of the state; ``dtype`` is the activations' (recurrent states ignore it)."""
        raise NotImplementedError(f"{type(self).__name__} must declare its state_layout")

    def noncausal_reason(self) -> str:
        """Why a non-causal mixer has no state (its error message names the option that made it so)."""
        return f"{type(self).__name__} reads later tokens"

    # ----------------------------------------------------------------------------- the protocol
    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        state: MixerState | None = None,
        return_state: bool = False,
        document_starts: torch.Tensor | PackedRows | None = None,
    ) -> tuple[torch.Tensor, MixerState | None]:
        """Mix a whole sequence.

        Args:
            x: (B, L, hidden_size). mask: (B, L), 1 for real tokens, 0 for padding (adds nothing to any state).
            state: the state after earlier tokens (:meth:`init_state`, a previous forward or :meth:`step`),
                or None for the start of a sequence.
            return_state: also return the state after the last token.
            document_starts: (B, L) bool, True where a packed row starts a new document: every state restarts
                there as at a sequence start; or :class:`~ssmhub.layers.packing.PackedRows` (the same, with the
                sizes of its batch of documents, shared by the layers of a model).

        Returns: ``(y (B, L, output_size), new_state or None)``.
        """
        check_mixer_inputs(x, mask, self.hidden_size)
        if state is not None or return_state:
            self._require_state()
        if state is not None:
            self.check_state(state, x.shape[0])
        if mask is not None:
            x = x * mask.unsqueeze(-1).to(x.dtype)
        if document_starts is not None:
            rows = PackedRows.of(document_starts, x.shape[:2])
            if self.native_packing:
                return self._forward(x, mask, state, return_state, rows)
            return self._forward_documents(x, mask, state, return_state, rows)
        if state is not None and x.shape[1] == 1:
            mask_t = None if mask is None else mask[:, 0]
            y_t, new_state = self._step_with(x[:, 0], state, mask_t, self.kept_step_coefficients())
            return y_t.unsqueeze(1), (new_state if return_state else None)
        return self._forward(x, mask, state, return_state)

    def step(
        self, x_t: torch.Tensor, state: MixerState, coefficients: MixerState | None = None
    ) -> tuple[torch.Tensor, MixerState]:
        """One token: x_t (B, hidden_size) and the state after the previous token -> (y_t (B, output_size),
        the state after x_t). Equals :meth:`forward` on the whole sequence at that position. ``coefficients``:
        this mixer's :meth:`step_coefficients`, formed once for many steps (None: those kept since the parameters
        last changed, :meth:`kept_step_coefficients`)."""
        self._check_step_input(x_t)
        self.check_state(state, x_t.shape[0])
        coefficients = self.kept_step_coefficients() if coefficients is None else coefficients
        return self._step_with(x_t, state, None, coefficients)

    def step_rows_(
        self,
        x_t: torch.Tensor,
        tables: MixerState,
        rows: torch.Tensor,
        new: torch.Tensor,
        coefficients: MixerState | None = None,
        step=None,
    ) -> torch.Tensor:
        """One token for some rows of state tables, in place (a serving engine's decode rows, each request's state
        in a slot): x_t (R, hidden_size), ``tables`` the state's names -> (slots, *shape), ``rows`` (R,) each
        row's slot, ``new`` (R,) bool the rows that start from the state before a first token (a new request in a
        reused slot). Returns y_t (R, output_size); the rows' new states are where their old ones were.

        Here: the rows gathered, :meth:`step`, written back (``step(mixer, x_t, state, coefficients)``, a compiled
        stand-in for it). A mixer with a kernel that updates its rows in one pass overrides it and says so in
        :attr:`steps_rows_in_one_pass`."""
        state = {name: table.index_select(0, rows) for name, table in tables.items()}
        if torch.compiler.is_compiling() or bool(new.any()):  # eager: skip the reset when no row needs it
            state = self.reset_state(state, new)
        y_t, state = step(self, x_t, state, coefficients) if step else self.step(x_t, state, coefficients)
        for name, table in tables.items():
            table.index_copy_(0, rows, state[name].to(table.dtype))
        return y_t

    def _kept_rows_kernel(self, tables: MixerState, coefficients: MixerState, build):
        """``build()``: a :meth:`step_rows_` kernel's operands for these coefficients and tables' layout, kept between
        steps while the coefficients are the same dict (:meth:`kept_step_coefficients` forms a new one when a weight
        changes) and every table is laid out as before (:func:`~ssmhub.ops.row_tables.table_layout`), so that a step
        hands its kernel only its tables, rows and inputs; formed anew while :func:`~ssmhub.layers.memo.can_keep`
        says no. What ``build`` returns must hold no table (a cache's states would outlive it); the entry holds
        ``coefficients``, so no other dict takes its id while it is kept."""
        if not can_keep():
            return build()
        key = (id(coefficients), *(table_layout(t) for t in tables.values()))
        return kept(self, "_kept_rows_kernel_entry", key, lambda: (coefficients, build()))[1]

    @property
    def steps_rows_in_one_pass(self) -> bool:
        """Whether :meth:`step_rows_` runs a kernel of the mixer's own that reads and writes each row's state once
        (then ``torch.compile`` around it has nothing left to fuse)."""
        return False

    @property
    def compiles_whole_step(self) -> bool:
        """Whether a compiled decode (:func:`~ssmhub.serving.flat_batch.compiled_decode`, a serving engine's unless
        it runs eagerly) compiles this mixer's whole :meth:`step`, its rows gathered and written back around it,
        rather than run :meth:`step_rows_` eagerly: where no kernel of its own steps all of its state in one pass."""
        return not self.steps_rows_in_one_pass

    def init_state(self, batch_size: int, device=None, dtype: torch.dtype | None = None) -> MixerState:
        """The state before the first token: zeros of :meth:`state_layout` (a growing length starts at 0), on
        ``device`` (default: the mixer's)."""
        self._require_state()
        if device is None:
            device = next((p.device for p in self.parameters()), None)
        return {
            name: torch.zeros([0 if n is None else n for n in shape], dtype=kind, device=device)
            for name, (shape, kind) in self.state_layout(batch_size, dtype).items()
        }

    def static_state(self, batch_size: int, max_length: int, device=None, dtype: torch.dtype | None = None):
        """The state before the first token, preallocated for a decode of up to ``max_length`` tokens whose every
        step has the same shapes (what ``torch.compile(fullgraph=True)`` and ``torch.export`` need): a recurrent
        mixer's state never grows, so it is :meth:`init_state`; attention overrides it with a fixed buffer."""
        return self.init_state(batch_size, device=device, dtype=dtype)

    def check_state(self, state: MixerState, batch_size: int) -> None:
        """Raise a ValueError unless ``state`` holds exactly the layout's tensors, in its shapes."""
        layout = self.state_layout(batch_size)
        expected = {name: shape for name, (shape, _) in layout.items()}
        got = {name: tuple(value.shape) for name, value in state.items()}
        fits = got.keys() == expected.keys() and all(
            len(got[name]) == len(shape) and all(e is None or e == g for e, g in zip(shape, got[name]))
            for name, shape in expected.items()
        )
        if not fits:
            raise ValueError(f"state must hold tensors of shapes {expected}; got {got}")

    def fresh_state_like(self, state: MixerState) -> MixerState:
        """The state before a first token, shaped as ``state`` (a growing length, attention's keys, keeps its
        size, all zero and masked out)."""
        batch_size = next(iter(state.values())).shape[0]
        device = next(iter(state.values())).device
        layout = self.state_layout(batch_size)
        fresh = self.init_state(batch_size, device=device)
        return {
            name: torch.zeros_like(value) if None in layout[name][0] else fresh[name].to(value.dtype)
            for name, value in state.items()
        }

    def reset_state(self, state: MixerState, rows: torch.Tensor) -> MixerState:
        """The state with ``rows`` (B,) bool set back to the state before a first token (document starts)."""
        fresh = self.fresh_state_like(state)
        return {name: torch.where(_rows(rows, value), fresh[name], value) for name, value in state.items()}

    def _gradient_asked(self, x_t: torch.Tensor, coefficients: MixerState) -> bool:
        """Whether a step of ``x_t`` from ``coefficients`` must keep autograd's graph, which a one-pass kernel
        overriding :meth:`step_rows_` does not build (it then falls back on the protocol's path)."""
        return torch.is_grad_enabled() and any(t.requires_grad for t in (x_t, *coefficients.values()))

    def _check_step_input(self, x_t: torch.Tensor) -> None:
        self._require_state()
        if x_t.dim() != 2 or x_t.shape[-1] != self.hidden_size:
            raise ValueError(f"x_t must have shape (B, {self.hidden_size}); got {tuple(x_t.shape)}")

    def _require_state(self) -> None:
        if not self.causal:
            raise ValueError(f"{self.noncausal_reason()}: it has no recurrent state to carry or step")

    # ----------------------------------------------------------------------------- long documents, rollback
    def _forward_documents(self, x, mask, state, return_state, rows: PackedRows):
        """Packed rows as what they mean, every document run alone: the segments of all rows become one batch
        (:func:`~ssmhub.layers.packing.split_documents`) through the mixer's own parallel forward, and the
        outputs go back to their places. Exact for every mixer whose padding adds nothing to a state."""
        B, L, _ = x.shape
        segments = rows.segments(continuing=state is not None)
        x_seg = x.reshape(B * L, -1)[segments.index] * segments.valid.unsqueeze(-1).to(x.dtype)  # (S, W, H)
        valid = segments.valid if mask is None else segments.valid & mask.reshape(-1)[segments.index].bool()
        seg_state = None if state is None else self._segment_states(state, segments)
        y_seg, seg_final = self(x_seg, valid.long(), seg_state, return_state)  # (S, W, D_out)
        y = y_seg.flatten(0, 1).index_select(0, segments.slot)  # (B·L, D_out): each position from its slot
        final = {name: value[segments.last] for name, value in seg_final.items()} if return_state else None
        return y.view(B, L, -1), final

    def _segment_states(self, state: MixerState, segments: Segments) -> MixerState:
        """Each segment's initial state: its row's incoming state where it continues it, else a fresh one."""
        gathered = {name: value[segments.row] for name, value in state.items()}
        fresh = self.fresh_state_like(gathered)
        return {
            name: torch.where(_rows(segments.continues, value), value, fresh[name]) for name, value in gathered.items()
        }

    def _forward_documents_stepwise(self, x, mask, state, return_state, starts):
        """The reference form of packing: the one-token recurrence, restarting every state at a document start
        (independent of :meth:`_forward_documents`, for tests)."""
        self._require_state()
        if state is None:
            state = self.init_state(x.shape[0], device=x.device, dtype=x.dtype)
        outputs = []
        for t in range(x.shape[1]):
            state = self.reset_state(state, starts[:, t])
            y_t, state = self._step(x[:, t], state, None if mask is None else mask[:, t])
            outputs.append(y_t)
        return torch.stack(outputs, 1), (state if return_state else None)
