#!/usr/bin/env python
"""Train any ssmhub family's ``...ForSequenceClassification`` with ``Trainer`` on LRA ListOps or your data.

The shape of transformers' ``examples/pytorch/text-classification/run_classification.py``: ``HfArgumentParser``
over model, data and ``TrainingArguments`` flags, ``DataCollatorWithPadding`` and an ``evaluate`` metric.
ListOps is generated offline and seeded by :mod:`ssmhub.data.listops` (the ``--listops_*`` flags default
to small sizes; the LRA release's are 96000 / 2000 / 2000 expressions of 500-2,000 tokens, and its
tokenizer has 17 ids). ``--listops_subtrees`` trains ListOps-SubTrees (arXiv:2212.00768 §3.4) with
``...ForTokenClassification``: a value at every closing bracket. Your own data: ``--train_file`` and
``--validation_file`` (CSV or JSON) with ``--text_column`` and ``--label_column`` (integer labels).
``--max_train_minutes`` trains for a time budget instead of ``--max_steps`` (CPU time of the process by
default; ``--eval_every_minutes`` for a curve, ``--torch_num_threads`` to pin the threads).

Training protocol (DLR's on LRA, arXiv 2212.00768 §A.6 and Table 9: dropout, weight decay but none on the
recurrence, a cosine schedule after a linear warmup, the test metrics of the checkpoint best on validation):
an ssmhub model's optimizer uses ``model.optimizer_param_groups`` (no weight decay on recurrences; their own
learning rate with ``--config_overrides recurrence_learning_rate=...``), the model's dropout is a config field
(``dropout=0.2`` for DLR), and the rest are ``TrainingArguments`` and transformers' callbacks:
``--lr_scheduler_type cosine --warmup_steps``; ``--lr_over_budget`` anneals it over ``--max_train_minutes``
instead of ``--max_steps``; ``--load_best_model_at_end --metric_for_best_model accuracy`` with
``--save_strategy best`` (evaluations by ``--eval_strategy`` or ``--eval_every_minutes``) evaluates the best
checkpoint; ``--early_stopping_patience`` adds ``EarlyStoppingCallback`` (it needs an ``--eval_strategy``).

    python examples/text-classification/run_classification.py --output_dir runs/listops --do_train --do_eval \\
        --listops_min_length 20 --listops_max_length 100 --max_steps 20
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import datasets
import transformers
from transformers import (
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
    EarlyStoppingCallback,
    HfArgumentParser,
    TrainingArguments,
)

from ssmhub.data.listops import NUM_CLASSES, ListOpsSpec
from ssmhub.data.listops_hf import listops_dataset_dict, listops_tokenizer
from ssmhub.metrics.trainer_hooks import ClassificationMetrics
from ssmhub.script_arguments import BudgetArguments, ModelArguments, build_model, load_script_tokenizer
from ssmhub.training.process_group import end_process_group
from ssmhub.training.recurrent_trainer import RecurrentTrainer
from ssmhub.training.time_budget import TimeBudgetCallback


@dataclass
class DataArguments:
    """ListOps (default) or your CSV / JSON files, and how texts become model inputs."""

    train_file: str | None = field(default=None, metadata={"help": "CSV or JSON training file (else: ListOps)."})
    validation_file: str | None = field(default=None, metadata={"help": "CSV or JSON file to evaluate on."})
    text_column: str = field(default="text", metadata={"help": "Column of the texts in your files."})
    label_column: str = field(default="label", metadata={"help": "Column of the integer labels in your files."})
    max_seq_length: int = field(default=2048, metadata={"help": "Longer inputs are truncated."})
    metric: str = field(default="listops_accuracy", metadata={"help": "An ssmhub metric name or evaluate.load path."})
    listops_subtrees: bool = field(default=False, metadata={"help": "ListOps-SubTrees: a tag per closing bracket."})
    listops_num_train: int = field(default=256, metadata={"help": "ListOps training expressions (LRA: 96000)."})
    listops_num_validation: int = field(default=64, metadata={"help": "ListOps validation expressions (LRA: 2000)."})
    listops_num_test: int = field(default=64, metadata={"help": "ListOps test expressions (LRA: 2000)."})
    listops_max_depth: int = field(default=10, metadata={"help": "ListOps tree depth limit (LRA: 10)."})
    listops_max_args: int = field(default=10, metadata={"help": "ListOps arguments per operator (LRA: 10)."})
    listops_min_length: int = field(default=500, metadata={"help": "ListOps length, exclusive (LRA: 500)."})
    listops_max_length: int = field(default=2000, metadata={"help": "ListOps length, exclusive (LRA: 2000)."})
    listops_seed: int = field(default=0, metadata={"help": "Seed of the ListOps generator."})

    def listops_spec(self) -> ListOpsSpec:
        """The :class:`ListOpsSpec` of the ``--listops_*`` flags."""
        return ListOpsSpec(
            max_depth=self.listops_max_depth,
            max_args=self.listops_max_args,
            min_length=self.listops_min_length,
            max_length=self.listops_max_length,
            num_train=self.listops_num_train,
            num_validation=self.listops_num_validation,
            num_test=self.listops_num_test,
            subtrees=self.listops_subtrees,
        )


@dataclass
class ProtocolArguments:
    """Early stopping and a schedule over the time budget (the rest of the protocol is in TrainingArguments)."""

    early_stopping_patience: int | None = field(
        default=None, metadata={"help": "Stop after this many evaluations without improving (EarlyStoppingCallback)."}
    )
    early_stopping_threshold: float = field(
        default=0.0, metadata={"help": "The least change of --metric_for_best_model that counts as improving."}
    )
    lr_over_budget: bool = field(
        default=False, metadata={"help": "Anneal the schedule to zero over --max_train_minutes (cosine)."}
    )

    def check(self, training_args: TrainingArguments, budget_args: BudgetArguments) -> None:
        """Raise ValueError naming the flag of a protocol option that cannot work with the other flags."""
        if self.early_stopping_patience is not None:
            if self.early_stopping_patience < 1:
                raise ValueError(f"--early_stopping_patience must be >= 1; got {self.early_stopping_patience}")
            if training_args.eval_strategy == "no" or training_args.metric_for_best_model is None:
                raise ValueError(
                    "--early_stopping_patience needs --eval_strategy steps|epoch and --metric_for_best_model "
                    f"(got {training_args.eval_strategy!r}, {training_args.metric_for_best_model!r})"
                )
        if self.lr_over_budget and budget_args.max_train_minutes is None:
            raise ValueError("--lr_over_budget needs --max_train_minutes (the budget it anneals over)")

    def callbacks(self) -> list:
        if self.early_stopping_patience is None:
            return []
        return [EarlyStoppingCallback(self.early_stopping_patience, self.early_stopping_threshold)]


def load_data(args: DataArguments, cache_dir: str | None) -> tuple[datasets.DatasetDict, int]:
    """The splits (columns ``text`` and ``label``, or ``labels`` per token) and the number of classes."""
    if args.train_file is None:
        data = listops_dataset_dict(args.listops_spec(), seed=args.listops_seed)
        if args.listops_subtrees:
            data = data.remove_columns("label").rename_column("subtree_labels", "labels")
        return data, NUM_CLASSES
    files = {"train": args.train_file, **({"validation": args.validation_file} if args.validation_file else {})}
    data = datasets.load_dataset(args.train_file.rsplit(".", 1)[-1], data_files=files, cache_dir=cache_dir)
    for column in (args.text_column, args.label_column):
        if column not in data["train"].column_names:
            raise ValueError(
                f"--text_column / --label_column: {column!r} is not a column of {data['train'].column_names}"
            )
    data = data.rename_columns({args.text_column: "text", args.label_column: "label"})
    return data, max(max(split["label"]) for split in data.values()) + 1


def tokenize(data: datasets.DatasetDict, tokenizer, args: DataArguments) -> datasets.DatasetDict:
    """Token ids of every text, truncated to ``--max_seq_length`` (per-token labels cut alike)."""

    def encode(batch):
        encoded = tokenizer(batch["text"], truncation=True, max_length=args.max_seq_length)
        if "labels" in batch:
            encoded["labels"] = [labels[: len(ids)] for labels, ids in zip(batch["labels"], encoded["input_ids"])]
        return encoded

    return data.map(encode, batched=True, remove_columns=["text"], desc="tokenizing")


def main(argv: list[str] | None = None) -> dict:
    """Parse the flags (or ``argv``), train and/or evaluate (validation, then the test split when there is
    one); returns the metrics."""
    parser = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments, BudgetArguments, ProtocolArguments))
    model_args, data_args, training_args, budget_args, protocol_args = parser.parse_args_into_dataclasses(args=argv)
    protocol_args.check(training_args, budget_args)
    callbacks = budget_args.callbacks()
    budget = next((callback for callback in callbacks if isinstance(callback, TimeBudgetCallback)), None)
    transformers.set_seed(training_args.seed)
    data, num_labels = load_data(data_args, model_args.cache_dir)
    listops = data_args.train_file is None
    tokenizer = (
        listops_tokenizer() if listops and model_args.tokenizer_name is None else load_script_tokenizer(model_args)
    )
    data = tokenize(data, tokenizer, data_args)
    per_token = data_args.listops_subtrees
    auto_class = AutoModelForTokenClassification if per_token else AutoModelForSequenceClassification
    model = build_model(model_args, auto_class, tokenizer, num_labels=num_labels)
    collator = (DataCollatorForTokenClassification if per_token else DataCollatorWithPadding)(tokenizer)
    trainer = RecurrentTrainer(
        model=model,
        args=training_args,
        train_dataset=data["train"] if training_args.do_train else None,
        eval_dataset=data.get("validation") if training_args.do_eval else None,
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=ClassificationMetrics(data_args.metric, "subtrees" if per_token else None),
        callbacks=callbacks + protocol_args.callbacks(),
        budget=budget if protocol_args.lr_over_budget else None,
    )
    metrics = {}
    if training_args.do_train:
        metrics.update(trainer.train().metrics)
        trainer.save_model()
        trainer.save_metrics("train", metrics)
        trainer.save_state()  # trainer_state.json: the log history, eval curves included
    if training_args.do_eval:
        for split, prefix in (("validation", "eval"), ("test", "test")):
            if split in data:
                split_metrics = trainer.evaluate(data[split], metric_key_prefix=prefix)
                trainer.save_metrics(prefix, split_metrics)
                metrics.update(split_metrics)
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
    end_process_group()  # before exit: a launched process must not leave it to interpreter shutdown
