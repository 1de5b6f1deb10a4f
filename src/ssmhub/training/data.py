"""Training data: a small registry of text datasets and their packing into token windows.

A dataset is registered under a name with a function ``load(split, data_dir) -> list[str]`` giving
the documents of a split (``"train"`` or ``"validation"``). :func:`build_windows` tokenizes both
splits and packs each, documents joined by eos, into ``(num_windows, seq_len)`` windows.
To add a dataset, call :func:`register_dataset` (e.g. PG-19 with a loader from ``ssmhub.data``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from ..data import DATA_DIR_ENV, load_wikitext, pack_token_windows, resolve_data_dir, wikitext_articles

__all__ = ["DATASETS", "build_windows", "check_data_dir", "load_documents", "register_dataset"]

DocumentLoader = Callable[[str, "str | os.PathLike | None"], list[str]]
DATASETS: dict[str, DocumentLoader] = {}


def register_dataset(name: str, loader: DocumentLoader) -> None:
    """Make ``name`` usable as ``TrainConfig.dataset``; ``loader(split, data_dir)`` returns documents."""
    DATASETS[name] = loader


def _wikitext_documents(name: str, split: str, data_dir: str | os.PathLike | None) -> list[str]:
    return wikitext_articles(load_wikitext(name, split, data_dir))


def _not_available(name: str, split: str, data_dir: str | os.PathLike | None) -> list[str]:
    raise NotImplementedError(
        f"dataset {name!r} is not available yet for training (no loader in ssmhub.data); "
        f"available: {sorted(n for n, loader in DATASETS.items() if not _is_placeholder(loader))}"
    )


def _is_placeholder(loader: DocumentLoader) -> bool:
    return isinstance(loader, partial) and loader.func is _not_available


for _name in ("wikitext-2", "wikitext-103"):
    register_dataset(_name, partial(_wikitext_documents, _name))
register_dataset("pg19", partial(_not_available, "pg19"))


def check_data_dir(data_dir: str | os.PathLike | None) -> Path | None:
    """The data folder in use (``data_dir``, else ``$SSMHUB_DATA_DIR``, else None: the Hub); it must exist."""
    root = resolve_data_dir(data_dir)
    if root is not None and not root.is_dir():
        given = "data_dir" if data_dir is not None else f"${DATA_DIR_ENV}"
        raise FileNotFoundError(f"data folder {root} (from {given}) does not exist")
    return root


def load_documents(dataset: str, split: str, data_dir: str | os.PathLike | None) -> list[str]:
    """The documents of one split of a registered dataset."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; registered datasets: {sorted(DATASETS)}")
    documents = DATASETS[dataset](split, data_dir)
    if not documents:
        raise ValueError(f"dataset {dataset!r} split {split!r} holds no documents")
    return documents


def tokenize_windows(tokenizer, documents: list[str], seq_len: int) -> torch.LongTensor:
    """Tokenize documents and pack them, joined by eos, into ``(num_windows, seq_len)`` windows."""
    ids = tokenizer(documents, add_special_tokens=False)["input_ids"]
    return pack_token_windows(ids, seq_len, eos_token_id=tokenizer.eos_token_id)


def build_windows(
    tokenizer, train_documents: list[str], valid_documents: list[str], seq_len: int, max_eval_windows: int = 0
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Train and validation windows; validation keeps its first ``max_eval_windows`` (0: all)."""
    train = tokenize_windows(tokenizer, train_documents, seq_len)
    valid = tokenize_windows(tokenizer, valid_documents, seq_len)
    if len(train) == 0 or len(valid) == 0:
        raise ValueError(
            f"seq_len {seq_len} is longer than the whole tokenized split: {len(train)} train and {len(valid)} "
            "validation windows"
        )
    if 0 < max_eval_windows < len(valid):
        valid = valid[:max_eval_windows]
    return train, valid
