"""Stateful training (truncated backpropagation through time) behind ``ssmhub-train --stateful``.

Each of the run's ``rows`` (per-device batch x processes) batch rows reads one document after another
(a PG-19 book, a WikiText article) in consecutive windows of ``seq_len`` tokens. The model's state at the
end of window i, detached, is the row's initial state for window i + 1 (a :class:`~ssmhub.cache.RecurrentCache`
per process, passed as ``cache``); a row that reaches its document's end starts the next document inside the
window from a fresh state (``position_ids`` 0 there, the packed-row boundaries of the model API).

:class:`DocumentStreams` decides which tokens each row reads, the same on every process (a pure function
of its small state, so it is checkpointed as JSON): documents are dealt from one queue, shuffled per epoch
by ``seed`` (as :class:`~ssmhub.training.trainer.EpochShuffleSampler`); in each window rows fill in order
0, 1, ..., each taking the queue's next document when its own ends. Every token is predicted once from
everything of its document before it: a window's last target is the row's next token (``shift_labels``),
and the first token of a document is never a target (nothing of its document comes before it).

:class:`StatefulBatches` turns a process's rows of each window into model inputs and keeps their states:
they are part of every checkpoint (``stateful_states-<process>.safetensors`` in the checkpoint folder, next to
``trainer_state.json``'s ``streams``), so a resumed run continues every row exactly where it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..cache import RecurrentCache
from ..data import TokenStream
from ..data.token_stream import document_sizes
from ..fileio import atomic_path

__all__ = ["IGNORE_INDEX", "DocumentStreams", "StatefulBatches", "states_file"]

IGNORE_INDEX = -100


def states_file(folder: str | Path, process_index: int) -> Path:
    """Where a checkpoint keeps the carried states of one process's rows: the cache's
    :meth:`~ssmhub.cache.RecurrentCache.state_dict`, as safetensors."""
    return Path(folder) / f"stateful_states-{process_index}.safetensors"


def _legacy_states_file(folder: str | Path, process_index: int) -> Path:
    """Where checkpoints written before the one state format kept them (``torch.save`` of the layer dicts)."""
    return Path(folder) / f"stateful_states-{process_index}.pt"


def _read_legacy_states(path: Path) -> dict[str, torch.Tensor]:
    """A legacy ``{"layers": [dict | None], "seen_tokens": int}`` file as a cache state dict."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    state = {f"layers.{i}.{k}": v for i, layer in enumerate(saved["layers"]) if layer for k, v in layer.items()}
    return {**state, "seen_tokens": torch.tensor(saved["seen_tokens"], dtype=torch.int64, device="cpu")}


