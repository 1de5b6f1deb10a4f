"""What each micro-batch of ``ssmhub-train`` feeds the model: windows (plain or packed) or stateful rows.

The loop asks a batches object for :meth:`next_inputs` (keyword arguments of the model's forward, labels
included), calls :meth:`truncate` after each backward and records :meth:`state` in checkpoints:

- :class:`WindowBatches`: independent windows through a DataLoader in the seeded order of
  :class:`~ssmhub.training.trainer.EpochShuffleSampler`; with ``--packing`` each window holds documents
  back to back, ``position_ids`` restart at 0 at each document and the label of each document's first token
  is -100, as ``transformers.DataCollatorWithFlattening`` makes them (no state crosses a document start);
- :class:`~ssmhub.training.stateful.StatefulBatches`: ``--stateful``, each row carrying its state on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from .stateful import IGNORE_INDEX

__all__ = ["WindowBatches", "count_targets"]


def count_targets(inputs: dict[str, Any]) -> torch.Tensor:
    """How many tokens the loss of these inputs predicts (labels shifted inside the loss, or ``shift_labels``)."""
    if "shift_labels" in inputs:
        return (inputs["shift_labels"] != IGNORE_INDEX).sum()
    return (inputs["labels"][:, 1:] != IGNORE_INDEX).sum()


def window_inputs(batch: torch.Tensor | dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Model inputs of a batch of windows: ids (their own labels), or packed ids with ``position_ids``."""
    if isinstance(batch, torch.Tensor):
        return {"input_ids": batch, "labels": batch}
    ids, positions = batch["input_ids"], batch["position_ids"]
    return {"input_ids": ids, "position_ids": positions, "labels": ids.masked_fill(positions == 0, IGNORE_INDEX)}


class WindowBatches:
    """Windows from ``loader`` (its sampler set to each epoch), from ``(epoch, position)`` on."""

    def __init__(self, loader, sampler):
        self.loader, self.sampler = loader, sampler
        self.epoch = self.position = 0
        self._batches: Iterator | None = None

    def start(self, epoch: int, position: int) -> None:
        """Read from batch ``position`` + 1 of ``epoch`` on (a resumed run's data position)."""
        self.epoch, self.position, self._batches = epoch, position, None

    def _iterate(self) -> Iterator[tuple[int, int, Any]]:
        epoch, skip = self.epoch, self.position
        while True:
            self.sampler.set_epoch(epoch)
            for position, batch in enumerate(self.loader, start=1):
                if position > skip:
                    yield epoch, position, batch
            epoch, skip = epoch + 1, 0

    def next_inputs(self) -> dict[str, torch.Tensor]:
        if self._batches is None:
            self._batches = self._iterate()
        self.epoch, self.position, batch = next(self._batches)
        return window_inputs(batch)

    def truncate(self) -> None:
        """Nothing carries over between windows."""

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}
