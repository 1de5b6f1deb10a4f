"""WikiText-2 / WikiText-103 (Merity et al., 2016): loading, article splitting and window packing.

:func:`load_wikitext` returns a split as a ``list[str]`` with exactly the rows of the Hugging Face
``Salesforce/wikitext`` dataset's ``"text"`` column: one entry per line of the official file, a
non-blank line keeps its trailing ``"\\n"`` and a blank line is ``""``. The rows come from a local
copy of the official release when a data folder is given (``data_dir`` or ``$SSMHUB_DATA_DIR``),
else from the Hub, so the same code serves both and gives the same strings.

Local layout (as in the official zips), under the data folder::

    wikitext-2/wiki.{train,valid,test}.tokens         wikitext-103/wiki.{train,valid,test}.tokens
    wikitext-2-raw/wiki.{train,valid,test}.raw        wikitext-103-raw/wiki.{train,valid,test}.raw

:func:`wikitext_articles` groups rows into articles (documents) and :func:`pack_token_windows` turns
tokenized documents into fixed-length training / evaluation windows.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .token_cache import CorpusSource, files_fingerprint

__all__ = [
    "DATA_DIR_ENV",
    "HUB_DATASET",
    "WIKITEXT_VARIANTS",
    "load_wikitext",
    "pack_token_windows",
    "resolve_data_dir",
    "wikitext_articles",
    "wikitext_path",
    "wikitext_source",
]

DATA_DIR_ENV = "SSMHUB_DATA_DIR"
HUB_DATASET = "Salesforce/wikitext"  # the canonical id of the former "wikitext" dataset (same configs)


@dataclass(frozen=True)
class WikiTextVariant:
    """Where one WikiText variant lives: its local folder, its file suffix and its Hub config."""

    folder: str
    suffix: str
    hub_config: str


WIKITEXT_VARIANTS: dict[str, WikiTextVariant] = {
    "wikitext-2": WikiTextVariant("wikitext-2", "tokens", "wikitext-2-v1"),
    "wikitext-103": WikiTextVariant("wikitext-103", "tokens", "wikitext-103-v1"),
    "wikitext-2-raw": WikiTextVariant("wikitext-2-raw", "raw", "wikitext-2-raw-v1"),
    "wikitext-103-raw": WikiTextVariant("wikitext-103-raw", "raw", "wikitext-103-raw-v1"),
}
# Hub config names are accepted as names too ("wikitext-2-v1" -> "wikitext-2", ...).
_ALIASES = {variant.hub_config: name for name, variant in WIKITEXT_VARIANTS.items()}

# split name -> (file stem in the official release, split name on the Hub)
_SPLITS = {
    "train": ("train", "train"),
    "validation": ("valid", "validation"),
    "valid": ("valid", "validation"),
    "test": ("test", "test"),
}

# A level-1 heading " = Title = " (level-2 and deeper are " = = Section = = ").
_ARTICLE_HEADING = re.compile(r"^ = [^=].* = $")


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The local data folder: ``data_dir`` if given, else ``$SSMHUB_DATA_DIR`` if set and non-empty, else None."""
    if data_dir is None:
        data_dir = os.environ.get(DATA_DIR_ENV) or None
    return Path(data_dir) if data_dir is not None else None


def _variant_and_split(name: str, split: str) -> tuple[WikiTextVariant, str, str]:
    """The variant of ``name`` and the (file stem, Hub split) of ``split``; ValueError for unknown ones."""
    variant = WIKITEXT_VARIANTS.get(_ALIASES.get(name, name))
    if variant is None:
        raise ValueError(f"unknown WikiText variant {name!r}; expected one of {sorted(WIKITEXT_VARIANTS)}")
    if split not in _SPLITS:
        raise ValueError(f"unknown WikiText split {split!r}; expected one of {sorted(_SPLITS)}")
    return (variant, *_SPLITS[split])


def wikitext_path(name: str, split: str, data_dir: str | os.PathLike | None = None) -> Path | None:
    """The local file of a split (checked to exist), or None when no data folder is in use (the Hub).

    Raises:
        ValueError: unknown ``name`` or ``split``.
        FileNotFoundError: a data folder is in use but lacks the split's file (the error names it).
    """
    variant, file_stem, _ = _variant_and_split(name, split)
    root = resolve_data_dir(data_dir)
    if root is None:
        return None
    path = root / variant.folder / f"wiki.{file_stem}.{variant.suffix}"
    if not path.is_file():
        folder = path.parent
        present = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        found = f"that folder holds {present}" if folder.is_dir() else "that folder does not exist"
        raise FileNotFoundError(
            f"{name} split {split!r}: missing file {path} ({found}). Point data_dir / ${DATA_DIR_ENV} at a "
            "folder with the official layout, or leave both unset to download the split from the Hub."
        )
    return path