class DocumentStreams:
    """Which document, and where in it, each of ``rows`` rows reads next (see the module docstring)."""

    def __init__(self, stream: TokenStream, rows: int, seq_len: int, seed: int):
        if len(stream) == 0:
            raise ValueError("stateful training needs at least one document; the train split has none")
        self.stream, self.rows, self.seq_len, self.seed = stream, rows, seq_len, seed
        self.epoch, self.next_index = 0, 0  # the queue: document order[next_index] of epoch ``epoch`` is next
        self.document = [-1] * rows  # -1: the row has no document yet
        self.offset = [0] * rows
        self._order: tuple[int, np.ndarray] | None = None

    def _queue_order(self) -> np.ndarray:
        if self._order is None or self._order[0] != self.epoch:
            generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            self._order = (self.epoch, torch.randperm(len(self.stream), generator=generator).numpy())
        return self._order[1]

    def _take_next_document(self, row: int) -> None:
        self.document[row], self.offset[row] = int(self._queue_order()[self.next_index]), 0
        self.next_index += 1
        if self.next_index == len(self.stream):
            self.epoch, self.next_index = self.epoch + 1, 0

    def _fill_row(self, row: int, ids, positions, targets) -> None:
        """The row's next ``seq_len`` tokens into row ``row`` of the (rows, seq_len) arrays."""
        filled = 0
        while filled < self.seq_len:
            document = self.document[row]
            if document < 0 or self.offset[row] == self.stream.document_length(document):
                self._take_next_document(row)
                document = self.document[row]
            start, length = self.offset[row], self.stream.document_length(document)
            n = min(self.seq_len - filled, length - start)
            tokens = self.stream.read(document, start, min(start + n + 1, length))  # and the next one, if any
            ids[row, filled : filled + n] = tokens[:n]
            positions[row, filled : filled + n] = np.arange(start, start + n)
            targets[row, filled : filled + len(tokens) - 1] = tokens[1:]  # a document's last token: no target
            filled, self.offset[row] = filled + n, start + n

    def next_window(self) -> dict[str, np.ndarray]:
        """Every row's next window: ``input_ids``, ``position_ids`` and ``targets`` (the next token of each
        position in its document, -100 after a document's last token), each (rows, seq_len) int64."""
        shape = (self.rows, self.seq_len)
        ids, positions = np.zeros(shape, np.int64), np.zeros(shape, np.int64)
        targets = np.full(shape, IGNORE_INDEX, np.int64)
        for row in range(self.rows):
            self._fill_row(row, ids, positions, targets)
        return {"input_ids": ids, "position_ids": positions, "targets": targets}

    def state_dict(self) -> dict[str, Any]:
        """JSON-able: where every row and the document queue stand."""
        return {
            "rows": self.rows,
            "seq_len": self.seq_len,
            "epoch": self.epoch,
            "next_index": self.next_index,
            "document": list(self.document),
            "offset": list(self.offset),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`; ValueError naming what differs from this run's rows or seq_len."""
        for name in ("rows", "seq_len"):
            if state[name] != getattr(self, name):
                raise ValueError(
                    f"the checkpoint's document streams have {name}={state[name]}; this run has {getattr(self, name)}"
                )
        self.epoch, self.next_index = state["epoch"], state["next_index"]
        self.document, self.offset = list(state["document"]), list(state["offset"])


class StatefulBatches:
    """One process's rows of each window as model inputs, with the states they carry from window to window.

    ``rows`` is this process's slice of the global rows (process ``p`` of ``n`` with ``b`` rows each:
    ``p*b:(p+1)*b``). :meth:`next_inputs` returns keyword arguments of the model's forward; call
    :meth:`truncate` after each backward (the states keep their values, their graph goes).
    """

    def __init__(self, streams: DocumentStreams, rows: slice, num_layers: int, device):
        self.streams, self.rows, self.device = streams, rows, device
        self.cache = RecurrentCache(num_layers)

    def next_inputs(self) -> dict[str, Any]:
        window = self.streams.next_window()
        mine = {name: torch.from_numpy(value[self.rows]) for name, value in window.items()}
        sizes = document_sizes(mine["position_ids"])  # on the host: a packed forward reads nothing back
        mine = {name: value.to(self.device) for name, value in mine.items()}
        mine["cu_seq_lens_q"], mine["max_length_q"] = sizes["cu_seq_lens_q"].to(self.device), sizes["max_length_q"]
        targets = mine.pop("targets")
        # labels only switch the loss on; shift_labels are the targets (each window's last one from the next)
        return {**mine, "labels": targets, "shift_labels": targets, "cache": self.cache, "use_cache": True}

    def truncate(self) -> None:
        """Cut the carried states from the window's graph (the next window's gradients stop there)."""
        self.cache.detach_()

    def state(self) -> dict[str, Any]:
        """What ``trainer_state.json`` records: the queue's epoch and every row's document and offset."""
        return {"epoch": self.streams.epoch, "position": 0, "streams": self.streams.state_dict()}

    def save(self, folder: Path, process_index: int) -> None:
        """This process's carried states into ``folder`` (a checkpoint being written), in the cache's one format."""
        state = {name: t.cpu().contiguous() for name, t in self.cache.state_dict().items()}
        with atomic_path(states_file(folder, process_index)) as tmp:
            save_file(state, str(tmp))

    def load(self, folder: Path, process_index: int, streams_state: dict[str, Any]) -> None:
        """Continue from a checkpoint: the rows' positions (``streams_state``) and this process's states (a
        checkpoint written before the safetensors format loads too)."""
        path, legacy = states_file(folder, process_index), _legacy_states_file(folder, process_index)
        if not path.is_file() and not legacy.is_file():
            raise FileNotFoundError(f"checkpoint {folder} has no carried states for process {process_index} ({path})")
        self.streams.load_state_dict(streams_state)
        state = load_file(str(path)) if path.is_file() else _read_legacy_states(legacy)
        self.cache = RecurrentCache.from_state_dict(state, len(self.cache), device=self.device)
