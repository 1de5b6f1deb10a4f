"""``ssmhub-eval``: sliding-window perplexity of a causal LM on WikiText or PG-19.

Example::

    ssmhub-eval runs/dlr-small --dataset pg19 --split validation --max_length 1024 --stride 512 \\
        --data_dir ../shared/data --output results.json
    ssmhub-eval runs/dlr-small/checkpoints/step-2000 --dataset wikitext-2   # a training checkpoint

The model and tokenizer load with ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained`` (after
``import ssmhub``, so ssmhub's families resolve), from a folder or a Hub id; a training checkpoint
(``output_dir/checkpoints/step-N``) is rebuilt from its run's config and tokenizer
(:mod:`ssmhub.training.checkpoint_model`). Data come from ``--data_dir`` or ``$SSMHUB_DATA_DIR``
(official layout), else from the Hub. Every input is checked before the model loads: a folder that is
no saved model, has no tokenizer or holds a classifier, an unusable ``--device``, an ``--output`` that is
a folder; a bad one ends the run with a single error line (exit status 2).

Documents and word counts:

- PG-19: one document per book (streamed, one book at a time); words are whitespace-separated
  strings of the book text (:func:`ssmhub.data.pg19_word_count`).
- WikiText: one document per article (:func:`ssmhub.data.wikitext_articles`), or with ``--stream``
  the articles joined into one stream (the protocol of transformers' perplexity guide). Words follow
  the WikiText convention: the whitespace-separated tokens of the evaluated lines plus one ``<eos>``
  per line, blank lines included (217,646 words for WikiText-2 validation, 245,569 for test).
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..command_line import CommandLineParser
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
from ..preflight import check_device, check_output_file, model_config_class
from ..tokenization import encode_document
from ..training.checkpoint import CheckpointError
from ..training.checkpoint_model import checkpoint_tokenizer_dir, is_training_checkpoint, load_checkpoint_model
from .perplexity import PerplexityResult, evaluate_perplexity, sliding_windows

__all__ = ["build_parser", "main", "run_evaluation", "write_json_atomic"]

DATASETS = (*WIKITEXT_VARIANTS, "pg19")
SPLITS = ("validation", "test")
# Files of which a tokenizer folder holds at least one (fast, slow BPE, SentencePiece or WordPiece tokenizers).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "vocab.txt",
)


def build_parser() -> CommandLineParser:
    """The options of ``ssmhub-eval`` (each flag also accepted with dashes, e.g. ``--max-length``)."""
    parser = CommandLineParser(
        prog="ssmhub-eval",
        description="Sliding-window perplexity (token- and word-level) and top-1/top-5 accuracy of a causal LM.",
    )
    parser.add_argument(
        "model",
        help="model folder (saved with save_pretrained, or a training checkpoint output_dir/checkpoints/step-N) "
        "or Hub id, loaded with AutoModelForCausalLM",
    )
    parser.add_argument("--dataset", required=True, choices=DATASETS)
    parser.add_argument("--split", default="validation", choices=SPLITS)
    parser.add_argument("--max_length", type=int, default=1024, help="tokens per window (default 1024)")
    parser.add_argument(
        "--stride",
        type=int,
        default=None,
        help="how far a window advances, at most max_length (default max_length // 2)",
    )
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder or Hub id (default: the model's)")
    parser.add_argument(
        "--data_dir",
        default=None,
        help=f"data folder in the official layout (default ${DATA_DIR_ENV}; "
        "with neither, the dataset comes from the Hub)",
    )
    parser.add_argument("--max_documents", type=int, default=None, help="evaluate only the first N articles/books")
    parser.add_argument(
        "--stream", action="store_true", help="WikiText only: score the articles as one concatenated stream"
    )
    parser.add_argument("--batch_size", type=int, default=1, help="windows per forward pass (default 1)")
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
    if os.path.isfile(name):
        raise ValueError(f"{what} {name} is a file; give the folder that holds it (or a Hub id)")


def _check_tokenizer_folder(folder: Path, option: str) -> None:
    """Raise ValueError when a local folder, used as the tokenizer, holds no tokenizer file."""
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(
            f"{option} folder {folder} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
            "pass --tokenizer FOLDER_OR_HUB_ID"
        )


def _check_causal_lm_folder(folder: Path) -> None:
    """Raise ValueError unless the model folder's ``config.json`` describes a causal LM: a folder that is no
    saved model, a classifier (whose LM head would be random) or an unknown model type is refused."""
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from ..models.auto import FAMILIES

    if not (folder / "config.json").is_file():
        raise ValueError(
            f"model folder {folder} has no config.json: give a folder saved with save_pretrained (an ssmhub-train "
            "output_dir), a training checkpoint (output_dir/checkpoints/step-N) or a Hub id"
        )
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    causal = {*MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()}
    causal |= {classes["AutoModelForCausalLM"].__name__ for classes in FAMILIES.values()}
    architectures = config.get("architectures") or []
    if architectures and not any(name in causal or name.endswith("ForCausalLM") for name in architectures):
        raise ValueError(
            f"model {folder} is a {architectures[0]}, not a causal language model: ssmhub-eval scores next-token "
            "predictions (a ...ForCausalLM model)"
        )
    if "AutoModelForCausalLM" not in config.get("auto_map", {}):
        model_config_class(
            config.get("model_type", ""), AutoModelForCausalLM, "a causal LM", option=f"{folder}/config.json model_type"
        )


def _check_model(args) -> None:
    """Check the model (and tokenizer) arguments; resolve ``args.tokenizer`` (a training checkpoint's run
    tokenizer, else the model's own)."""
    _check_model_source(args.model, "model")
    if args.tokenizer is not None:
        _check_model_source(args.tokenizer, "--tokenizer")
        _check_tokenizer_folder(Path(args.tokenizer), "--tokenizer")
    folder = Path(args.model)
    if not folder.is_dir():
        args.tokenizer = args.tokenizer or args.model  # a Hub id: checked when it loads
        return
    if is_training_checkpoint(folder):
        args.tokenizer = args.tokenizer or str(checkpoint_tokenizer_dir(folder))
        return
    _check_causal_lm_folder(folder)
    if args.tokenizer is None:
        _check_tokenizer_folder(folder, "model")
        args.tokenizer = args.model


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
    """Raise ValueError / FileNotFoundError for any bad argument (before data or model load); resolve
    ``args.stride``, ``args.device`` and ``args.tokenizer``."""
    if args.stride is None:
        args.stride = max(1, args.max_length // 2)
    sliding_windows(0, args.max_length, args.stride)  # checks max_length >= 2 and 0 < stride <= max_length
    for option in ("max_documents", "batch_size"):
        value = getattr(args, option)
        if value is not None and value < 1:
            raise ValueError(f"--{option} must be positive; got {value}")
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise FileNotFoundError(f"--data_dir folder {args.data_dir} does not exist")
    check_output_file(args.output, "--output")
    args.device = check_device(args.device, "--device")
    _check_model(args)


def _load_model_and_tokenizer(args):
    """The model (on ``args.device``, a training checkpoint rebuilt from its run) and its tokenizer.

    Raises ValueError when weights the model needs are missing from the folder (they would be random) or
    the model cannot be loaded (an unknown Hub id: one line, not a traceback).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import ssmhub  # noqa: F401  (registers ssmhub's families with the Auto classes)

    try:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        if is_training_checkpoint(args.model):
            return load_checkpoint_model(args.model, tokenizer).to(args.device), tokenizer
        model, info = AutoModelForCausalLM.from_pretrained(args.model, output_loading_info=True)
    except OSError as err:
        raise ValueError(f"model {args.model} / tokenizer {args.tokenizer} could not be loaded: {err}") from None
    if info["missing_keys"]:
        missing = sorted(info["missing_keys"])
        raise ValueError(
            f"model {args.model} lacks weights a causal LM needs ({', '.join(missing[:3])}); they would be random"
        )
    return model.to(args.device), tokenizer


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
    """Parse ``argv``, evaluate, print the table, write ``--output``; return the JSON payload.

    Every argument is checked before the data and the model load; a bad one ends the program with one
    error line and exit status 2.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    with parser.bad_input_errors(CheckpointError):
        _validate(args)
        texts, source = _prepare_data(args)
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
        "tokenizer": args.tokenizer,
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
