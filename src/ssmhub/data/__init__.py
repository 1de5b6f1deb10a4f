"""Datasets for training and evaluating ssmhub models, read from a local copy or the Hugging Face Hub.

A loader reads the official file layout from ``data_dir`` or ``$SSMHUB_DATA_DIR`` when one is given,
and downloads through ``datasets.load_dataset`` otherwise.
"""

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
    "WIKITEXT_VARIANTS",
    "load_wikitext",
    "pack_token_windows",
    "resolve_data_dir",
    "wikitext_articles",
]
