"""Training data: a registry of text datasets and their token windows, tokenized once and cached.

A dataset is registered under a name with a function ``source(split, data_dir) -> CorpusSource``
(``split`` is ``"train"`` or ``"validation"``) that resolves the split's files now and reads its
documents lazily. :func:`build_windows` turns both splits into token windows through
:func:`ssmhub.data.cached_token_windows` (``datasets.map``, an on-disk cache reused by later runs,
memory-mapped, streaming for PG-19). Registered: ``wikitext-2`` and ``wikitext-103`` (documents
joined by eos into one stream) and ``pg19`` (windows never cross a book). For packed and stateful
training the train split is kept as whole documents instead (:func:`ssmhub.data.cached_token_stream`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

from ..data import (
    DATA_DIR_ENV,
    CorpusSource,
    PackedWindows,
    TokenStream,
    TokenWindows,
    cached_token_stream,
    cached_token_windows,
    pg19_source,
    resolve_data_dir,
    wikitext_source,
)

__all__ = ["DATASETS", "build_windows", "check_data_dir", "corpus_source", "iter_documents", "register_dataset"]

SourceFactory = Callable[[str, "str | os.PathLike | None"], CorpusSource]
DATASETS: dict[str, SourceFactory] = {}


def register_dataset(name: str, source: SourceFactory) -> None:
    """Make ``name`` usable as ``TrainConfig.dataset``; ``source(split, data_dir)`` gives a split's CorpusSource."""
    DATASETS[name] = source


for _name in ("wikitext-2", "wikitext-103"):
    register_dataset(_name, partial(wikitext_source, _name))
register_dataset("pg19", pg19_source)


def check_data_dir(data_dir: str | os.PathLike | None) -> Path | None:
    """The data folder in use (``data_dir``, else ``$SSMHUB_DATA_DIR``, else None: the Hub); it must exist."""
    root = resolve_data_dir(data_dir)
    if root is not None and not root.is_dir():
        given = "data_dir" if data_dir is not None else f"${DATA_DIR_ENV}"
        raise FileNotFoundError(f"data folder {root} (from {given}) does not exist")
    return root


def corpus_source(dataset: str, split: str, data_dir: str | os.PathLike | None) -> CorpusSource:
    """The CorpusSource of one split of a registered dataset (its files are checked, not read)."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; registered datasets: {sorted(DATASETS)}")
    return DATASETS[dataset](split, data_dir)


def iter_documents(source: CorpusSource) -> Iterator[str]:
    """The documents of a split, one at a time (e.g. to train a tokenizer); ValueError if there are none."""
    empty = True
    for document in source.documents():
        empty = False
        yield document
    if empty:
        raise ValueError(f"corpus {source.name} holds no documents")


TRAIN_LAYOUTS = ("windows", "packed", "documents")


def build_windows(
    tokenizer,
    train_source: CorpusSource,
    valid_source: CorpusSource,
    seq_len: int,
    max_eval_windows: int = 0,
    cache_dir: str | os.PathLike | None = None,
    num_proc: int | None = None,
    train_layout: str = "windows",
) -> tuple[TokenWindows | PackedWindows | TokenStream, TokenWindows]:
    """Train data and validation windows (cached); validation keeps its first ``max_eval_windows`` (0: all).

    ``train_layout``: ``"windows"`` (fixed windows, as the dataset cuts them), ``"packed"`` (documents back
    to back, :class:`~ssmhub.data.PackedWindows`) or ``"documents"`` (the whole
    :class:`~ssmhub.data.TokenStream`, for stateful training). Validation is always fixed windows.
    """
    if train_layout not in TRAIN_LAYOUTS:
        raise ValueError(f"train_layout must be one of {TRAIN_LAYOUTS}; got {train_layout!r}")
    if train_layout == "windows":
        train = cached_token_windows(train_source, tokenizer, seq_len, cache_dir, num_proc)
    else:
        stream = cached_token_stream(train_source, tokenizer, cache_dir, num_proc)
        train = PackedWindows(stream, seq_len) if train_layout == "packed" else stream
    valid = cached_token_windows(valid_source, tokenizer, seq_len, cache_dir, num_proc)
    if len(train) == 0 or len(valid) == 0:
        raise ValueError(
            f"seq_len {seq_len} is longer than the whole tokenized split (or, for a dataset packed per "
            f"document, than every document): {len(train)} train and {len(valid)} validation windows"
        )
    return train, valid.head(max_eval_windows)
