"""examples/text-classification/run_classification.py: ListOps (and ListOps-SubTrees) generated offline, or a
user's CSV, through Trainer, DataCollatorWithPadding and ssmhub's listops_accuracy evaluate module."""

from __future__ import annotations

import json

import pytest
import torch
from example_helpers import load_example
from transformers import AutoModelForSequenceClassification

from ssmhub.data.listops import ListOpsSpec, listops_splits
from ssmhub.data.listops_hf import listops_tokenizer

SMALL = ["--listops_min_length", "10", "--listops_max_length", "40", "--listops_num_train", "16",
         "--listops_num_validation", "8", "--listops_num_test", "8", "--max_steps", "2", "--report_to", "none",
         "--per_device_train_batch_size", "8", "--config_overrides", "hidden_size=16,num_hidden_layers=1"]  # fmt: skip


def _run(tmp_path, *extra):
    return load_example("text-classification/run_classification.py").main(
        ["--output_dir", str(tmp_path / "out"), "--do_train", "--do_eval", *SMALL, *extra]
    )


def test_listops_accuracy_is_the_saved_models_accuracy_on_the_test_split(tmp_path):
    metrics = _run(tmp_path)
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out").eval()
    assert model.config.num_labels == 10
    spec = ListOpsSpec(min_length=10, max_length=40, num_train=16, num_validation=8, num_test=8)
    test = listops_splits(spec, seed=0)["test"]
    tokenizer = listops_tokenizer()
    with torch.no_grad():
        predicted = [model(**tokenizer(row["text"], return_tensors="pt")).logits.argmax(-1).item() for row in test]
    assert metrics["test_accuracy"] == pytest.approx(sum(p == row["label"] for p, row in zip(predicted, test)) / 8)


def test_listops_subtrees_trains_a_token_classifier(tmp_path):
    metrics = _run(tmp_path, "--listops_subtrees", "--model_type", "h3")
    assert 0 <= metrics["eval_accuracy"] <= 1 and "test_accuracy" in metrics
    assert "ForTokenClassification" in (tmp_path / "out" / "config.json").read_text()


def test_users_csv_with_its_own_columns(tmp_path, tiny_corpus):
    rows = ["sentence,sentiment", *(f"{'the cat sat' if i % 2 else 'the dog ran far'},{i % 2}" for i in range(12))]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    metrics = _run(
        tmp_path, "--train_file", str(tmp_path / "train.csv"), "--validation_file", str(tmp_path / "train.csv"),
        "--text_column", "sentence", "--label_column", "sentiment", "--tokenizer_name", str(tiny_corpus["tokenizer"]),
        "--cache_dir", str(tmp_path / "cache"),
    )  # fmt: skip
    assert 0 <= metrics["eval_accuracy"] <= 1


def test_missing_column_is_refused_by_flag(tmp_path):
    (tmp_path / "train.csv").write_text("text,y\nthe cat,1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="--label_column"):
        _run(tmp_path, "--train_file", str(tmp_path / "train.csv"), "--cache_dir", str(tmp_path / "cache"))


def test_a_time_budget_replaces_max_steps_and_logs_its_curve(tmp_path):
    """--max_train_minutes stops long before --max_steps; --eval_every_minutes leaves evaluations with their
    budget seconds in trainer_state.json (benchmarks/listops.py reads them as its curves)."""
    _run(tmp_path, "--max_steps", "100000", "--max_train_minutes", "0.01", "--eval_every_minutes", "0.004",
         "--torch_num_threads", "1")  # fmt: skip
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    curve = [entry["train_budget_seconds"] for entry in state["log_history"] if "eval_accuracy" in entry]
    assert len(curve) >= 2 and curve == sorted(curve) and curve[-1] >= 0.6
    assert state["global_step"] < 100000


def test_eval_every_minutes_needs_a_budget(tmp_path):
    with pytest.raises(ValueError, match="--eval_every_minutes"):
        _run(tmp_path, "--eval_every_minutes", "1")


def test_the_papers_protocol_evaluates_the_checkpoint_best_on_validation(tmp_path):
    """arXiv 2212.00768 §A.6: a cosine schedule annealed over the time budget, the test metrics of the checkpoint
    with the highest validation accuracy (``--save_strategy best --load_best_model_at_end``)."""
    metrics = _run(tmp_path, "--max_steps", "100000", "--max_train_minutes", "0.01", "--eval_every_minutes", "0.002",
                   "--torch_num_threads", "1", "--learning_rate", "0.01", "--lr_scheduler_type", "cosine",
                   "--warmup_steps", "1", "--lr_over_budget", "--save_strategy", "best", "--load_best_model_at_end",
                   "--metric_for_best_model", "accuracy", "--logging_steps", "1",
                   "--config_overrides", "hidden_size=16,num_hidden_layers=1,dropout=0.2")  # fmt: skip
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    evaluations = [entry["eval_accuracy"] for entry in state["log_history"] if "train_budget_seconds" in entry]
    assert len(evaluations) >= 2 and state["best_metric"] == max(evaluations)
    assert metrics["eval_accuracy"] == state["best_metric"]  # the model evaluated at the end is the best one
    rates = [entry["learning_rate"] for entry in state["log_history"] if "learning_rate" in entry]
    assert max(rates) <= 0.01 and rates[-1] < 0.5 * max(rates)  # annealed as the budget runs out


def test_early_stopping_ends_training_when_validation_stops_improving(tmp_path):
    _run(tmp_path, "--max_steps", "60", "--eval_strategy", "steps", "--eval_steps", "1", "--save_strategy", "steps",
         "--save_steps", "1", "--save_total_limit", "1", "--load_best_model_at_end", "--metric_for_best_model",
         "accuracy", "--early_stopping_patience", "2", "--early_stopping_threshold", "1.0")  # fmt: skip
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    assert state["global_step"] == 3  # no change of accuracy exceeds 1.0: best at step 1, then 2 misses


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--early_stopping_patience", "2"], "--early_stopping_patience needs --eval_strategy"),
        (["--early_stopping_patience", "0", "--eval_strategy", "steps"], "--early_stopping_patience must be >= 1"),
        (["--lr_over_budget"], "--lr_over_budget needs --max_train_minutes"),
    ],
)
def test_protocol_flags_that_cannot_work_are_refused_by_name(tmp_path, flags, named):
    with pytest.raises(ValueError, match=named):
        _run(tmp_path, *flags)
