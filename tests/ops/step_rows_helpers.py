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
