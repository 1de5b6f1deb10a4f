"""``ssmhub-eval``: sliding-window perplexity of a causal LM on WikiText or PG-19.

Example::

    ssmhub-eval runs/dlr-small --dataset pg19 --split validation --max_length 1024 --stride 512 \\
        --data-dir ../shared/data --output results.json

The model and tokenizer load with ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained`` (after
``import ssmhub``, so ssmhub's families resolve), from a folder or a Hub id. Data come from
``--data-dir`` or ``$SSMHUB_DATA_DIR`` (official layout), else from the Hub. Every input is checked
before the model loads; a bad one ends the run with a single error line (exit status 2).

Documents and word counts:

- PG-19: one document per book (streamed, one book at a time); words are whitespace-separated
  strings of the book text (:func:`ssmhub.data.pg19_word_count`).
- WikiText: one document per article (:func:`ssmhub.data.wikitext_articles`), or with ``--stream``
  the articles joined into one stream (the protocol of transformers' perplexity guide). Words follow
  the WikiText convention: the whitespace-separated tokens of the evaluated lines plus one ``<eos>``
  per line, blank lines included (217,646 words for WikiText-2 validation, 245,569 for test).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..data import (
    DATA_DIR_ENV,
    PG19_HUB_DATASET,
    WIKITEXT_VARIANTS,
    iter_pg19_books,
    load_wikitext,
    pg19_book_ids,
    pg19_word_count,
    resolve_data_dir,
    wikitext_articles,
)
from ..data.wikitext import HUB_DATASET as WIKITEXT_HUB_DATASET
from ..fileio import write_json_atomic
from ..tokenization import encode_document
from .perplexity import PerplexityResult, evaluate_perplexity, sliding_windows

__all__ = ["build_parser", "main", "run_evaluation", "write_json_atomic"]

DATASETS = (*WIKITEXT_VARIANTS, "pg19")
SPLITS = ("validation", "test")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ssmhub-eval",
        description="Sliding-window perplexity (token- and word-level) and top-1/top-5 accuracy of a causal LM.",
    )
    parser.add_argument("model", help="model folder or Hub id (loaded with AutoModelForCausalLM)")
    parser.add_argument("--dataset", required=True, choices=DATASETS)
    parser.add_argument("--split", default="validation", choices=SPLITS)
    parser.add_argument(
        "--max_length",
        "--max-length",
        dest="max_length",
        type=int,
        default=1024,
        help="tokens per window (default 1024)",
    )
    parser.add_argument(
        "--stride",
        type=int,
        default=None,
        help="how far a window advances, at most max_length (default max_length // 2)",
    )
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder or Hub id (default: the model's)")
    parser.add_argument(
        "--data-dir",
        default=None,
        help=f"data folder in the official layout (default ${DATA_DIR_ENV}; "
        "with neither, the dataset comes from the Hub)",
    )
    parser.add_argument("--max-documents", type=int, default=None, help="evaluate only the first N articles/books")
    parser.add_argument(
        "--stream", action="store_true", help="WikiText only: score the articles as one concatenated stream"
    )
    parser.add_argument("--batch-size", type=int, default=1, help="windows per forward pass (default 1)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--output", default=None, help="write the results as JSON to this file")
    parser.add_argument("--progress", action="store_true", help="show a progress bar over documents")
    return parser


def _looks_like_local_path(name: str) -> bool:
    """A name that can only mean a folder (a Hub id is "name" or "owner/name")."""
    if os.path.isabs(name) or name.startswith((".", "~")):
        return True
    return name.count("/") > 1 or (os.sep != "/" and os.sep in name)


def _check_model_source(name: str, what: str) -> None:
    if not os.path.exists(name) and _looks_like_local_path(name):
        raise FileNotFoundError(f"{what} folder {name} does not exist")


class _Documents:
    """The token ids of the documents to evaluate, produced lazily; counts their words as they go."""

    def __init__(self, texts: Iterator[tuple[str, int]], tokenizer) -> None:
        self._texts = texts  # (text, word count) per document
        self._tokenizer = tokenizer
        self.num_words = 0

    def __iter__(self) -> Iterator[list[int]]:
        for text, num_words in self._texts:
            self.num_words += num_words
            yield encode_document(self._tokenizer, text)


def _wikitext_word_count(rows: Sequence[str]) -> int:
    """Whitespace-separated tokens plus one ``<eos>`` per line (the official WikiText token counts)."""
    return sum(len(row.split()) for row in rows) + len(rows)


def _wikitext_texts(rows: list[str], max_documents: int | None, stream: bool) -> Iterator[tuple[str, int]]:
    """WikiText documents (articles, or one stream) with their word counts."""
    articles = wikitext_articles(rows)
    if max_documents is not None and max_documents < len(articles):
        # The rows of the first articles: those their text spans, and the blank rows that follow.
        chars, end = sum(len(article) for article in articles[:max_documents]), 0
        while chars > 0 or (end < len(rows) and not rows[end]):
            chars -= len(rows[end])
            end += 1
        rows, articles = rows[:end], articles[:max_documents]
    if not articles:
        return
    if stream:
        yield "".join(articles), _wikitext_word_count(rows)
        return
    yield articles[0], _wikitext_word_count(rows)  # the split's word count, credited once
    for article in articles[1:]:
        yield article, 0


def _prepare_data(args) -> tuple[Iterator[tuple[str, int]], str]:
    """Check the data source and return the documents' texts with word counts, and where they come from."""
    data_dir = resolve_data_dir(args.data_dir)
    if args.dataset == "pg19":
        if args.stream:
            raise ValueError("--stream is for WikiText; PG-19 is always scored book by book")
        if data_dir is None:
            source = f"hub:{PG19_HUB_DATASET}"
        else:
            if not pg19_book_ids(args.split, data_dir):  # raises, naming a missing folder
                raise FileNotFoundError(f"PG-19 split {args.split!r}: no ID.txt book files under {data_dir}")
            source = str(data_dir)
        books = iter_pg19_books(args.split, data_dir, max_books=args.max_documents)
        return ((book.text, pg19_word_count(book.text)) for book in books), source
    rows = load_wikitext(args.dataset, args.split, data_dir)  # raises, naming the missing file
    source = f"hub:{WIKITEXT_HUB_DATASET}" if data_dir is None else str(data_dir)
    return _wikitext_texts(rows, args.max_documents, args.stream), source


