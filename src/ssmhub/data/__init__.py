"""Datasets for training and evaluating ssmhub models, read from a local copy or the Hugging Face Hub.

A loader reads the official file layout from ``data_dir`` or ``$SSMHUB_DATA_DIR`` when one is given,
and downloads through ``datasets.load_dataset`` otherwise.
"""

from .pg19 import (
    PG19_HUB_DATASET,
    PG19_SPLITS,
    PG19Book,
    iter_pg19_books,
    pg19_book_ids,
    pg19_token_windows,
    pg19_word_count,
)
from .wikitext import (
    DATA_DIR_ENV,
    HUB_DATASET,
    WIKITEXT_VARIANTS,
    load_wikitext,
    pack_token_windows,
    resolve_data_dir,
    wikitext_articles,
)

__all__ = [
    "DATA_DIR_ENV",
    "HUB_DATASET",
    "PG19_HUB_DATASET",
    "PG19_SPLITS",
    "WIKITEXT_VARIANTS",
    "PG19Book",
    "iter_pg19_books",
    "load_wikitext",
    "pack_token_windows",
    "pg19_book_ids",
    "pg19_token_windows",
    "pg19_word_count",
    "resolve_data_dir",
    "wikitext_articles",
]
