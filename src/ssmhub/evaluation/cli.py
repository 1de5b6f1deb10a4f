"""``ssmhub-eval``: perplexity of a causal LM on WikiText or PG-19, by sliding windows or statefully.

Example::

    ssmhub-eval runs/dlr-small --dataset pg19 --split validation --max_length 1024 --stride 512 \\
        --data_dir ../shared/data --output results.json
    ssmhub-eval runs/dlr-small/checkpoints/step-2000 --dataset wikitext-2   # a training checkpoint
    ssmhub-eval runs/dlr-small --dataset pg19 --stateful --max_length 4096   # whole books, state carried

Two protocols; the output (printed and ``scoring`` in the JSON) names the one that ran:

- ``sliding_window`` (the default): windows of ``--max_length`` tokens advance by ``--stride``; a token sees at
  most ``--max_length`` tokens of context (:mod:`ssmhub.evaluation.perplexity`). Any causal LM.
- ``stateful`` (``--stateful``): each document runs start to end in windows of ``--max_length`` tokens that
  carry the model's recurrent cache, so every token is conditioned on all of its document before it, at
  memory flat in the document's length; perplexity is also reported by the token's position in its document
  (:mod:`ssmhub.evaluation.stateful`). ssmhub's recurrent models only; a hybrid with attention layers needs a
  sliding attention window, ``--attention_window W`` (its cache then keeps the last W − 1 keys and values).

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
from ..preflight import check_device, check_output_file, check_stateful_model, model_config_class
from ..tokenization import encode_document
from ..training.checkpoint import CheckpointError
from ..training.checkpoint_model import checkpoint_tokenizer_dir, is_training_checkpoint, load_checkpoint_model
from .perplexity import evaluate_perplexity, sliding_windows
from .scores import POSITION_BUCKETS, PerplexityResult
from .stateful import evaluate_perplexity_stateful

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
        description="Perplexity (token- and word-level) and top-1/top-5 accuracy of a causal LM: sliding windows "
        "(default) or --stateful (whole documents, recurrent state carried; by position in the document).",
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
        help="sliding windows: how far a window advances, at most max_length (default max_length // 2)",
    )
    parser.add_argument(
        "--stateful",
        action="store_true",
        help="score each document start to end in windows of max_length that carry the recurrent state (every "
        "token conditioned on its whole document before it); report perplexity by position in the document",
    )
    parser.add_argument(
        "--attention_window",
        type=int,
        default=None,
        help="models with attention layers (H3 hybrids): each token attends to its last W tokens and the cache "
        "keeps W - 1 keys/values (needed with --stateful; default: the model's config)",
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
    parser.add_argument(
        "--batch_size", type=int, default=1, help="sliding windows: windows per forward pass (default 1)"
    )
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


def _local_model_config(name: str):
    """The config of a local model folder or training checkpoint, read without loading weights: an ssmhub
    family's config object (its defaults filled in, e.g. H3's ``attention_layers``), for another model a
    ``PretrainedConfig`` carrying only its ``model_type``; None for a Hub id."""
    from transformers import PretrainedConfig

    from ..models.auto import FAMILIES

    folder = Path(name)
    if not folder.is_dir():
        return None
    if is_training_checkpoint(folder):
        run = json.loads((folder.absolute().parent.parent / "train_config.json").read_text(encoding="utf-8"))
        model_type, fields = run.get("model_type", ""), run.get("model_config") or {}
    else:
        fields = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        model_type = fields.get("model_type", "")
    if model_type not in FAMILIES:
        config = PretrainedConfig()
        config.model_type = model_type
        return config
    config_class = FAMILIES[model_type]["AutoConfig"]
    known = {key: value for key, value in fields.items() if key in config_class().to_dict()}
    return config_class(**known)


def check_model_protocol(config, args) -> None:
    """Raise ValueError when the model of ``config`` cannot run the chosen protocol: ``--stateful`` needs an
    ssmhub model (a cache of fixed size; transformers' attention caches grow with the document) and, where it
    has attention layers, a sliding attention window (``--attention_window`` or the config's);
    ``--attention_window`` needs attention layers."""
    model_type = getattr(config, "model_type", "")
    attention_layers = list(getattr(config, "attention_layers", None) or [])
    if args.attention_window is not None and not attention_layers:
        raise ValueError(
            f"--attention_window is for ssmhub models with attention layers (H3's attention_layers); model "
            f"{args.model} ({model_type}) has none: drop --attention_window"
        )
    if args.stateful:
        check_stateful_model(
            config,
            f"model {args.model}",
            "evaluate it without --stateful (sliding windows)",
            "pass --attention_window W (each token attends to its last W tokens, e.g. the training length) or "
            "evaluate without --stateful (sliding windows)",
            args.attention_window,
        )


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


def _validate_stateful_options(args) -> None:
    """Raise ValueError for options the stateful protocol has no use for (they would be silently ignored)."""
    if args.stride is not None:
        raise ValueError(
            "--stride is for sliding windows; --stateful has none (each window starts where the last one ended, "
            "carrying the state): drop --stride"
        )
    if args.batch_size != 1:
        raise ValueError(
            f"--batch_size {args.batch_size}: --stateful streams one document at a time (its windows run in order, "
            "each continuing from the last); drop --batch_size"
        )
    if args.max_length < 1:
        raise ValueError(f"--max_length must be positive (tokens per window); got {args.max_length}")


def _validate(args) -> None:
    """Raise ValueError / FileNotFoundError for any bad argument (before data or model load); resolve
    ``args.stride``, ``args.device`` and ``args.tokenizer``."""
    if args.stateful:
        _validate_stateful_options(args)
    else:
        if args.stride is None:
            args.stride = max(1, args.max_length // 2)
        sliding_windows(0, args.max_length, args.stride)  # checks max_length >= 2 and 0 < stride <= max_length
    for option in ("max_documents", "batch_size", "attention_window"):
        value = getattr(args, option)
        if value is not None and value < 1:
            raise ValueError(f"--{option} must be positive; got {value}")
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise FileNotFoundError(f"--data_dir folder {args.data_dir} does not exist")
    check_output_file(args.output, "--output")
    args.device = check_device(args.device, "--device")
    _check_model(args)
    local_config = _local_model_config(args.model)
    if local_config is not None:  # a Hub id's config is checked when it loads, before any scoring
        check_model_protocol(local_config, args)


def _load_model_and_tokenizer(args):
    """The model (on ``args.device``, a training checkpoint rebuilt from its run) and its tokenizer.

    Raises ValueError when weights the model needs are missing from the folder (they would be random) or
    the model cannot be loaded (an unknown Hub id: one line, not a traceback).
    """
    from transformers import AutoModelForCausalLM

    import ssmhub  # noqa: F401  (registers ssmhub's families with the Auto classes)

    from ..tokenization import resolve_tokenizer

    try:
        tokenizer = resolve_tokenizer(args.tokenizer)
        if is_training_checkpoint(args.model):
            model, info = load_checkpoint_model(args.model, tokenizer), {"missing_keys": []}
        else:
            model, info = AutoModelForCausalLM.from_pretrained(args.model, output_loading_info=True)
    except OSError as err:
        raise ValueError(f"model {args.model} / tokenizer {args.tokenizer} could not be loaded: {err}") from None
    if info["missing_keys"]:
        missing = sorted(info["missing_keys"])
        raise ValueError(
            f"model {args.model} lacks weights a causal LM needs ({', '.join(missing[:3])}); they would be random"
        )
    check_model_protocol(model.config, args)  # a Hub model's first check; a local one's again
    if args.attention_window is not None:
        model.set_attention_window(args.attention_window)
    return model.to(args.device), tokenizer


def _fmt(value, pattern: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else pattern.format(value)


def _aligned(header: list[str], lines: list[list[str]]) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(header, *lines)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [header, *lines])


def _format_table(rows: list[dict]) -> str:
    header = ["dataset", "split", "documents", "tokens", "token ppl", "word ppl", "top-1", "top-5"]
    lines = [
        [
            r["dataset"],
            r["split"],
            str(r["num_documents"]),
            str(r["num_tokens"]),
            _fmt(r["token_perplexity"], "{:.3f}"),
            _fmt(r["word_perplexity"], "{:.3f}"),
            _fmt(r["top1_accuracy"], "{:.2%}"),
            _fmt(r["top5_accuracy"], "{:.2%}"),
        ]
        for r in rows
    ]
    return _aligned(header, lines)


def _format_positions(buckets: list[dict]) -> str:
    """The table by position in the document (either protocol)."""
    header = ["position in document", "documents", "tokens", "token ppl", "top-1", "top-5"]
    lines = [
        [
            b["positions"],
            str(b["num_documents"]),
            str(b["num_tokens"]),
            _fmt(b["token_perplexity"], "{:.3f}"),
            _fmt(b["top1_accuracy"], "{:.2%}"),
            _fmt(b["top5_accuracy"], "{:.2%}"),
        ]
        for b in buckets
    ]
    return _aligned(header, lines)


def _protocol_line(args) -> str:
    """One line naming the protocol that ran, and its windows."""
    if args.stateful:
        window = "" if args.attention_window is None else f", attention window {args.attention_window}"
        return (
            f"scoring: stateful (each document start to end in windows of {args.max_length} tokens, "
            f"recurrent state carried: every token sees its whole document before it{window})"
        )
    return f"scoring: sliding_window (windows of {args.max_length} tokens, stride {args.stride})"


def _json_safe(value):
    """NaN -> None, in nested dicts and lists too, so the file is strict JSON."""
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_safe(item) for item in value]
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
    if args.stateful:
        result: PerplexityResult = evaluate_perplexity_stateful(
            model, documents, args.max_length, progress=args.progress
        )
    else:
        result = evaluate_perplexity(
            model,
            documents,
            args.max_length,
            args.stride,
            batch_size=args.batch_size,
            progress=args.progress,
            bucket_starts=POSITION_BUCKETS,
        )
    result.num_words = documents.num_words
    row = {"dataset": args.dataset, "split": args.split, **_json_safe(result.to_dict())}
    print(_protocol_line(args))
    print(_format_table([row]))
    print(_format_positions(row["by_position"]))
    payload = {
        "model": args.model,
        "tokenizer": args.tokenizer,
        "data_source": source,
        "scoring": "stateful" if args.stateful else "sliding_window",
        "protocol": "stream" if args.stream else "document",
        "max_length": args.max_length,
        "stride": args.stride,
        "attention_window": args.attention_window,
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
