"""PG-19 (Rae et al., 2019): book-level streaming, per-book token windows and the word count.

Books are read one at a time, never a whole split at once (a book is often more than 1 MB), from a
local copy in the official layout when a data folder is given (``data_dir`` or ``$SSMHUB_DATA_DIR``),
else streamed from the Hugging Face Hub (``datasets.load_dataset("deepmind/pg19", split=...,
streaming=True)``, whose rows carry ``short_book_title``, ``publication_date``, ``url`` and ``text``).

Local layout (as in the official ``gs://deepmind-gutenberg`` bucket), under ``<data folder>/pg19``
(or directly under the data folder when it is itself a PG-19 folder)::

    metadata.csv                 no header: id, short_book_title, publication_date, url
    train/ID.txt  validation/ID.txt  test/ID.txt

A split's books are the ``ID.txt`` files present in its folder, in bucket (lexicographic file name)
order. Book files have CRLF line endings; they are read with Python's universal newlines, so the text
has ``"\\n"`` line ends, exactly as the Hub copy (whose builder reads the same files the same way).

Word-level perplexity (:func:`pg19_word_count`): PG-19 reports perplexity per word, i.e.
``exp(total NLL in nats over all predicted tokens of the split / number of words of the split)``.
None of the papers this library implements says how the words are counted; we use the convention of
the PG-19 release, words = whitespace-separated strings of the book text (``len(text.split())``),
so a word-level number does not depend on the tokenizer.
"""

from __future__ import annotations

import csv
import functools
import itertools
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ..tokenization import encode_document
from .token_cache import CorpusSource, files_fingerprint
from .wikitext import DATA_DIR_ENV, resolve_data_dir

__all__ = [
    "PG19_HUB_DATASET",
    "PG19_SPLITS",
    "PG19Book",
    "iter_pg19_books",
    "pg19_book_ids",
    "pg19_source",
    "pg19_token_windows",
    "pg19_word_count",
]

PG19_HUB_DATASET = "deepmind/pg19"
PG19_SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class PG19Book:
    """One PG-19 book: its Project Gutenberg id, short title, publication year, url and full text."""

    book_id: str
    title: str
    text: str
    publication_date: str = ""
    url: str = ""


def pg19_word_count(text: str) -> int:
    """Number of words of a PG-19 text: its whitespace-separated strings (see the module docstring)."""
    return len(text.split())


def _check_split(split: str) -> None:
    if split not in PG19_SPLITS:
        raise ValueError(f"unknown PG-19 split {split!r}; expected one of {list(PG19_SPLITS)}")


def _pg19_root(data_dir: str | os.PathLike | None) -> Path | None:
    """The local PG-19 folder (``<data>/pg19``, or ``<data>`` itself if it holds the layout), or None."""
    root = resolve_data_dir(data_dir)
    if root is None:
        return None
    if not root.is_dir():
        raise FileNotFoundError(
            f"PG-19: data folder {root} does not exist. Point data_dir / ${DATA_DIR_ENV} at a folder with "
            "the official layout, or leave both unset to stream PG-19 from the Hub."
        )
    nested = root / "pg19"
    if nested.is_dir() or not any((root / name).exists() for name in (*PG19_SPLITS, "metadata.csv")):
        return nested
    return root


def _split_folder(root: Path, split: str) -> Path:
    folder = root / split
    if not folder.is_dir():
        found = f"{root} holds {sorted(p.name for p in root.iterdir())}" if root.is_dir() else f"{root} does not exist"
        raise FileNotFoundError(f"PG-19 split {split!r}: missing folder {folder} ({found})")
    return folder


def pg19_book_ids(split: str = "validation", data_dir: str | os.PathLike | None = None) -> list[str]:
    """The ids of a local split's books, from its folder listing, in bucket order.

    Raises:
        ValueError: unknown ``split``, or no data folder in use (the Hub copy has no cheap listing;
            iterate :func:`iter_pg19_books` instead).
        FileNotFoundError: the data folder or the split's folder is missing (the error names it).
    """
    _check_split(split)
    root = _pg19_root(data_dir)
    if root is None:
        raise ValueError(f"pg19_book_ids needs a local data folder (data_dir or ${DATA_DIR_ENV})")
    return sorted(path.stem for path in _split_folder(root, split).glob("*.txt"))


def _read_metadata(root: Path) -> dict[str, tuple[str, str, str]]:
    """``metadata.csv`` as id -> (short_book_title, publication_date, url); empty if the file is absent."""
    path = root / "metadata.csv"
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8", newline="") as f:
        return {row[0]: (row[1], row[2], row[3]) for row in csv.reader(f) if len(row) >= 4}


