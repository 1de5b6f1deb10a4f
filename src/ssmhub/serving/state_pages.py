"""A mixer's named state tensors packed into one byte page per request: how its state fits an engine's state slot.

A serving engine (vLLM) allocates each recurrent layer one page of bytes per slot and hands the layer a table of
them, (slots, page_bytes). A mixer's state is a dict of tensors of mixed dtypes (float32, float64, complex64,
int64; :meth:`~ssmhub.layers.mixer.TokenMixer.state_layout`); :class:`StatePages` lays them out in one page, the
widest dtypes first so that every tensor starts at a multiple of its item size, and views a table of pages as the
mixer's named tables, (slots, *shape) each, without a copy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..layers.mixer import TokenMixer

__all__ = ["StatePages"]

_ALIGN = 16  # bytes: a page's size is a multiple of it, so every row of a table starts aligned for any dtype


@dataclass(frozen=True)
class StatePages:
    """``fields``: (name, shape without the batch dim, dtype, byte offset) of each state tensor; ``page_bytes``."""

    fields: tuple[tuple[str, tuple[int, ...], torch.dtype, int], ...]
    page_bytes: int

    @classmethod
    def of(cls, mixer: TokenMixer, dtype: torch.dtype) -> StatePages:
        """The page of ``mixer``'s state for activations of ``dtype``. A ValueError if a state grows with the
        context (attention's keys), which no fixed page holds."""
        layout = mixer.state_layout(1, dtype)
        growing = [name for name, (shape, _) in layout.items() if None in shape]
        if growing:
            raise ValueError(f"{type(mixer).__name__}'s state {growing} grows with the context: it has no fixed page")
        order = sorted(layout.items(), key=lambda item: -item[1][1].itemsize)  # widest first: offsets stay aligned
        fields, offset = [], 0
        for name, (shape, kind) in order:
            fields.append((name, tuple(shape[1:]), kind, offset))
            offset += math.prod(shape[1:]) * kind.itemsize
        return cls(tuple(fields), max(_ALIGN, -(-offset // _ALIGN) * _ALIGN))

    def views(self, table: torch.Tensor) -> dict[str, torch.Tensor]:
        """A (slots, ≥ page_bytes) uint8 table as the state's named (slots, *shape) tensors, sharing its memory."""
        if table.dtype != torch.uint8 or table.dim() != 2 or table.shape[1] < self.page_bytes:
            got = f"{table.dtype} {tuple(table.shape)}"
            raise ValueError(f"a state table must be (slots, ≥ {self.page_bytes}) uint8; got {got}")
        views = {}
        for name, shape, kind, offset in self.fields:
            size = math.prod(shape) * kind.itemsize
            views[name] = table[:, offset : offset + size].view(kind).view(table.shape[0], *shape)
        return views
