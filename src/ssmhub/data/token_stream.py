"""Tokenized documents back to back in one memory-mapped array: what packed and stateful training read.

Fixed windows (:mod:`.token_cache`) forget where documents begin. Packed training needs those boundaries
(each document restarts every state, ``position_ids`` 0 there) and stateful training needs each document
as a whole (a batch row reads one document after another, window by window). :func:`cached_token_stream`
tokenizes a corpus once into ``tokens.npy`` (int32, every document followed by eos, so a model learns
where a document ends) and ``offsets.npy`` (document ``d`` is ``tokens[offsets[d]:offsets[d + 1]]``),
both memory-mapped on load, so an 11 GB split never sits in memory; the entry is built in a work folder
and renamed into place, so an interrupted build never looks complete. It lives next to the windows cache
(``<cache>/token_streams/``), keyed by the corpus, the tokenizer and this format.

:class:`PackedWindows` cuts a stream into ``seq_len`` windows with no padding: documents back to back (a
WikiText article or a PG-19 book ends inside a window and the next one begins there), ``position_ids``
restarting at 0 at each document start and at each window start (a document cut by a window edge goes on
in the next window as a fresh document), exactly what ``transformers.DataCollatorWithFlattening`` gives.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..tokenization import encode_documents
from .token_cache import CorpusSource, document_dataset, publish_entry, resolve_cache_dir, tokenizer_fingerprint

__all__ = ["PackedWindows", "TokenStream", "cached_token_stream", "document_sizes", "packed_position_ids"]

_FORMAT_VERSION = 1
_COMPLETE = "ssmhub_stream.json"


@dataclass
class TokenStream:
    """Documents back to back: ``tokens`` (N,) int32 and ``offsets`` (D + 1,) int64, both memory-mapped."""

    tokens: np.ndarray
    offsets: np.ndarray
    path: Path | None = None

    def __len__(self) -> int:
        """Number of documents."""
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def document_length(self, index: int) -> int:
        return int(self.offsets[index + 1] - self.offsets[index])

    def read(self, index: int, start: int, stop: int) -> np.ndarray:
        """Tokens ``start:stop`` of document ``index`` (int64)."""
        begin = int(self.offsets[index])
        return np.asarray(self.tokens[begin + start : begin + stop], dtype=np.int64)


def packed_position_ids(offsets: np.ndarray, start: int, length: int) -> np.ndarray:
    """(length,) int64: each token's position in its document, counted from the window's first token
    (``start``) when the document began before it; 0 at every document start inside the window."""
    index = np.arange(start, start + length)
    document = np.searchsorted(offsets, index, side="right") - 1
    return index - np.maximum(offsets[document], start)


class PackedWindows(torch.utils.data.Dataset):
    """``seq_len`` windows of a :class:`TokenStream`, no padding: ``windows[i]`` is a dict of ``input_ids`` and
    ``position_ids`` (both (seq_len,) int64); the stream's last ``num_tokens % seq_len`` tokens are dropped."""

    def __init__(self, stream: TokenStream, seq_len: int):
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len must be a positive integer; got {seq_len!r}")
        self.stream, self.seq_len = stream, seq_len

    def __len__(self) -> int:
        return self.stream.num_tokens // self.seq_len

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} out of range for {len(self)} windows")
        start = index * self.seq_len
        ids = np.asarray(self.stream.tokens[start : start + self.seq_len], dtype=np.int64)
        positions = packed_position_ids(self.stream.offsets, start, self.seq_len)
        return {"input_ids": torch.from_numpy(ids), "position_ids": torch.from_numpy(positions)}

    @staticmethod
    def collate(windows: list[dict[str, torch.Tensor]]) -> dict:
        """A DataLoader's batch of windows: ``input_ids`` and ``position_ids`` (B, L), and the sizes of their
        documents computed here on the host, as ``transformers.DataCollatorWithFlattening`` gives them:
        ``cu_seq_lens_q`` (N + 1,) int32 over the B·L tokens back to back (each window starts a document) and
        ``max_length_q``, the longest (a Python int), so that a packed forward reads none of them back."""
        ids = torch.stack([w["input_ids"] for w in windows])  # (B, L)
        positions = torch.stack([w["position_ids"] for w in windows])  # (B, L)
        return {"input_ids": ids, "position_ids": positions, **document_sizes(positions)}


