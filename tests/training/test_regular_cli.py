"""ssmhub-regular: the metrics against hand-computed values, a tiny run of every kind, bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch
from training_helpers import TRAINING_REL, same_run_state

from ssmhub.training.regular import (
    LENGTH_BUCKETS,
    RegularRunConfig,
    bucket_accuracy,
    last_token_accuracy,
    length_buckets,
    main,
    run_regular,
)


def test_last_token_accuracy_uses_the_last_supervised_position():
    labels = torch.tensor([[1, -100, 2, -100, 3], [0, 1, 1, 0, 4]])
    predictions = torch.tensor([[1, 9, 2, 9, 3], [0, 1, 1, 0, 0]])
    assert last_token_accuracy(predictions, labels) == 0.5
    labels = torch.tensor([[1, -100, 2, -100, 3, -100]])  # trailing unsupervised position
    assert last_token_accuracy(torch.tensor([[0, 0, 0, 0, 3, 0]]), labels) == 1.0


def test_bucket_accuracy_groups_positions_by_prefix_length():
    labels = torch.zeros(2, 60, dtype=torch.long)
    predictions = torch.zeros(2, 60, dtype=torch.long)
    predictions[0, 45:] = 1  # wrong on prefixes of length 46..60 in one of two rows
    buckets = bucket_accuracy(predictions, labels)
    assert list(buckets) == ["1-40", "41-60"]
    assert buckets["1-40"] == 1.0
    assert buckets["41-60"] == pytest.approx((2 * 20 - 15) / 40)


@pytest.mark.parametrize("length", [1, 39, 40, 41, 100, 101, 499, 500, 501, 1000, 1001, 2345])
def test_length_buckets_cover_every_prefix_length_once(length):
    buckets = length_buckets(length)
    covered = [n for low, high in buckets for n in range(low, high + 1)]
    assert covered == list(range(1, length + 1))  # in order, no gap, no overlap, up to the test length
    inner_ends = [high for _, high in buckets[:-1]]
    assert inner_ends == [40, *range(100, 100 * len(inner_ends), 100)][: len(inner_ends)]


def test_length_buckets_past_the_paper_test_length():
    assert LENGTH_BUCKETS == ((1, 40), (41, 100), (101, 200), (201, 300), (301, 400), (401, 500))
    assert length_buckets(500) == list(LENGTH_BUCKETS) and length_buckets(499)[-1] == (401, 499)
    assert length_buckets(1000)[5:] == [(401, 500), (501, 600), (601, 700), (701, 800), (801, 900), (901, 1000)]
    with pytest.raises(ValueError, match="length must be a positive integer"):
        length_buckets(0)


def test_bucket_accuracy_reaches_the_end_of_a_long_test_sequence():
    labels = torch.zeros(2, 1000, dtype=torch.long)
    predictions = torch.zeros(2, 1000, dtype=torch.long)
    predictions[:, 950:] = 1  # wrong on prefixes of length 951..1000 only
    buckets = bucket_accuracy(predictions, labels)
    assert list(buckets)[-3:] == ["701-800", "801-900", "901-1000"]
    assert buckets["901-1000"] == 0.5 and all(v == 1.0 for k, v in buckets.items() if k != "901-1000")


def tiny(**overrides) -> RegularRunConfig:
    options = {
        "task": "sum",
        "model_type": "dlr",
        "model_config": {"hidden_size": 16, "state_size": 4, "classifier_intermediate_size": 8},
        "steps": 4,
        "batch_size": 8,
        "eval_steps": 2,
        "eval_batch_size": 16,
        "test_sequences": 32,
        "test_length": 60,
        "learning_rate": 1e-2,
    }
    return RegularRunConfig(**{**options, **overrides})


def test_a_run_is_deterministic_and_reports_every_field():
    first, again = run_regular(tiny(), log=lambda _: None), run_regular(tiny(), log=lambda _: None)
    assert first.steps == 4 and first.best_step in (2, 4) and first.test_length == 60 and first.train_length == 40
    assert 0 <= first.test_accuracy <= 1 and list(first.bucket_accuracy) == ["1-40", "41-60"]
    # accuracies count argmax predictions (greedy tokens): exact; the loss of two runs to float32 round-off
    assert first.test_accuracy == again.test_accuracy
    assert math.isclose(first.final_train_loss, again.final_train_loss, rel_tol=TRAINING_REL)
    assert first.config["weight_decay"] == 0.0  # the authors' value for Sum


def test_early_stop_at_the_target_accuracy():
    result = run_regular(tiny(target_accuracy=0.0), log=lambda _: None)
    assert result.steps == 2 and result.best_step == 2


def test_cli_writes_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    args = ["--task", "mod_arith", "--model_type", "dlr", "--steps", "2", "--eval_steps", "1", "--batch_size", "4"]
    args += ["--test_sequences", "8", "--test_length", "41", "--model_config", '{"hidden_size": 8, "state_size": 2}']
    assert main([*args, "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["task"] == "mod_arith" and result["train_length"] == 39 and result["test_length"] == 41
    assert "dlr on mod_arith: test accuracy at length 41" in capsys.readouterr().out


def test_cli_reports_prefix_buckets_up_to_the_test_length(tmp_path, capsys):
    out = tmp_path / "r.json"
    args = ["--task", "sum", "--model_type", "dlr", "--steps", "1", "--eval_steps", "1", "--batch_size", "2"]
    args += ["--eval_batch_size", "2", "--test_sequences", "2", "--test_length", "1000"]
    args += ["--model_config", '{"hidden_size": 8, "state_size": 2}', "--output", str(out)]
    assert main(args) == 0
    assert list(json.loads(out.read_text())["bucket_accuracy"])[-2:] == ["801-900", "901-1000"]
    assert "801-900: " in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--task", "mod_arith", "--train_length", "40"], "length"),
        (["--steps", "0"], "steps must be a positive integer"),
        (["--model_type", "no-such-family"], "--model_type 'no-such-family' is not a registered model type"),
        (["--model_type", "mamba"], "--model_type 'mamba' has no AutoModelForTokenClassification model"),
        (["--model_config", '{"hidden_size": "abc"}'], "--model_config does not fit the 'bdlrnn' config"),
        (["--model_config", '{"num_labels": 3}'], "--model_config key 'num_labels' is set by --task"),
        (["--model_config", "[1]"], "argument --model_config: expected a JSON object"),
    ],
)
def test_bad_input_is_one_clear_error(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--test_sequences", "4"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("ssmhub-regular: error:") and message in err and err.count("\n") == 1


def test_a_resumed_run_trains_like_an_uninterrupted_one(tmp_path):
    whole, pieces = tmp_path / "whole.pt", tmp_path / "pieces.pt"
    uninterrupted = run_regular(tiny(steps=6, checkpoint=str(whole)), log=lambda _: None)
    run_regular(tiny(steps=4, checkpoint=str(pieces)), log=lambda _: None)  # a budget of 4 steps, then raised to 6
    lines = []
    resumed = run_regular(tiny(steps=6, checkpoint=str(pieces)), log=lines.append)
    assert lines[0] == f"resuming from {pieces} after step 4" and len(lines) == 2  # only step 6 evaluated again
    # steps and accuracies (counts of argmax predictions, as greedy tokens) exactly; the loss to float32 round-off
    fields = ("steps", "best_step", "best_eval_accuracy", "test_accuracy", "bucket_accuracy")
    for field_name in fields:
        assert getattr(resumed, field_name) == getattr(uninterrupted, field_name), field_name
    assert math.isclose(resumed.final_train_loss, uninterrupted.final_train_loss, rel_tol=TRAINING_REL)
    a, b = torch.load(whole, weights_only=True), torch.load(pieces, weights_only=True)
    assert a["progress"]["step"] == b["progress"]["step"] == 6
    same_run_state(b, a)  # weights and moments to float32 round-off, the data generator's state exactly
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pieces.pt", "whole.pt"]  # no temporary files left


def test_a_checkpoint_written_before_the_shared_online_loop_resumes(tmp_path):
    """Its progress record has no ``train_s`` (ssmhub.training.online counts it now): it resumes as before."""
    whole, pieces = tmp_path / "whole.pt", tmp_path / "pieces.pt"
    uninterrupted = run_regular(tiny(steps=6, checkpoint=str(whole)), log=lambda _: None)
    run_regular(tiny(steps=4, checkpoint=str(pieces)), log=lambda _: None)
    old = torch.load(pieces, weights_only=True)
    del old["progress"]["train_s"]
    torch.save(old, pieces)
    resumed = run_regular(tiny(steps=6, checkpoint=str(pieces)), log=lambda _: None)
    assert (resumed.steps, resumed.test_accuracy) == (uninterrupted.steps, uninterrupted.test_accuracy)
    same_run_state(torch.load(pieces, weights_only=True), torch.load(whole, weights_only=True))


def test_a_finished_checkpoint_is_evaluated_without_more_training(tmp_path):
    path = str(tmp_path / "run.pt")
    first = run_regular(tiny(target_accuracy=0.0, checkpoint=path), log=lambda _: None)
    lines = []
    again = run_regular(tiny(target_accuracy=0.0, checkpoint=path, steps=50), log=lines.append)
    assert lines == [f"resuming from {path} after step 2"]
    assert again.steps == 2
    # the loss is the checkpoint's record (a copy) and the accuracy the same weights' argmax on the same test set
    assert (again.test_accuracy, again.final_train_loss) == (first.test_accuracy, first.final_train_loss)


def test_a_checkpoint_of_other_settings_is_refused_by_name(tmp_path):
    path = str(tmp_path / "run.pt")
    run_regular(tiny(steps=2, checkpoint=path), log=lambda _: None)
    with pytest.raises(ValueError, match=r"seed=0; this run has seed=1"):
        run_regular(tiny(steps=4, seed=1, checkpoint=path), log=lambda _: None)


def test_matmul_precision_applies_to_the_run_only():
    before = torch.get_float32_matmul_precision()
    result = run_regular(tiny(matmul_precision="medium"), log=lambda _: None)
    assert torch.get_float32_matmul_precision() == before and result.config["matmul_precision"] == "medium"
    with pytest.raises(ValueError, match="matmul_precision must be one of"):
        run_regular(tiny(matmul_precision="low"), log=lambda _: None)


@pytest.mark.parametrize(
    ("option", "make"),
    [("--checkpoint", lambda path: path.mkdir()), ("--output", lambda path: path.mkdir())],
)
def test_an_output_path_that_is_a_folder_is_refused_before_training(tmp_path, capsys, monkeypatch, option, make):
    import ssmhub.training.regular as regular

    def no_work(*_args, **_kwargs):
        raise AssertionError("training started before the paths were checked")

    monkeypatch.setattr(regular, "build_model", no_work)
    make(tmp_path / "target")
    with pytest.raises(SystemExit) as exit_info:
        main([option, str(tmp_path / "target"), "--steps", "1", "--test_sequences", "4"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ssmhub-regular: error: {option} {tmp_path / 'target'} is a folder") and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"] and not any((tmp_path / "target").iterdir())