def _validate(args) -> None:
    """Raise ValueError / FileNotFoundError for any bad argument (before data or model load)."""
    if args.stride is None:
        args.stride = max(1, args.max_length // 2)
    sliding_windows(0, args.max_length, args.stride)  # checks max_length >= 2 and 0 < stride <= max_length
    for option in ("max_documents", "batch_size"):
        value = getattr(args, option)
        if value is not None and value < 1:
            raise ValueError(f"--{option.replace('_', '-')} must be positive; got {value}")
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise FileNotFoundError(f"--data-dir folder {args.data_dir} does not exist")
    _check_model_source(args.model, "model")
    if args.tokenizer is not None:
        _check_model_source(args.tokenizer, "tokenizer")


def _load_model_and_tokenizer(args):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import ssmhub  # noqa: F401  (registers ssmhub's families with the Auto classes)

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(args.model).to(device)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    return model, tokenizer


def _format_table(rows: list[dict]) -> str:
    header = ["dataset", "split", "documents", "tokens", "token ppl", "word ppl", "top-1", "top-5"]

    def fmt(value, pattern):
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else pattern.format(value)

    lines = [
        [
            r["dataset"],
            r["split"],
            str(r["num_documents"]),
            str(r["num_tokens"]),
            fmt(r["token_perplexity"], "{:.3f}"),
            fmt(r["word_perplexity"], "{:.3f}"),
            fmt(r["top1_accuracy"], "{:.2%}"),
            fmt(r["top5_accuracy"], "{:.2%}"),
        ]
        for r in rows
    ]
    widths = [max(len(cell) for cell in column) for column in zip(header, *lines)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [header, *lines])


def _json_safe(value):
    """NaN -> None, so the file is strict JSON."""
    return None if isinstance(value, float) and math.isnan(value) else value


def run_evaluation(argv: Sequence[str] | None = None) -> dict:
    """Parse ``argv``, evaluate, print the table, write ``--output``; return the JSON payload."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _validate(args)
        texts, source = _prepare_data(args)
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))  # one line on stderr, exit status 2

    model, tokenizer = _load_model_and_tokenizer(args)
    documents = _Documents(texts, tokenizer)
    result: PerplexityResult = evaluate_perplexity(
        model, documents, args.max_length, args.stride, batch_size=args.batch_size, progress=args.progress
    )
    result.num_words = documents.num_words
    row = {"dataset": args.dataset, "split": args.split, **{k: _json_safe(v) for k, v in result.to_dict().items()}}
    print(_format_table([row]))
    payload = {
        "model": args.model,
        "tokenizer": args.tokenizer or args.model,
        "data_source": source,
        "protocol": "stream" if args.stream else "document",
        "max_length": args.max_length,
        "stride": args.stride,
        "max_documents": args.max_documents,
        "command": ["ssmhub-eval", *(sys.argv[1:] if argv is None else argv)],
        "results": row,
    }
    if args.output:
        write_json_atomic(args.output, payload)
        print(f"wrote {args.output}")
    return payload


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of ``ssmhub-eval``; returns the exit status."""
    run_evaluation(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
