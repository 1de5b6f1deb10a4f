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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Segments", "split_documents"]


@dataclass
class Segments:
    """Where the S segments of a (B, L) packed batch sit in an (S, W) batch of documents.

    index: (S, W) long, the flat position ``b·L + t`` each slot reads (clamped where not valid);
    valid: (S, W) bool, slots holding a token; row: (S,) the packed row of each segment;
    continues: (S,) bool, the segment carries its row's incoming state; last: (B,) each row's last segment.
    """

    index: torch.Tensor
    valid: torch.Tensor
    row: torch.Tensor
    continues: torch.Tensor
    last: torch.Tensor


def split_documents(starts: torch.Tensor, continuing: bool) -> Segments:
    """Cut each row of ``starts`` (B, L) bool at its True positions (and at 0).

    ``continuing``: the rows carry an incoming state, which a row's first segment continues unless the row
    starts a document at position 0.
    """
    row_length = starts.shape[1]
    bounds = starts.clone()
    bounds[:, 0] = True
    row, begin = bounds.nonzero(as_tuple=True)  # (S,), sorted by row, then position
    same_row_next = torch.cat([row[1:] == row[:-1], row.new_zeros(1, dtype=torch.bool)])
    end = torch.where(same_row_next, torch.cat([begin[1:], begin.new_zeros(1)]), torch.full_like(begin, row_length))
    size = end - begin
    width = int(size.max())
    continues = (begin == 0) & ~starts[row, 0] if continuing else torch.zeros_like(same_row_next)
    shift = torch.where(continues, 0, width - size)  # right-align fresh segments
    position = begin[:, None] + torch.arange(width, device=starts.device)[None] - shift[:, None]  # (S, W)
    valid = (position >= begin[:, None]) & (position < end[:, None])
    index = row[:, None] * row_length + position.clamp(0, row_length - 1)
    return Segments(index, valid, row, continues, (~same_row_next).nonzero(as_tuple=True)[0])
