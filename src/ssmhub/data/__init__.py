"""Datasets for training and evaluating ssmhub models, read from a local copy or the Hugging Face Hub.

A loader reads the official file layout from ``data_dir`` or ``$SSMHUB_DATA_DIR`` when one is given,
and downloads through ``datasets.load_dataset`` otherwise.
"""

from .listops import LISTOPS, LISTOPS_SUBTREES, ListOpsSpec, generate_listops, listops_splits, listops_value
from .pg19 import (
    PG19_HUB_DATASET,
    PG19_SPLITS,
    PG19Book,
    iter_pg19_books,
    pg19_book_ids,
    pg19_source,
    pg19_token_windows,
    pg19_word_count,
)
from .regular import (
    IGNORE_INDEX,
    TASK_NAMES,
    RegularTask,
    fixed_test_set,
    get_task,
    last_supervised_label,
    reference_labels,
)
from .token_cache import (
    CACHE_DIR_ENV,
    CorpusSource,
    TokenWindows,
    cached_token_windows,
    files_fingerprint,
    resolve_cache_dir,
    tokenizer_fingerprint,
)
from .token_stream import PackedWindows, TokenStream, cached_token_stream, packed_position_ids
from .wikitext import (
    DATA_DIR_ENV,
    HUB_DATASET,
    WIKITEXT_VARIANTS,
    load_wikitext,
    pack_token_windows,
    resolve_data_dir,
    wikitext_articles,
    wikitext_path,
    wikitext_source,
)

__all__ = [
    "CACHE_DIR_ENV",
    "DATA_DIR_ENV",
    "HUB_DATASET",
    "IGNORE_INDEX",
    "LISTOPS",
    "LISTOPS_SUBTREES",
    "PG19_HUB_DATASET",
    "PG19_SPLITS",
    "TASK_NAMES",
    "WIKITEXT_VARIANTS",
    "CorpusSource",
    "ListOpsSpec",
    "PG19Book",
    "PackedWindows",
    "RegularTask",
    "TokenStream",
    "TokenWindows",
    "cached_token_stream",
    "cached_token_windows",
    "files_fingerprint",
    "fixed_test_set",
    "generate_listops",
    "get_task",
    "iter_pg19_books",
    "last_supervised_label",
    "listops_splits",
    "listops_value",
    "load_wikitext",
    "pack_token_windows",
    "packed_position_ids",
    "pg19_book_ids",
    "pg19_source",
    "pg19_token_windows",
    "pg19_word_count",
    "reference_labels",
    "resolve_cache_dir",
    "resolve_data_dir",
    "tokenizer_fingerprint",
    "wikitext_articles",
    "wikitext_path",
    "wikitext_source",
]