def wikitext_source(name: str, split: str, data_dir: str | os.PathLike | None = None) -> CorpusSource:
    """A split's articles as a :class:`~ssmhub.data.token_cache.CorpusSource` (packing "stream").

    The local file (or the Hub config) is resolved now, so a missing file fails here.
    """
    variant, _, hub_split = _variant_and_split(name, split)
    path = wikitext_path(name, split, data_dir)
    fingerprint = (
        files_fingerprint([path]) if path is not None else f"hub:{HUB_DATASET}/{variant.hub_config}/{hub_split}"
    )
    documents = functools.partial(_articles, name, split, data_dir)
    return CorpusSource(f"{variant.folder}/{hub_split}", documents, fingerprint, packing="stream")


def _articles(name: str, split: str, data_dir: str | os.PathLike | None) -> list[str]:
    return wikitext_articles(load_wikitext(name, split, data_dir))


def load_wikitext(
    name: str = "wikitext-2", split: str = "train", data_dir: str | os.PathLike | None = None
) -> list[str]:
    """Load one split of WikiText as a list of rows (see the module docstring for their format).

    Args:
        name: ``"wikitext-2"``, ``"wikitext-103"``, ``"wikitext-2-raw"`` or ``"wikitext-103-raw"``
            (Hub config names such as ``"wikitext-2-v1"`` are accepted too).
        split: ``"train"``, ``"validation"`` (or ``"valid"``) or ``"test"``.
        data_dir: folder holding the official layout; default ``$SSMHUB_DATA_DIR``. With neither,
            the split is downloaded with ``datasets.load_dataset("Salesforce/wikitext", config)``.

    Raises:
        ValueError: unknown ``name`` or ``split``.
        FileNotFoundError: a data folder is in use but lacks the split's file (it is not silently
            replaced by a download; unset ``$SSMHUB_DATA_DIR`` to use the Hub).
    """
    variant, _, hub_split = _variant_and_split(name, split)
    path = wikitext_path(name, split, data_dir)
    if path is None:
        import datasets  # imported here: only the Hub path needs it

        dataset = datasets.load_dataset(HUB_DATASET, variant.hub_config, split=hub_split)
        return list(dataset["text"])
    with open(path, encoding="utf-8", newline="") as f:
        # The Hub dataset's rows: every line with its "\n", blank lines as "" (what its builder does).
        return [line if line.strip() else "" for line in f]


def wikitext_articles(rows: Sequence[str]) -> list[str]:
    """Group WikiText rows into articles, each the concatenation of its rows.

    An article starts at a level-1 heading row (``" = Title = \\n"``) that stands between blank rows
    (equations inside articles sometimes look like headings, but are not set off by blank rows).
    Blank rows vanish in the join; every other character is kept. Rows before the first heading
    form an article of their own. WikiText-2 has 600 / 60 / 60 articles in train / valid / test.
    """
    articles: list[list[str]] = []
    for i, row in enumerate(rows):
        is_heading = (
            _ARTICLE_HEADING.match(row.rstrip("\n")) is not None
            and (i == 0 or not rows[i - 1].strip())
            and (i + 1 == len(rows) or not rows[i + 1].strip())
        )
        if is_heading or not articles:
            articles.append([])
        articles[-1].append(row)
    texts = ("".join(article) for article in articles)
    return [text for text in texts if text]


def pack_token_windows(
    token_ids: Iterable[Sequence[int]], seq_len: int, eos_token_id: int | None = None
) -> torch.LongTensor:
    """Concatenate tokenized documents into one stream and cut it into non-overlapping windows.

    Args:
        token_ids: one sequence of token ids per document.
        seq_len: length of each window.
        eos_token_id: if given, inserted between consecutive documents (not after the last one),
            so a model sees where one document ends and the next begins.

    Returns:
        A ``(len(stream) // seq_len, seq_len)`` int64 tensor; the last ``len(stream) % seq_len``
        tokens, too few for a window, are dropped.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be positive; got {seq_len}")
    stream: list[int] = []
    for i, doc in enumerate(token_ids):
        if i > 0 and eos_token_id is not None:
            stream.append(eos_token_id)
        stream.extend(doc)
    num_windows = len(stream) // seq_len
    return torch.tensor(stream[: num_windows * seq_len], dtype=torch.long).view(num_windows, seq_len)
