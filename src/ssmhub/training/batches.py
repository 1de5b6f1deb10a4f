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

__all__ = ["WindowBatches", "count_targets", "repeat_passages"]


def count_targets(inputs: dict[str, Any]) -> torch.Tensor:
    """How many tokens the loss of these inputs predicts (labels shifted inside the loss, or ``shift_labels``)."""
    if "shift_labels" in inputs:
        return (inputs["shift_labels"] != IGNORE_INDEX).sum()
    return (inputs["labels"][:, 1:] != IGNORE_INDEX).sum()


def window_inputs(batch: torch.Tensor | dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Model inputs of a batch of windows: ids (their own labels), or packed ids with ``position_ids`` and the
    documents' sizes where the collator gave them (:meth:`ssmhub.data.PackedWindows.collate`)."""
    if isinstance(batch, torch.Tensor):
        return {"input_ids": batch, "labels": batch}
    ids, positions = batch["input_ids"], batch["position_ids"]
    sizes = {name: batch[name] for name in ("cu_seq_lens_q", "max_length_q") if name in batch}
    return {
        "input_ids": ids,
        "position_ids": positions,
        **sizes,
        "labels": ids.masked_fill(positions == 0, IGNORE_INDEX),
    }


def repeat_passages(
    ids: torch.Tensor, probability: float, generator: torch.Generator, shuffle: bool = False
) -> torch.Tensor:
    """Copying practice: each row of ``ids`` (B, L), with ``probability``, ends by repeating a passage of its own.

    A chosen row keeps its first L − L/4 tokens and then repeats the L/4 tokens that start at a uniform
    position among them, as a text that quotes or rewrites itself does; the loss on the repeat rewards copying
    (the skill prompt-lookup and assisted decoding profit from). With ``shuffle`` the passage's tokens are put
    in a random order, in its place and in the repeat alike: neither can then be recalled from memorized
    training text, so only copying predicts the repeat (the repeated random sequences on which induction heads
    form, Olsson et al. 2022, arXiv:2209.11895, made of the window's own tokens). Other rows are unchanged.
    Returns a new tensor.
    """
    rows, length = ids.shape
    span = length // 4
    chosen = torch.rand(rows, generator=generator) < probability
    starts = torch.randint(0, length - 2 * span + 1, (rows,), generator=generator)
    places = starts[:, None] + torch.arange(span)  # (B, span): where each row's drawn passage lies
    read = places
    if shuffle:  # the same places in a drawn order
        read = places.gather(1, torch.rand(rows, span, generator=generator).argsort(dim=1))
    passages = ids.gather(1, read)  # (B, span)
    out = ids.clone()
    if shuffle:  # the reordered passage in its place too
        out[chosen.nonzero(), places[chosen]] = passages[chosen]
    out[chosen, length - span :] = passages[chosen]
    return out


class WindowBatches:
    """Windows from ``loader`` (its sampler set to each epoch), from ``(epoch, position)`` on; with
    ``repeat_probability``, plain windows go through :func:`repeat_passages` (with ``shuffle``), drawn from a
    generator seeded by ``(seed, epoch, position)`` so a resumed run draws what the uninterrupted one did."""

    def __init__(self, loader, sampler, repeat_probability: float = 0.0, seed: int = 0, shuffle: bool = False):
        self.loader, self.sampler = loader, sampler
        self.repeat_probability, self.seed, self.shuffle = repeat_probability, seed, shuffle
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
        if self.repeat_probability and isinstance(batch, torch.Tensor):
            generator = torch.Generator().manual_seed((self.seed * 1_000_003 + self.epoch) * 1_000_003 + self.position)
            batch = repeat_passages(batch.cpu(), self.repeat_probability, generator, self.shuffle).to(batch.device)
        return window_inputs(batch)

    def truncate(self) -> None:
        """Nothing carries over between windows."""

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}
