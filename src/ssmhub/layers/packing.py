"""Packed rows as a batch of documents: the index maps behind :meth:`TokenMixer._forward_documents`.

A packed row holds several documents back to back; ``starts`` (B, L) bool marks where each begins. Running
every document alone is the definition of a packed forward, so the protocol runs exactly that, batched: the
segments of all rows become the rows of one (S, W) batch, W the longest segment, and any mixer's own parallel
``_forward`` computes them. Two alignments keep every state exact:

- a segment that starts fresh is *right*-aligned (left padding): a fresh state passes masked positions
  unchanged (the protocol's padding rule), so the state after its last token is exact;
- the first segment of a row that continues the row's incoming state is *left*-aligned (right padding), so
  that state meets no masked position before the real tokens. Its final state is only kept when it is also the
  row's last segment, and then it spans the whole row (no padding at all).

S and W are shapes, so they must be host integers. :class:`PackedRows` carries them from where the input enters
(a collator computes them on the CPU: transformers' ``DataCollatorWithFlattening`` passes ``max_length_q`` and
the ``cu_seq_lens`` of its documents) and builds the map once for every layer of a forward: with both known,
nothing is read back from the device; without them, the first layer that needs the map reads both in one transfer.
A mixer that runs packed rows itself gets the :class:`PackedRows` and hands the same object to the mixers inside it,
so they share its sizes and map (an explicit argument, not hidden state: ``torch.compile`` traces it whole).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["PackedRows", "Segments", "split_documents"]


@dataclass
class Segments:
    """Where the S segments of a (B, L) packed batch sit in an (S, W) batch of documents.

    index: (S, W) long, the flat position ``b·L + t`` each slot reads (clamped where not valid);
    valid: (S, W) bool, slots holding a token; row: (S,) the packed row of each segment;
    continues: (S,) bool, the segment carries its row's incoming state; last: (B,) each row's last segment;
    slot: (B·L,) long, the flat slot ``s·W + j`` that holds each position (the inverse of ``index`` on valid slots).
    """

    index: torch.Tensor
    valid: torch.Tensor
    row: torch.Tensor
    continues: torch.Tensor
    last: torch.Tensor
    slot: torch.Tensor


@dataclass
class PackedRows:
    """A packed batch's document starts with the sizes of its batch of documents, shared by every layer.

    starts: (B, L) bool, True where a document begins. count, width: the number of segments S and the longest W
    (the rows' own starts and position 0 cut them), as host integers, or None to read them from ``starts`` when
    first needed; bounds at least as large are exact too (a spare segment or slot is padding).
    """

    starts: torch.Tensor
    count: int | None = None
    width: int | None = None
    _segments: dict[bool, Segments] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, document_starts: torch.Tensor | PackedRows, shape: tuple[int, ...]) -> PackedRows:
        """``document_starts`` as packed rows of ``shape`` (B, L): the rows themselves (with their sizes and map),
        or new rows of a (B, L) bool tensor. A ValueError names ``document_starts`` if its shape differs."""
        rows = document_starts if isinstance(document_starts, PackedRows) else cls(document_starts.to(torch.bool))
        if rows.starts.shape != shape:
            raise ValueError(f"document_starts must have shape {tuple(shape)}; got {tuple(rows.starts.shape)}")
        return rows

    def segments(self, continuing: bool) -> Segments:
        """The (S, W) map (:func:`split_documents`), built once per ``continuing`` (rows carry an incoming state)."""
        if continuing not in self._segments:
            self._segments[continuing] = split_documents(self.starts, continuing, self.count, self.width)
        return self._segments[continuing]


def _bounds_and_offsets(starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Segment starts (``starts`` and every row's position 0) and each position's offset in its segment, (B, L)."""
    bounds = starts.clone()
    bounds[:, 0] = True
    position = torch.arange(starts.shape[1], device=starts.device).expand_as(starts)  # (B, L)
    return bounds, position - torch.where(bounds, position, 0).cummax(dim=1).values


def split_documents(
    starts: torch.Tensor, continuing: bool, count: int | None = None, width: int | None = None
) -> Segments:
    """Cut each row of ``starts`` (B, L) bool at its True positions (and at 0).

    ``continuing``: the rows carry an incoming state, which a row's first segment continues unless the row
    starts a document at position 0. ``count`` / ``width``: S and W (or bounds at least as large) as host
    integers; None reads both from the device (one transfer). Nothing else reads a value back.
    """
    B, L = starts.shape
    bounds, offset = _bounds_and_offsets(starts)  # (B, L), (B, L)
    if count is None or width is None:
        count, width = torch.stack([bounds.sum(), offset.max() + 1]).tolist()
    else:  # the caller's bounds, checked on the device (a CUDA failure surfaces at a later launch: no sync here);
        # constant messages: under torch.compile count and width may be symbolic, which a format string refuses
        torch._assert_async(bounds.sum() <= count, "packed rows hold more segments than their count bound")
        torch._assert_async(offset.max() < width, "a segment of the packed rows is longer than their width bound")
    width = min(width, L)
    segment = bounds.flatten().long().cumsum(0) - 1  # (B·L,) each position's segment, in row-major order
    flat = torch.arange(B * L, device=starts.device)
    size = torch.zeros(count, dtype=torch.long, device=starts.device).scatter_add_(0, segment, torch.ones_like(flat))
    begin = torch.zeros_like(size).scatter_(0, segment, flat - offset.flatten())  # (S,) flat position of token 0
    row, begin = begin // L, begin % L  # a spare segment (size 0) reads row 0 and holds nothing
    continues = (begin == 0) & ~starts[row, 0] & (size > 0) if continuing else torch.zeros_like(size, dtype=torch.bool)
    shift = torch.where(continues, 0, width - size)  # right-align fresh segments
    position = begin[:, None] + torch.arange(width, device=starts.device)[None] - shift[:, None]  # (S, W)
    valid = (position >= begin[:, None]) & (position < (begin + size)[:, None])
    index = row[:, None] * L + position.clamp(0, L - 1)
    slot = segment * width + offset.flatten() + shift[segment]  # (B·L,)
    return Segments(index, valid, row, continues, segment.view(B, L)[:, -1], slot)
