"""Text to causal-LM training rows for the scripts in ``examples/`` (run_clm, PEFT), written once.

:class:`CausalLMDataArguments` (for ``transformers.HfArgumentParser``) names the text: WikiText or PG-19
from ``$SSMHUB_DATA_DIR`` (or the Hub), or the user's text files through ``datasets``.
:func:`prepare_causal_lm_data` tokenizes it and either concatenates the documents into ``--block_size``
blocks (transformers' ``run_clm.py`` way) or, with ``--packing``, keeps each document apart in pieces of
at most ``--block_size`` tokens for ``DataCollatorWithFlattening``, under which every ssmhub model restarts
its state at each document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

from .pg19 import iter_pg19_books
from .wikitext import load_wikitext, wikitext_articles

__all__ = ["CORPORA", "CausalLMDataArguments", "load_documents", "prepare_causal_lm_data", "to_blocks", "to_pieces"]

CORPORA = ("wikitext-2", "wikitext-103", "pg19")


@dataclass
class CausalLMDataArguments:
    """Which text to train and evaluate on, and how it becomes model inputs."""

    dataset_name: str = field(default="wikitext-2", metadata={"help": f"One of {CORPORA}; unused with --train_file."})
    data_dir: str | None = field(
        default=None, metadata={"help": "Data folder; default $SSMHUB_DATA_DIR, else the Hub."}
    )
    train_file: str | None = field(default=None, metadata={"help": "A .txt file of your own (one document a line)."})
    validation_file: str | None = field(default=None, metadata={"help": "A .txt file to evaluate on."})
    max_books: int = field(default=2, metadata={"help": "PG-19 books read per split."})
    block_size: int = field(default=128, metadata={"help": "Tokens per block (the longest piece with --packing)."})
    packing: bool = field(
        default=False, metadata={"help": "Documents kept apart, batched by DataCollatorWithFlattening."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep this many training blocks."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep this many evaluation blocks."})

    def __post_init__(self):
        if self.train_file is None and self.dataset_name not in CORPORA:
            raise ValueError(f"--dataset_name must be one of {CORPORA}; got {self.dataset_name!r}")
        if self.block_size < 2:
            raise ValueError(f"--block_size must be at least 2; got {self.block_size}")


def load_documents(args: CausalLMDataArguments, cache_dir: str | None):
    """A ``DatasetDict`` with a ``text`` column (one document a row) and ``train`` / ``validation`` splits."""
    import datasets  # imported here: ssmhub runs without datasets

    if args.train_file is not None:
        files = {"train": args.train_file, **({"validation": args.validation_file} if args.validation_file else {})}
        return datasets.load_dataset("text", data_files=files, cache_dir=cache_dir)
    splits = {}
    for split in ("train", "validation"):
        if args.dataset_name == "pg19":
            texts = [book.text for book in iter_pg19_books(split, args.data_dir, max_books=args.max_books)]
        else:
            texts = wikitext_articles(load_wikitext(args.dataset_name, split, args.data_dir))
        splits[split] = datasets.Dataset.from_dict({"text": texts})
    return datasets.DatasetDict(splits)


def to_blocks(batch: dict, block_size: int) -> dict:
    """Concatenate a batch of tokenized documents and cut it into full blocks (the remainder is dropped)."""
    stream = list(chain.from_iterable(batch["input_ids"]))
    cut = len(stream) - len(stream) % block_size
    blocks = [stream[i : i + block_size] for i in range(0, cut, block_size)]
    return {"input_ids": blocks, "labels": [list(block) for block in blocks]}


def to_pieces(batch: dict, block_size: int) -> dict:
    """Each document cut into pieces of at most ``block_size`` tokens, each piece its own document."""
    pieces = [ids[i : i + block_size] for ids in batch["input_ids"] for i in range(0, len(ids), block_size)]
    return {"input_ids": [piece for piece in pieces if len(piece) >= 2]}


def prepare_causal_lm_data(documents, tokenizer, args: CausalLMDataArguments):
    """Tokenize the documents, then make blocks (or pieces with ``--packing``), capped by the max_* flags."""
    tokenized = documents.map(
        lambda batch: {"input_ids": tokenizer(batch["text"])["input_ids"]},
        batched=True,
        remove_columns=documents["train"].column_names,
        desc="tokenizing",
    )
    cut = to_pieces if args.packing else to_blocks
    prepared = tokenized.map(cut, batched=True, fn_kwargs={"block_size": args.block_size}, desc="blocks")
    limits = {"train": args.max_train_samples, "validation": args.max_eval_samples}
    for split, limit in limits.items():
        if split in prepared and limit is not None:
            prepared[split] = prepared[split].select(range(min(limit, len(prepared[split]))))
    return prepared
