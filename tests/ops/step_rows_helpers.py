"""A mixer's one-pass ``step_rows_`` beside its oracle, the mixer protocol's gather, step and write-back
(``TokenMixer.step_rows_``), each on its own copy of the same state tables."""

from __future__ import annotations

import torch

from ssmhub.layers.mixer import TokenMixer


def step_rows_both_ways(mixer, tables, x, rows, new):
    """Returns (y, the oracle's y, the tables after the kernel path, the tables after the oracle's)."""
    ours = {name: t.clone() for name, t in tables.items()}
    reference = {name: t.clone() for name, t in tables.items()}
    with torch.no_grad():
        y = mixer.step_rows_(x, ours, rows, new)
        want = TokenMixer.step_rows_(mixer, x, reference, rows, new)
    return y, want, ours, reference


def in_engine_pages(table, lead=3, tail=5):
    """``table`` (slots, *shape) copied into a view of a larger (slots, lead + block + tail) buffer, as a serving
    engine's pages hold a layer's state: each slot's block contiguous, slots apart. Returns (view, buffer); the
    buffer's elements around the view are NaN, and :func:`pages_untouched` says whether they still are."""
    block = table[0].numel()
    buffer = torch.full((table.shape[0], lead + block + tail), float("nan"), dtype=table.dtype)
    view = buffer[:, lead : lead + block].view(table.shape)
    view.copy_(table)
    return view, buffer


def pages_untouched(buffer, view):
    """Whether every element of ``buffer`` outside ``view`` (from :func:`in_engine_pages`) is NaN, as it was."""
    lead = view.storage_offset() - buffer.storage_offset()
    block = view[0].numel()
    return bool(buffer[:, :lead].isnan().all() and buffer[:, lead + block :].isnan().all())
