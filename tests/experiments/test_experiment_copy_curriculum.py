"""experiments/copy_curriculum.py: the curriculum moves through its stages as its rule says and saves a model that
``ssmhub-train --model_name_or_path`` can load; bad --stages are refused by name; and (slow) a tiny hybrid learns a
two-stage curriculum (an alphabet of 2 ids, then of 4)."""

import os
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

import ssmhub

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments")
)
import copy_curriculum


@pytest.fixture
def tiny_like(tmp_path):
    config = ssmhub.H3Config(
        vocab_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, attention_layers=[1],
        intermediate_size=64, max_kernel_length=16,
    )  # fmt: skip
    ssmhub.H3ForCausalLM(config).save_pretrained(tmp_path / "like")
    return tmp_path / "like"


def _train(tiny_like, out, *options):
    threads = torch.get_num_threads()
    try:
        argv = ["--like", str(tiny_like), "--output_dir", str(out), "--stages", "2:6,4:6", "--min-distance", "4"]
        argv += ["--batch-tokens", "192", "--learning-rate", "1e-2", *options]
        return copy_curriculum.train_curriculum(copy_curriculum.parse_args(argv), log=lambda line: None)
    finally:
        torch.set_num_threads(threads)


def _assert_saved(model, out):
    saved = AutoModelForCausalLM.from_pretrained(out).state_dict()
    for name, weight in model.state_dict().items():  # the saved weights are a copy of the trained ones: exact
        torch.testing.assert_close(saved[name], weight, rtol=0, atol=0)


def test_the_stages_follow_the_rule_and_the_model_is_saved(tiny_like, tmp_path):
    """A threshold of 0 is met as soon as ``--patience`` steps are in: stage 1 takes steps 1-2, stage 2 the rest of
    the budget; each record reports its stage's steps and last top-1, and the trained model is saved."""
    model, records = _train(tiny_like, tmp_path / "out", "--steps", "5", "--patience", "2", "--threshold", "0")
    assert [(r["alphabet"], r["max distance"], r["from step"], r["to step"]) for r in records] == [
        (2, 6, 1, 2),
        (4, 6, 3, 5),
    ]
    assert all(0 <= r["repeat top-1"] <= 1 and r["seconds"] > 0 for r in records)
    _assert_saved(model, tmp_path / "out")


@pytest.mark.slow  # 1000 steps; whether and when a tiny model learns depends on every rounding along the way
def test_a_two_stage_curriculum_is_learned_and_saved(tiny_like, tmp_path):
    model, records = _train(tiny_like, tmp_path / "out", "--steps", "1000", "--patience", "10")
    # the alphabet of 2 was learned by the benchmark's own rule (top-1 ≥ 0.9 averaged over 10 steps) ...
    assert [r["alphabet"] for r in records] == [2, 4] and records[1]["from step"] == records[0]["to step"] + 1
    # ... and the alphabet of 4 is copied by the end: top-1 on 64 fresh sequences (a single training batch's, the
    # record's, swings by ±0.15 from step to step)
    x, n = copy_curriculum.repeated_random_tokens(4, 6, 6, 64 * 12, torch.Generator().manual_seed(7))
    with torch.no_grad():
        predicted = model.eval()(x).logits[:, n:-1].argmax(-1)
    assert (predicted == x[:, n + 1 :]).float().mean().item() >= 0.8
    _assert_saved(model, tmp_path / "out")


@pytest.mark.parametrize(
    ("stages", "message"),
    [("64", "'64' is not alphabet:max_distance"), ("1:16", "needs 2 <= alphabet <= 6"), ("all:8", "distance >= 16")],
)
def test_bad_stages_are_refused_by_name(stages, message):
    with pytest.raises(ValueError, match=f"--stages: .*{message}"):
        copy_curriculum.parse_stages(stages, vocab_size=8)
