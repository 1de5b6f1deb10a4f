#!/usr/bin/env python
"""Train or fine-tune any ssmhub family as a causal language model with transformers' ``Trainer``.

The shape of transformers' ``examples/pytorch/language-modeling/run_clm.py``: ``HfArgumentParser`` over
model, data and ``TrainingArguments`` flags. Data: WikiText or PG-19 from ``$SSMHUB_DATA_DIR`` (or the
Hub), or your own text files through ``datasets``. By default documents are concatenated and cut into
``--block_size`` blocks; ``--packing`` instead keeps documents apart (pieces of at most ``--block_size``
tokens) and batches them with ``DataCollatorWithFlattening``: every ssmhub model restarts its state at each
document, so each runs as if alone, with no padding. Evaluation reports token perplexity from summed NLL
and top-1/top-5 next-token accuracy (ssmhub's ``evaluate`` modules).

    python examples/language-modeling/run_clm.py --output_dir runs/clm --do_train --do_eval \\
        --max_train_samples 64 --max_eval_samples 16 --max_steps 10
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from itertools import chain

import datasets
import transformers
from transformers import (
    AutoModelForCausalLM,
    DataCollatorWithFlattening,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    default_data_collator,
)

from ssmhub.data import iter_pg19_books, load_wikitext, wikitext_articles
from ssmhub.metrics.trainer_hooks import CausalLMMetrics, preprocess_causal_lm_logits
from ssmhub.script_arguments import ModelArguments, build_model, load_script_tokenizer

CORPORA = ("wikitext-2", "wikitext-103", "pg19")


@dataclass
class DataArguments:
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


def load_documents(args: DataArguments, cache_dir: str | None) -> datasets.DatasetDict:
    """A ``DatasetDict`` with a ``text`` column (one document a row) and ``train`` / ``validation`` splits."""
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


def prepare(documents: datasets.DatasetDict, tokenizer, args: DataArguments) -> datasets.DatasetDict:
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


def main(argv: list[str] | None = None) -> dict:
    """Parse the flags (or ``argv``), train and/or evaluate, save the model; returns the metrics."""
    parser = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    transformers.set_seed(training_args.seed)
    tokenizer = load_script_tokenizer(model_args)
    data = prepare(load_documents(data_args, model_args.cache_dir), tokenizer, data_args)
    model = build_model(model_args, AutoModelForCausalLM, tokenizer)
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=data["train"] if training_args.do_train else None,
        eval_dataset=data.get("validation") if training_args.do_eval else None,
        processing_class=tokenizer,
        data_collator=DataCollatorWithFlattening() if data_args.packing else default_data_collator,
        compute_metrics=CausalLMMetrics() if training_args.do_eval else None,
        preprocess_logits_for_metrics=preprocess_causal_lm_logits if training_args.do_eval else None,
    )
    metrics = {}
    if training_args.do_train:
        metrics.update(trainer.train().metrics)
        trainer.save_model()
        trainer.save_metrics("train", metrics)
    if training_args.do_eval:
        eval_metrics = trainer.evaluate()
        trainer.save_metrics("eval", eval_metrics)
        metrics.update(eval_metrics)
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
