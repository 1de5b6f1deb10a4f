"""ssmhub-synthetic: the models of every family, the metric as evaluated, tiny end-to-end runs, bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn
from training_helpers import TRAINING_REL, same_run_state

import ssmhub.training.synthetic as synthetic
from ssmhub.data.synthetic import get_synthetic_task
from ssmhub.training.synthetic import SyntheticRunConfig, evaluate, main, run_synthetic
from ssmhub.training.synthetic_models import SyntheticRegressionModel, SyntheticTokenModel, backbone_config

FAMILIES = {  # family -> tiny overrides
    "dlr": {"state_size": 8},
    "h3": {},
    "bdlrnn": {"block_size": 4},
    "serpent": {},
    "attention": {},
    "mamba": {"state_size": 4},  # transformers' MambaModel, the peer of SeRpEnt
}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_runs_as_a_regression_and_a_token_model(family):
    torch.manual_seed(0)
    task = get_synthetic_task("select", 6, num_selected=2)  # input length 10, 4 channels, 2 outputs
    config = backbone_config(family, 8, 2, task.input_length, overrides=FAMILIES[family])
    model = SyntheticRegressionModel(config, task.input_dim, task.output_dim, task.output_length)
    inputs, targets = task.sample(3, torch.Generator().manual_seed(0))
    predictions = model(inputs)
    assert predictions.shape == targets.shape == (3, 2, 1)
    nn.functional.mse_loss(predictions, targets).backward()
    assert model.input_proj.weight.grad is not None and model.input_proj.weight.grad.abs().sum() > 0

    token_task = get_synthetic_task("mqar", 16, vocab_size=32, num_kv_pairs=2)
    config = backbone_config(family, 8, 1, 16, vocab_size=32, overrides=FAMILIES[family])
    token_model = SyntheticTokenModel(config, token_task.num_labels)
    input_ids, labels = token_task.sample(3, torch.Generator().manual_seed(0))
    loss, logits = token_model(input_ids, labels)
    assert logits.shape == (6, 32) and loss.ndim == 0  # 3 sequences × 2 queries, and only those
    expected = nn.functional.cross_entropy(logits, labels[labels != -100])
    assert torch.allclose(loss, expected)


class Constant(nn.Module):
    """Predicts 0 everywhere (a stand-in model for checking the metric)."""

    def forward(self, inputs):
        return torch.zeros(inputs.shape[0], 4, 1)


def test_evaluation_averages_the_r2_of_each_batch():
    task = get_synthetic_task("cumsum", 4)
    inputs = torch.zeros(2, 4, 3)
    targets = torch.tensor([[1.0, 2, 3, 4], [0, 0, 2, 2]])[..., None]
    scores = evaluate(Constant(), task, inputs, targets, batch_size=1, device=torch.device("cpu"))
    # batch 1: mean 2.5, var 1.25, mse 7.5 -> −5; batch 2: mean 1, var 1, mse 2 -> −1
    assert scores["r2"] == pytest.approx(-3.0)
    # pooled: mean 1.75, var 4.75 − 1.75² = 1.6875, mse 4.75
    assert scores["r2_pooled"] == pytest.approx(1 - 4.75 / 1.6875)
    assert scores["mse"] == pytest.approx(4.75)


def tiny(**overrides) -> SyntheticRunConfig:
    options = {
        "task": "shift",
        "model_type": "dlr",
        "seq_len": 16,
        "num_layers": 1,
        "hidden_size": 8,
        "max_steps": 3,
        "batch_size": 4,
        "eval_examples": 8,
        "eval_batch_size": 4,
        "lr": 1e-2,
        "model_config": {"state_size": 8},
        "device": "cpu",
    }
    return SyntheticRunConfig(**{**options, **overrides})


def same_scores(got: dict, expected: dict) -> None:
    """Two runs' rows that should agree: an accuracy (a fraction of argmax predictions, as greedy tokens) exactly; an
    R² = 1 − mse/var and the last training loss to float32 round-off (TRAINING_REL). R²'s round-off is mse's,
    relative to 1 − R², not to R² (near 0 after a few steps)."""
    if expected["metric"] == "accuracy":
        assert got["value"] == expected["value"]
    else:
        assert math.isclose(1 - got["value"], 1 - expected["value"], rel_tol=TRAINING_REL), (got, expected)
    assert math.isclose(got["final_train_loss"], expected["final_train_loss"], rel_tol=TRAINING_REL)


def test_a_run_is_deterministic_and_reports_the_row():
    first, again = run_synthetic(tiny()), run_synthetic(tiny())
    same_scores(again, first)
    expected = {"task": "shift", "family": "dlr", "L": 16, "layers": 1, "width": 8, "steps": 3, "metric": "r2"}
    assert {k: first[k] for k in expected} == expected
    assert first["model_config"]["state_size"] == 8 and first["model_config"]["prenorm"] is False
    assert first["wall_s"] > 0 and first["lr"] == 1e-2


@pytest.mark.parametrize("task", ["shift", "mqar", "shift-cosine"])
def test_a_resumed_run_trains_like_an_uninterrupted_one(tmp_path, task):
    task, _, schedule = task.partition("-")
    options = {"task": task, "checkpoint_every": 2, "lr_schedule": schedule or "constant"}
    if task == "mqar":
        options |= {"seq_len": 32, "num_kv_pairs": 4, "vocab_size": 64}
    whole, pieces = tmp_path / "whole.pt", tmp_path / "pieces.pt"
    uninterrupted = run_synthetic(tiny(max_steps=5, checkpoint=str(whole), **options), log=lambda _: None)
    if schedule:  # the schedule spans max_steps: interrupt a 5-step run at step 4, after its save at step 2
        with pytest.raises(KeyboardInterrupt):
            run_synthetic(tiny(max_steps=5, checkpoint=str(pieces), log_every=1, **options), log=_interrupt_at_step_4)
        done = 2
    else:  # 3 steps, then 5
        run_synthetic(tiny(max_steps=3, checkpoint=str(pieces), **options), log=lambda _: None)
        done = 3
    lines = []
    resumed = run_synthetic(tiny(max_steps=5, checkpoint=str(pieces), **options), log=lines.append)
    assert lines == [f"resuming from {pieces} after step {done}"] and resumed["resumed_from_step"] == done
    for name in ("steps", "lr", "num_parameters"):  # settings and counts
        assert resumed[name] == uninterrupted[name], name
    same_scores(resumed, uninterrupted)
    a, b = torch.load(whole, weights_only=True), torch.load(pieces, weights_only=True)
    assert a["progress"]["step"] == b["progress"]["step"] == 5
    same_run_state(b, a)  # weights and moments to float32 round-off, the data generator's state exactly
    assert resumed["s_per_step"] > 0 and resumed["wall_s"] >= b["progress"]["elapsed_s"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pieces.pt", "whole.pt"]  # no temporary files left


def _interrupt_at_step_4(line: str) -> None:
    if line.startswith("step 4/"):
        raise KeyboardInterrupt


def test_the_cosine_schedule_decays_every_group_from_its_own_rate(tmp_path):
    path = tmp_path / "run.pt"
    overrides = {"state_size": 8, "recurrence_learning_rate": 1e-4}
    run_synthetic(tiny(max_steps=4, checkpoint=str(path), lr_schedule="cosine", model_config=overrides))
    groups = torch.load(path, weights_only=True)["optimizer"]["param_groups"]
    last_step_factor = 0.5 * (1 + math.cos(math.pi * 3 / 4))  # step 4 of 4 runs at progress 3/4
    assert {g["base_lr"] for g in groups} == {1e-2, 1e-4}
    for group in groups:
        assert group["lr"] == pytest.approx(group["base_lr"] * last_step_factor, rel=1e-12)


@pytest.mark.parametrize("family", ["dlr", "attention"])
def test_the_optimizer_takes_the_backbone_groups_and_the_recurrence_learning_rate(family):
    overrides = {"dlr": {"state_size": 8, "recurrence_learning_rate": 1e-4}, "attention": {}}[family]
    task = get_synthetic_task("shift", 8)
    config = backbone_config(family, 8, 1, task.input_length, overrides=overrides)
    model = SyntheticRegressionModel(config, task.input_dim, task.output_dim, task.output_length)
    optimizer = synthetic._build_optimizer(model, lr=1e-2, weight_decay=0.1)
    placed = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    assert len(placed) == sum(len(g["params"]) for g in optimizer.param_groups)  # each parameter once
    names = dict(model.named_parameters())
    assert set(placed) == {id(p) for p in names.values()}
    for name, param in names.items():
        group = placed[id(param)]
        if ".ssm." in f".{name}":  # a DLR recurrence: its own rate, never decayed
            assert (group["lr"], group["weight_decay"]) == (1e-4, 0.0), name
        elif name.startswith(("input_proj.", "readout.")):  # heads: matrices decayed, biases not
            assert (group["lr"], group["weight_decay"]) == (1e-2, 0.1 if param.dim() > 1 else 0.0), name
        else:
            assert group["lr"] == 1e-2, name
    if family == "dlr":
        assert any(".ssm." in f".{name}" for name in names)


def test_a_checkpoint_with_one_optimizer_group_resumes_into_the_groups(tmp_path, monkeypatch):
    """Checkpoints written when the optimizer was one AdamW over parameters() resume into the groups and train on
    as the uninterrupted run (to float32 round-off)."""
    whole, pieces = tmp_path / "whole.pt", tmp_path / "pieces.pt"
    uninterrupted = run_synthetic(tiny(max_steps=5, checkpoint=str(whole)), log=lambda _: None)
    with monkeypatch.context() as patch:
        patch.setattr(
            synthetic, "_build_optimizer", lambda m, lr, wd: torch.optim.AdamW(m.parameters(), lr, weight_decay=wd)
        )
        run_synthetic(tiny(max_steps=3, checkpoint=str(pieces)), log=lambda _: None)
    assert len(torch.load(pieces, weights_only=True)["optimizer"]["param_groups"]) == 1
    resumed = run_synthetic(tiny(max_steps=5, checkpoint=str(pieces)), log=lambda _: None)
    same_scores(resumed, uninterrupted)
    a, b = torch.load(whole, weights_only=True), torch.load(pieces, weights_only=True)
    assert len(b["optimizer"]["param_groups"]) > 1
    same_run_state(b, a)


def test_a_checkpoint_is_refused_for_other_settings_or_a_smaller_budget(tmp_path):
    path = str(tmp_path / "run.pt")
    run_synthetic(tiny(max_steps=4, checkpoint=path), log=lambda _: None)
    with pytest.raises(ValueError, match=r"hidden_size=8; this run has hidden_size=12"):
        run_synthetic(tiny(max_steps=6, hidden_size=12, checkpoint=path), log=lambda _: None)
    with pytest.raises(ValueError, match=r"max_steps must be at least the 4 steps the checkpoint"):
        run_synthetic(tiny(max_steps=3, checkpoint=path), log=lambda _: None)
    again = run_synthetic(tiny(max_steps=4, checkpoint=path), log=lambda _: None)  # finished: evaluated as is
    assert again["resumed_from_step"] == 4 and again["steps"] == 4


def test_matmul_precision_applies_to_the_run_only():
    before = torch.get_float32_matmul_precision()
    row = run_synthetic(tiny(matmul_precision="medium"), log=lambda _: None)
    assert torch.get_float32_matmul_precision() == before and row["matmul_precision"] == "medium"
    with pytest.raises(ValueError, match="matmul_precision must be one of"):
        run_synthetic(tiny(matmul_precision="low"))


def test_a_checkpoint_from_before_a_setting_existed_resumes_at_its_default(tmp_path):
    path = tmp_path / "run.pt"
    run_synthetic(tiny(max_steps=2, checkpoint=str(path)), log=lambda _: None)
    payload = torch.load(path, weights_only=True)
    del payload["config"]["matmul_precision"]  # as written before the setting was added
    torch.save(payload, path)
    with pytest.raises(ValueError, match=r"matmul_precision='high'; this run has matmul_precision='medium'"):
        run_synthetic(tiny(max_steps=3, checkpoint=str(path), matmul_precision="medium"), log=lambda _: None)
    assert run_synthetic(tiny(max_steps=3, checkpoint=str(path)), log=lambda _: None)["resumed_from_step"] == 2


def test_cli_regression_run_prints_and_appends_rows(tmp_path, capsys):
    results = tmp_path / "out" / "rows.jsonl"
    args = [
        "--task",
        "reverse",
        "--model_type",
        "attention",
        "--seq_len",
        "8",
        "--num_layers",
        "2",
        "--hidden_size",
        "8",
    ]
    args += ["--max_steps", "2", "--batch_size", "4", "--eval_examples", "8", "--eval_batch_size", "4"]
    args += ["--device", "cpu", "--results", str(results)]
    assert main(args) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(args) == 0
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(rows) == 2 and rows[0] == printed
    row = rows[0]
    assert (row["task"], row["family"], row["L"], row["input_length"], row["layers"], row["width"]) == (
        "reverse",
        "attention",
        8,
        16,
        2,
        8,
    )
    assert row["metric"] == "r2" and isinstance(row["value"], float) and row["lr"] == 1e-3  # Table 7, attention


def test_cli_mqar_run_reports_accuracy(tmp_path, capsys):
    args = ["--task", "mqar", "--model_type", "dlr", "--seq_len", "32", "--num_kv_pairs", "4", "--vocab_size", "64"]
    args += ["--num_layers", "2", "--hidden_size", "8", "--max_steps", "3", "--batch_size", "4", "--eval_examples", "8"]
    args += ["--model_config", '{"state_size": 8}', "--device", "cpu", "--results", str(tmp_path / "r.jsonl")]
    assert main(args) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["metric"] == "accuracy" and 0 <= row["value"] <= 1
    assert (row["num_kv_pairs"], row["vocab_size"], row["L"], row["random_non_queries"]) == (4, 64, 32, True)
    assert main([*args, "--no-random_non_queries"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["random_non_queries"] is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--task", "nope"], "task must be one of"),
        (["--task", "shift", "--seq_len", "4"], "seq_len must be an integer >= 8 for shift"),
        (["--task", "mqar", "--seq_len", "64", "--num_kv_pairs", "32"], "num_kv_pairs=32 does not fit seq_len=64"),
        (["--task", "mqar", "--seq_len", "64", "--num_kv_pairs", "4", "--vocab_size", "8"], "vocab_size=8"),
        (["--model_type", "no-such-family"], "--model_type 'no-such-family' is not a registered model type"),
        (["--model_type", "atention"], "did you mean 'attention'?"),
        (["--model_config", '{"hidden_size": "abc"}'], "--model_config key 'hidden_size' is set by --hidden_size"),
        (["--model_config", '{"state_size": "abc"}'], "--model_config does not fit the 'dlr' config"),
        (["--model_type", "attention", "--model_config", '{"n_layer": 3}'], "'n_layer' is set by --num_layers"),
        (["--model_type", "attention", "--hidden_size", "10"], "hidden_size must be a multiple of 4"),
        (["--model_type", "bdlrnn", "--hidden_size", "12"], "hidden_size"),
        (["--max_steps", "0"], "max_steps must be a positive integer"),
        (["--lr", "-1"], "lr must be a positive number"),
        (["--lr_schedule", "linear"], "--lr_schedule: invalid choice"),
        (["--device", "tpu"], "device"),
        (["--device", "cuda:7"], "--device cuda:7"),
        (["--seed", "7", "--eval_seed", "7"], "seed must differ from eval_seed"),
        (["--checkpoint_every", "0"], "checkpoint_every must be a positive integer"),
    ],
)
def test_bad_input_is_one_clear_error_before_any_work(args, message, capsys, monkeypatch):
    def no_work(*_args, **_kwargs):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr(synthetic, "_build_model", no_work)
    monkeypatch.setattr(synthetic, "fixed_eval_set", no_work)
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("ssmhub-synthetic: error:") and message in err and err.count("\n") == 1


def test_the_api_raises_value_error():
    with pytest.raises(ValueError, match="num_kv_pairs"):
        run_synthetic(tiny(task="mqar", seq_len=16, num_kv_pairs=5))


@pytest.mark.parametrize("option", ["--checkpoint", "--results"])
def test_an_output_path_that_is_a_folder_is_refused_before_training(tmp_path, capsys, monkeypatch, option):
    def no_work(*_args, **_kwargs):
        raise AssertionError("work started before the paths were checked")

    monkeypatch.setattr(synthetic, "_build_model", no_work)
    (tmp_path / "target").mkdir()
    with pytest.raises(SystemExit) as exit_info:
        main([option, str(tmp_path / "target"), "--seq_len", "16", "--max_steps", "1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ssmhub-synthetic: error: {option} {tmp_path / 'target'} is a folder")
    assert err.count("\n") == 1
    assert not any((tmp_path / "target").iterdir())