def document_sizes(position_ids: torch.Tensor) -> dict:
    """The sizes of the documents (or pieces of documents) in rows whose ``position_ids`` (B, L), on the host,
    restart at 0 where a document starts, as ``transformers.DataCollatorWithFlattening`` gives them:
    ``cu_seq_lens_q`` (N + 1,) int32 over the B·L tokens back to back (each row's first token starts a piece) and
    ``max_length_q``, the longest piece (a Python int), so that a packed forward reads none of them back."""
    starts = position_ids == 0
    starts[:, 0] = True  # a row's first token starts a (piece of a) document
    cu = torch.cat([starts.flatten().nonzero().flatten(), torch.tensor([starts.numel()])])  # (N + 1,)
    return {"cu_seq_lens_q": cu.int(), "max_length_q": int((cu[1:] - cu[:-1]).max())}


def _entry_name(source: CorpusSource, tokenizer) -> str:
    key = json.dumps(
        {"version": _FORMAT_VERSION, "source": source.fingerprint, "tokenizer": tokenizer_fingerprint(tokenizer)},
        sort_keys=True,
    )
    readable = "".join(c if c.isalnum() or c in "._-" else "-" for c in source.name).strip("-") or "corpus"
    return f"{readable}-stream-{hashlib.sha256(key.encode()).hexdigest()[:20]}"


def _tokenize_batch(batch: dict, tokenizer, eos_token_id: int) -> dict:
    """``datasets.map`` function: each document's ids followed by eos."""
    return {"input_ids": [[*ids, eos_token_id] for ids in encode_documents(tokenizer, batch["text"])]}


def _tokenized_documents(source: CorpusSource, tokenizer, work: Path, num_proc: int | None, key: str):
    """The documents of ``source`` tokenized by ``datasets.map`` into ``work`` (one row per document)."""
    documents = document_dataset(source, work, key)
    by_book = source.packing == "document"  # long books: one per map batch, bounding memory
    return documents.map(
        _tokenize_batch,
        batched=True,
        batch_size=1 if by_book else 256,
        writer_batch_size=8 if by_book else 256,
        remove_columns=documents.column_names,
        fn_kwargs={"tokenizer": tokenizer, "eos_token_id": tokenizer.eos_token_id},
        num_proc=num_proc,
        cache_file_name=str(work / "tokenized.arrow"),
        new_fingerprint=f"{key}-tokenized",
        desc=f"tokenizing {source.name}",
    )


def _write_stream(tokenized, folder: Path) -> None:
    """``tokens.npy`` and ``offsets.npy`` of the tokenized documents, written a batch at a time."""
    import pyarrow.compute as pc

    lengths = np.asarray(pc.list_value_length(tokenized.data.column("input_ids")).to_numpy(), dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    folder.mkdir(parents=True)
    tokens = np.lib.format.open_memmap(folder / "tokens.npy", mode="w+", dtype=np.int32, shape=(int(offsets[-1]),))
    at = 0
    for batch in tokenized.iter(batch_size=64):
        flat = np.fromiter((t for ids in batch["input_ids"] for t in ids), dtype=np.int32)
        tokens[at : at + len(flat)] = flat
        at += len(flat)
    tokens.flush()
    del tokens
    np.save(folder / "offsets.npy", offsets)


def _load(entry: Path) -> TokenStream:
    tokens = np.load(entry / "tokens.npy", mmap_mode="r")
    return TokenStream(tokens, np.load(entry / "offsets.npy"), entry)


def cached_token_stream(
    source: CorpusSource, tokenizer, cache_dir: str | os.PathLike | None = None, num_proc: int | None = None
) -> TokenStream:
    """The documents of ``source`` under ``tokenizer`` as a :class:`TokenStream`: loaded from the cache, or built.

    Raises ValueError for a tokenizer without eos or a corpus with no documents.
    """
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer has no eos token (needed to end documents)")
    root = resolve_cache_dir(cache_dir) / "token_streams"
    entry = root / _entry_name(source, tokenizer)
    if not (entry / _COMPLETE).is_file():
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root, prefix=".building-") as work:
            staged = Path(work) / "final"
            _write_stream(_tokenized_documents(source, tokenizer, Path(work), num_proc, entry.name), staged)
            (staged / _COMPLETE).write_text(json.dumps({"source": source.name}) + "\n", encoding="utf-8")
            publish_entry(staged, entry, _COMPLETE)
    return _load(entry)
