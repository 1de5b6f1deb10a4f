"""examples/language-modeling/run_clm.py trains a new model of any family on text files, with blocks or with
DataCollatorWithFlattening packing, and reports summed-NLL perplexity through ssmhub's evaluate modules."""

from __future__ import annotations

import math

import pytest
import torch
from comparisons import MODEL_REL
from example_helpers import load_example
from transformers import AutoModelForCausalLM, AutoTokenizer

COMMON = ["--do_train", "--do_eval", "--max_steps", "2", "--per_device_train_batch_size", "4", "--report_to", "none"]


def _run(tmp_path, tiny_corpus, *extra):
    run_clm = load_example("language-modeling/run_clm.py")
    argv = ["--output_dir", str(tmp_path / "out"), "--train_file", str(tiny_corpus["train"]),
            "--validation_file", str(tiny_corpus["validation"]), "--tokenizer_name", str(tiny_corpus["tokenizer"]),
            "--block_size", "16", "--cache_dir", str(tmp_path / "cache"), *COMMON, *extra]  # fmt: skip
    return run_clm.main(argv)


@pytest.mark.parametrize(
    ("model_type", "overrides"),
    [("dlr", "hidden_size=16,num_hidden_layers=1,state_size=4"), ("h3", "hidden_size=16,num_hidden_layers=1")],
)
def test_trains_a_new_model_and_reports_perplexity_from_summed_nll(tmp_path, tiny_corpus, model_type, overrides):
    metrics = _run(tmp_path, tiny_corpus, "--model_type", model_type, "--config_overrides", overrides)
    assert metrics["eval_token_perplexity"] == pytest.approx(math.exp(metrics["eval_nll_per_token"]))
    assert metrics["eval_nll_per_token"] == pytest.approx(metrics["eval_loss"], rel=1e-4)  # equal-length blocks
    assert 0 <= metrics["eval_top_1_accuracy"] <= metrics["eval_top_5_accuracy"] <= 1
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_packing_scores_every_document_apart(tmp_path, tiny_corpus):
    """Packed rows (and evaluation batches of unequal lengths) give the summed NLL of each document alone."""
    metrics = _run(
        tmp_path, tiny_corpus, "--packing", "--per_device_eval_batch_size", "3",
        "--config_overrides", "hidden_size=16,num_hidden_layers=1",
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(tiny_corpus["tokenizer"])
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    lines = tiny_corpus["validation"].read_text(encoding="utf-8").splitlines()
    ids = [tokenizer(line)["input_ids"] for line in lines]
    pieces = [torch.tensor([doc[start : start + 16]]) for doc in ids for start in range(0, len(doc), 16)]
    with torch.no_grad():
        alone = sum(model(piece, labels=piece).loss.item() * (piece.shape[1] - 1) for piece in pieces)
    assert metrics["eval_num_tokens"] == sum(piece.shape[1] - 1 for piece in pieces)
    # packed rows and each piece alone: the model computed two ways (MODEL_REL)
    assert metrics["eval_nll_per_token"] * metrics["eval_num_tokens"] == pytest.approx(alone, rel=MODEL_REL)
    assert math.isfinite(metrics["eval_token_perplexity"])


def test_bad_dataset_name_is_refused_by_flag(tmp_path):
    run_clm = load_example("language-modeling/run_clm.py")
    with pytest.raises(ValueError, match="--dataset_name"):
        run_clm.main(["--output_dir", str(tmp_path), "--dataset_name", "wikitext-3"])