def _local_books(root: Path, folder: Path) -> Iterator[PG19Book]:
    metadata = _read_metadata(root)
    for book_id in sorted(path.stem for path in folder.glob("*.txt")):
        title, date, url = metadata.get(book_id, ("", "", ""))
        with open(folder / f"{book_id}.txt", encoding="utf-8") as f:  # universal newlines: CRLF -> "\n"
            text = f.read()
        yield PG19Book(book_id, title, text, date, url)


def _hub_books(split: str) -> Iterator[PG19Book]:
    import datasets  # imported here: only the Hub path needs it

    for row in datasets.load_dataset(PG19_HUB_DATASET, split=split, streaming=True):
        url = row.get("url") or ""
        yield PG19Book(
            book_id=url.rstrip("/").rsplit("/", 1)[-1],
            title=row.get("short_book_title") or "",
            text=row["text"],
            publication_date=str(row.get("publication_date") or ""),
            url=url,
        )


def iter_pg19_books(
    split: str = "validation", data_dir: str | os.PathLike | None = None, max_books: int | None = None
) -> Iterator[PG19Book]:
    """Iterate the books of a PG-19 split, one book in memory at a time.

    Args:
        split: ``"train"``, ``"validation"`` or ``"test"``.
        data_dir: data folder holding ``pg19/`` in the official layout (or a PG-19 folder itself);
            default ``$SSMHUB_DATA_DIR``. With neither, the split is streamed from the Hub
            (``deepmind/pg19``; the book id is the last part of its ``url``).
        max_books: stop after this many books (the Hub stream then downloads no more).

    Raises (when called, before the first book):
        ValueError: unknown ``split`` or negative ``max_books``.
        FileNotFoundError: the data folder or the split's folder is missing (the error names it); a
            data folder in use is never silently replaced by a download.
    """
    _check_split(split)
    if max_books is not None and max_books < 0:
        raise ValueError(f"max_books must be non-negative; got {max_books}")
    root = _pg19_root(data_dir)
    # The split folder is checked now, so a missing one fails here rather than at the first next().
    books = _hub_books(split) if root is None else _local_books(root, _split_folder(root, split))
    return itertools.islice(books, max_books)


def pg19_source(
    split: str = "train", data_dir: str | os.PathLike | None = None, max_books: int | None = None
) -> CorpusSource:
    """A split's books as a :class:`~ssmhub.data.token_cache.CorpusSource` with "document" packing.

    Windows built from it never cross a book boundary, and the books are read one at a time. The
    split is resolved now (a missing local folder fails here); the fingerprint of a local split is
    its book files' names, sizes and times, of a Hub split its id (and ``max_books``).
    """
    _check_split(split)
    if max_books is not None and max_books < 0:
        raise ValueError(f"max_books must be non-negative; got {max_books}")
    root = _pg19_root(data_dir)
    if root is None:
        fingerprint = f"hub:{PG19_HUB_DATASET}/{split}/max_books={max_books}"
    else:
        files = sorted(_split_folder(root, split).glob("*.txt"))[:max_books]
        fingerprint = files_fingerprint(files)
    name = f"pg19/{split}" + (f"-{max_books}books" if max_books is not None else "")
    return CorpusSource(name, functools.partial(_book_texts, split, data_dir, max_books), fingerprint, "document")


def _book_texts(split: str, data_dir: str | os.PathLike | None, max_books: int | None) -> Iterator[str]:
    return (book.text for book in iter_pg19_books(split, data_dir, max_books))


def pg19_token_windows(books: Iterable[PG19Book | str], tokenizer, seq_len: int) -> Iterator[torch.LongTensor]:
    """Tokenize books one at a time and yield ``(seq_len,)`` int64 windows that never cross a book.

    Each book is cut into consecutive non-overlapping windows; its tail of fewer than ``seq_len``
    tokens is dropped (for evaluation, score the tail with the sliding-window protocol of
    :func:`ssmhub.evaluation.evaluate_perplexity` instead). ``books`` may hold :class:`PG19Book`
    objects or plain texts.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be positive; got {seq_len}")
    for book in books:
        ids = torch.tensor(encode_document(tokenizer, book.text if isinstance(book, PG19Book) else book))
        for start in range(0, len(ids) - seq_len + 1, seq_len):
            yield ids[start : start + seq_len].to(torch.long)
