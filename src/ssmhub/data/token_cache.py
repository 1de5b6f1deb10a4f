"""Tokenize a corpus once, with ``datasets.map``, and keep its fixed-length token windows on disk.

:func:`cached_token_windows` turns a stream of documents into ``(num_windows, seq_len)`` training
windows stored as an Arrow dataset under a cache folder, keyed by what determines them: the corpus
(its local files' names, sizes and modification times, or its Hub id), the tokenizer (a hash of its
serialized form), ``seq_len`` and the packing. A second call with the same key loads the windows
memory-mapped, without reading or tokenizing the corpus again. Memory stays bounded at every stage,
so an 11 GB split never sits in memory:

1. documents are written to a work folder one at a time (``Dataset.from_generator``);
2. ``Dataset.map`` tokenizes them in small batches;
3. windows are cut (see *packing*) and written; the finished dataset is renamed into place, so an
   interrupted build never leaves a cache entry that looks complete.

Packing:

- ``"stream"`` (WikiText): documents are joined by eos into one stream cut into consecutive windows,
  exactly as :func:`ssmhub.data.pack_token_windows`; a window may span two documents.
- ``"document"`` (PG-19): each document is cut on its own and its tail shorter than ``seq_len`` is
  dropped, so no window crosses a book boundary (:func:`ssmhub.data.pg19_token_windows`).

The cache folder is ``cache_dir``, else ``$SSMHUB_CACHE_DIR``, else ``~/.cache/ssmhub``; entries live
in its ``token_windows/`` subfolder and may be deleted at any time.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..tokenization import encode_documents

__all__ = [
    "CACHE_DIR_ENV",
    "PACKINGS",
    "CorpusSource",
    "TokenWindows",
    "cached_token_windows",
    "files_fingerprint",
    "resolve_cache_dir",
    "tokenizer_fingerprint",
]

CACHE_DIR_ENV = "SSMHUB_CACHE_DIR"
PACKINGS = ("stream", "document")
_FORMAT_VERSION = 1  # bump when the windows a key stands for change meaning
_COMPLETE = "ssmhub_windows.json"


@dataclass(frozen=True)
class CorpusSource:
    """One split of a corpus: how to read its documents and what identifies their content.

    Attributes:
        name: human-readable name, e.g. ``"pg19/train"`` (part of the cache entry's folder name).
        documents: a function returning a fresh iterator over the documents, one string each.
        fingerprint: a string that changes whenever the documents may have changed (see
            :func:`files_fingerprint` for local files; a Hub id for a Hub dataset).
        packing: ``"stream"`` or ``"document"`` (see the module docstring).
    """

    name: str
    documents: Callable[[], Iterable[str]]
    fingerprint: str
    packing: str = "stream"

    def __post_init__(self) -> None:
        if self.packing not in PACKINGS:
            raise ValueError(f"packing must be one of {PACKINGS}; got {self.packing!r}")


class TokenWindows(torch.utils.data.Dataset):
    """Fixed-length token windows, memory-mapped from a cached Arrow dataset.

    ``windows[i]`` is a ``(seq_len,)`` int64 tensor; ``windows[indices]`` (a list, range or slice)
    is ``(len(indices), seq_len)``. ``__getitems__`` lets a DataLoader fetch a batch in one read.
    """

    def __init__(self, dataset, path: Path | None = None):
        self._dataset = dataset.with_format("numpy")
        self.path = path
        self.seq_len = dataset.features["input_ids"].length

    def __len__(self) -> int:
        return len(self._dataset)

    def __getitem__(self, index) -> torch.LongTensor:
        if isinstance(index, slice):
            index = range(len(self))[index]
        if isinstance(index, torch.Tensor):
            index = index.tolist()
        if isinstance(index, int):
            return torch.from_numpy(self._dataset[index]["input_ids"]).long()
        index = list(index)
        if not index:
            return torch.empty(0, self.seq_len, dtype=torch.long)
        return torch.from_numpy(self._dataset[index]["input_ids"]).long().view(len(index), self.seq_len)

    def __getitems__(self, indices: Sequence[int]) -> list[torch.LongTensor]:
        return list(self[list(indices)].unbind(0))

    def head(self, n: int) -> TokenWindows:
        """The first ``n`` windows (all if ``n`` is 0 or at least ``len(self)``)."""
        if n <= 0 or n >= len(self):
            return self
        return TokenWindows(self._dataset.select(range(n)), self.path)


def resolve_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` if given, else ``$SSMHUB_CACHE_DIR`` if set, else ``~/.cache/ssmhub``."""
    if cache_dir is None:
        cache_dir = os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "ssmhub"
    return Path(cache_dir)


def files_fingerprint(paths: Iterable[str | os.PathLike]) -> str:
    """A hash of the absolute paths, sizes and modification times of local files (cheap: no file is read)."""
    digest = hashlib.sha256()
    for path in sorted(Path(p).resolve() for p in paths):
        stat = path.stat()
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of a fast tokenizer's serialized pipeline (vocabulary, merges, normalizers) and its eos id.

    The truncation and padding settings are left out: transformers changes them on the backend when
    the tokenizer is called, so they would give the same tokenizer a different key after its first use
    (a known cause of cache misses with ``datasets.map``), and windows never use them.
    """
    pipeline = json.loads(tokenizer.backend_tokenizer.to_str())
    pipeline.pop("truncation", None)
    pipeline.pop("padding", None)
    serialized = json.dumps(pipeline, sort_keys=True)
    return hashlib.sha256(f"{serialized}\0{tokenizer.eos_token_id}".encode()).hexdigest()


def _entry_name(source: CorpusSource, tokenizer, seq_len: int) -> str:
    key = json.dumps(
        {
            "version": _FORMAT_VERSION,
            "source": source.fingerprint,
            "packing": source.packing,
            "tokenizer": tokenizer_fingerprint(tokenizer),
            "seq_len": seq_len,
        },
        sort_keys=True,
    )
    readable = re.sub(r"[^A-Za-z0-9._-]+", "-", source.name).strip("-") or "corpus"
    return f"{readable}-L{seq_len}-{hashlib.sha256(key.encode()).hexdigest()[:20]}"


def _document_rows(first: str, rest: Iterator[str]) -> Iterator[dict]:
    yield {"text": first}
    for text in rest:
        yield {"text": text}


def document_dataset(source: CorpusSource, work: Path, key: str):
    """The documents of ``source`` as a ``datasets.Dataset`` of ``{"text"}`` rows under ``work``, written a few
    documents at a time (books of 1 MB+ never all in memory). Raises ValueError for a corpus with no documents."""
    import datasets

    texts = iter(source.documents())
    first = next(texts, None)
    if first is None:
        raise ValueError(f"corpus {source.name} holds no documents")
    return datasets.Dataset.from_generator(
        _document_rows,
        gen_kwargs={"first": first, "rest": texts},
        cache_dir=str(work / "documents"),
        writer_batch_size=8,  # at most 8 documents (books of 1 MB+) in memory at once
        fingerprint=f"{key}-documents",
    )


def publish_entry(staged: Path, entry: Path, marker: str) -> None:
    """Move a fully written cache folder into place by one rename; when another process finished the same entry
    first, keep theirs (a leftover without its completion ``marker`` file is replaced)."""
    try:
        staged.rename(entry)
    except OSError:
        if not (entry / marker).is_file():
            shutil.rmtree(entry, ignore_errors=True)
            staged.rename(entry)


def _tokenize_batch(batch: dict, indices: list[int], tokenizer, eos_token_id: int, seq_len: int, packing: str):
    """``datasets.map`` function: token ids per document ("stream") or the document's windows ("document")."""
    ids = encode_documents(tokenizer, batch["text"])  # long books in pieces, bounding peak memory
    if packing == "stream":  # eos between consecutive documents, as pack_token_windows does
        return {"input_ids": [([eos_token_id] if index > 0 else []) + doc for doc, index in zip(ids, indices)]}
    windows = [doc[start : start + seq_len] for doc in ids for start in range(0, len(doc) - seq_len + 1, seq_len)]
    return {"input_ids": windows}


def _stream_windows(tokenized, seq_len: int) -> Iterator[dict]:
    """Cut the concatenation of the tokenized documents into consecutive windows (tail dropped)."""
    carry: list[int] = []
    for batch in tokenized.iter(batch_size=256):
        for doc in batch["input_ids"]:
            carry.extend(doc)
            whole = len(carry) // seq_len * seq_len
            for start in range(0, whole, seq_len):
                yield {"input_ids": carry[start : start + seq_len]}
            del carry[:whole]


def _build(source: CorpusSource, tokenizer, seq_len: int, work: Path, num_proc: int | None, key: str):
    import datasets

    # Explicit fingerprints: datasets would otherwise hash the document function and the tokenizer.

    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"), length=seq_len)})
    documents = document_dataset(source, work, key)
    # "document" packing (books): one book per map batch, at most ~1M tokens of windows per write.
    by_document = source.packing == "document"
    tokenized = documents.map(
        _tokenize_batch,
        batched=True,
        batch_size=1 if by_document else 256,
        writer_batch_size=max(1, 2**20 // seq_len) if by_document else 256,
        with_indices=True,
        remove_columns=documents.column_names,
        fn_kwargs={
            "tokenizer": tokenizer,
            "eos_token_id": tokenizer.eos_token_id,
            "seq_len": seq_len,
            "packing": source.packing,
        },
        features=features if by_document else None,
        num_proc=num_proc,
        cache_file_name=str(work / "tokenized.arrow"),
        new_fingerprint=f"{key}-tokenized",
        desc=f"tokenizing {source.name}",
    )
    if by_document:
        return tokenized
    import pyarrow.compute as pc

    total_tokens = pc.sum(pc.list_value_length(tokenized.data.column("input_ids"))).as_py() or 0
    if total_tokens < seq_len:  # from_generator cannot write an empty dataset
        return datasets.Dataset.from_dict({"input_ids": []}, features=features)
    return datasets.Dataset.from_generator(
        _stream_windows,
        gen_kwargs={"tokenized": tokenized, "seq_len": seq_len},
        features=features,
        cache_dir=str(work / "windows"),
        writer_batch_size=max(1, 2**20 // seq_len),
        fingerprint=f"{key}-windows",
    )


def cached_token_windows(
    source: CorpusSource,
    tokenizer,
    seq_len: int,
    cache_dir: str | os.PathLike | None = None,
    num_proc: int | None = None,
) -> TokenWindows:
    """The ``(num_windows, seq_len)`` windows of ``source`` under ``tokenizer``: loaded from the cache, or built.

    Args:
        source: the corpus split (:class:`CorpusSource`).
        tokenizer: a fast tokenizer with an eos token.
        seq_len: window length in tokens.
        cache_dir: cache folder (see :func:`resolve_cache_dir`).
        num_proc: worker processes for ``datasets.map`` (None: tokenize in this process).

    Raises:
        ValueError: ``seq_len`` not positive, a tokenizer without eos, or a corpus with no documents.
    """
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive integer; got {seq_len!r}")
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer has no eos token (needed to join documents)")
    import datasets

    root = resolve_cache_dir(cache_dir) / "token_windows"
    entry = root / _entry_name(source, tokenizer, seq_len)
    if not (entry / _COMPLETE).is_file():
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root, prefix=".building-") as work:
            windows = _build(source, tokenizer, seq_len, Path(work), num_proc, entry.name)
            if len(windows) == 0:  # seq_len longer than the corpus (or every document): nothing to cache
                return TokenWindows(datasets.Dataset.from_dict({"input_ids": []}, features=windows.features))
            staged = Path(work) / "final"
            windows.save_to_disk(str(staged))
            (staged / _COMPLETE).write_text(
                json.dumps({"source": source.name, "packing": source.packing, "seq_len": seq_len}) + "\n",
                encoding="utf-8",
            )
            publish_entry(staged, entry, _COMPLETE)
    return TokenWindows(datasets.load_from_disk(str(entry)), entry)
