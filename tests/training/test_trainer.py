"""End-to-end runs of ssmhub-train on a tiny synthetic WikiText-2: outputs, resume, damage, bad input, push."""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest
import torch
from training_helpers import losses, same_losses, tiny_args
from transformers import AutoModelForCausalLM, AutoTokenizer

from ssmhub.training import TrainConfig, train
from ssmhub.training.cli import main
from ssmhub.training.config import config_from_args
from ssmhub.training.metrics import MetricsLogger


def test_outputs_of_a_run(finished_run):
    out = finished_run
    train_losses, valid = losses(out), losses(out, "validation")
    assert sorted(train_losses) == [1, 2, 3, 4, 5, 6] and sorted(valid) == [3, 6]
    # it learns: 6 steps take the loss from ~log 300 = 5.70 down by 0.58 to 0.66 (seeds 0-4, 1 or 2 threads, AVX2 or
    # not); a margin of 0.25 holds on any seed and leaves float32 round-off (~1e-4) far behind
    assert train_losses[6] < train_losses[1] - 0.25
    assert (out / "metrics.csv").read_text().count("\n") == 1 + 6 + 2
    assert (out / "loss.png").stat().st_size > 1000
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-3", "step-6", "tokenizer"]
    card = (out / "README.md").read_text()
    assert "import ssmhub" in card and "wikitext-2" in card
    assert "trust_remote_code=True)" not in card and "--save_code" in card  # saved without code: no remote code
    assert not (out / "modeling_dlr.py").exists()
    assert "384" in card  # tokens seen: 6 steps x 4 windows x 16 tokens

    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.config.vocab_size == len(tokenizer) == 300
    ids = tokenizer([" the history of the river"], return_tensors="pt")["input_ids"]
    assert torch.isfinite(model(ids, labels=ids).loss)


def test_gradient_accumulation_matches_a_bigger_batch(tiny_data_dir, tmp_path):
    main(tiny_args(tiny_data_dir, tmp_path / "big", per_device_train_batch_size=8, save_steps=0))
    main(
        tiny_args(
            tiny_data_dir, tmp_path / "acc", per_device_train_batch_size=4, gradient_accumulation_steps=2, save_steps=0
        )
    )
    same_losses(losses(tmp_path / "acc"), losses(tmp_path / "big"))  # two computations: to float32 round-off


class Crash(RuntimeError):
    pass


def crash_after(step_to_crash):
    def hook(step):
        if step == step_to_crash:
            raise Crash(f"simulated crash after step {step}")

    return hook


@pytest.mark.parametrize(
    ("save_steps", "crash_step", "repeats", "shuffle"),
    [(4, 10, 0.0, False), (5, 12, 0.0, False), (4, 10, 0.5, False), (4, 10, 0.5, True)],
)
def test_resume_after_a_crash_gives_the_same_losses(tiny_data_dir, tmp_path, save_steps, crash_step, repeats, shuffle):
    # 320 train windows in batches of 32: an epoch is 10 steps. Resuming from step 8 crosses into the
    # second epoch; resuming from step 10 starts exactly at its beginning. With copying practice (repeats) the
    # resumed run draws the repeated passages the uninterrupted one drew. The same steps are logged exactly; their
    # losses are two computations of the same training, equal to float32 round-off (training_helpers.TRAINING_REL).
    options = {"max_steps": 14, "per_device_train_batch_size": 32, "save_steps": save_steps, "eval_steps": 4}
    options["repeat_passage_probability"] = repeats
    options["shuffle_repeated_passages"] = shuffle
    main(tiny_args(tiny_data_dir, tmp_path / "full", **options))
    epochs = {r["step"]: r["epoch"] for r in MetricsLogger.read(tmp_path / "full") if r["split"] == "train"}
    assert epochs[10] == 0 and epochs[11] == 1
    args = tiny_args(tiny_data_dir, tmp_path / "crashed", **options)
    with pytest.raises(Crash):
        train(config_from_args(args), on_step_end=crash_after(crash_step))
    assert max(losses(tmp_path / "crashed")) == crash_step
    main([*args, "--resume"])
    same_losses(losses(tmp_path / "crashed"), losses(tmp_path / "full"), what="train")
    same_losses(losses(tmp_path / "crashed", "validation"), losses(tmp_path / "full", "validation"), what="validation")


def test_pg19_run_resumes_to_the_same_losses_and_reuses_the_token_cache(tiny_pg19_dir, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    options = {"dataset": "pg19", "max_steps": 8, "save_steps": 4, "eval_steps": 4, "cache_dir": str(cache)}
    main(tiny_args(tiny_pg19_dir, tmp_path / "full", **options))
    entries = sorted(p.name for p in (cache / "token_windows").iterdir())
    assert len(entries) == 2 and all(name.startswith("pg19-") for name in entries)  # train and validation

    # A second run tokenizes nothing: its windows come from the same cache entries.
    import datasets

    def no_map(*args, **kwargs):
        raise AssertionError("datasets.map called although the windows are cached")

    monkeypatch.setattr(datasets.Dataset, "map", no_map)
    args = tiny_args(tiny_pg19_dir, tmp_path / "crashed", **options)
    with pytest.raises(Crash):
        train(config_from_args(args), on_step_end=crash_after(6))
    main([*args, "--resume"])
    same_losses(losses(tmp_path / "crashed"), losses(tmp_path / "full"))
    assert sorted(p.name for p in (cache / "token_windows").iterdir()) == entries


def damage_missing_file(ckpt):
    (ckpt / "optimizer.bin").unlink()


def damage_corrupt_file(ckpt):
    with open(ckpt / "model.safetensors", "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xfe\xfd")


def damage_no_marker(ckpt):
    (ckpt / "complete.json").unlink()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (damage_missing_file, "optimizer.bin is missing"),
        (damage_corrupt_file, "model.safetensors does not match"),
        (damage_no_marker, "no complete.json marker"),
    ],
)
def test_damaged_checkpoint_errors_naming_the_path(finished_run, tmp_path, tiny_data_dir, capsys, damage, message):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    damage(out / "checkpoints" / "step-6")
    with pytest.raises(SystemExit) as exit_info:
        main([*tiny_args(tiny_data_dir, out, max_steps=9), "--resume", "--allow_schedule_change"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(out / "checkpoints" / "step-6") in err and message in err
    assert max(losses(out)) == 6  # nothing was trained from scratch


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"data_dir": "/nonexistent/data"}, "data folder /nonexistent/data .* does not exist"),
        ({"seq_len": 0}, "seq_len must be a positive integer"),
        (
            {"model_type": "gpt2", "model_config": '{"n_positions": 8, "n_embd": 16, "n_layer": 1, "n_head": 2}'},
            "seq_len 16 exceeds the model's (max_position_embeddings|n_positions)=8",
        ),
        ({"model_config": '{"hidden_size": 16, "hiden_layers": 1}'}, "model_config key 'hiden_layers' is not a field"),
        (
            {"model_config": '{"hidden_size": 16, "num_hidden_layers": 1, "vocab_size": 100}'},
            "tokenizer has 300 tokens but model_config forces vocab_size=100",
        ),
        ({"model_type": "no-such-family"}, "no-such-family"),
        ({"dataset": "pg19"}, "PG-19 split 'train': missing folder"),
        ({"tokenizer": "/nonexistent/tok"}, "tokenizer /nonexistent/tok does not exist"),
        ({"report_to": "no-such-tracker"}, "Unsupported logging capability: no-such-tracker"),
    ],
)
def test_bad_input_fails_before_training(tmp_path, tiny_data_dir, capsys, overrides, message):
    with pytest.raises(SystemExit) as exit_info:
        main(tiny_args(tiny_data_dir, tmp_path / "bad", **overrides))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ssmhub-train: error:") and "\n" not in err
    assert re.search(message, err), err
    assert not (tmp_path / "bad" / "metrics.jsonl").exists()


def hub_reachable(monkeypatch, user: str = "me") -> None:
    """A token and a Hub that accepts it, without the network (``huggingface_hub.whoami`` mocked)."""
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token_for_test")
    monkeypatch.setattr(huggingface_hub, "whoami", lambda token=None: {"name": user})


def test_push_that_fails_after_the_local_save_keeps_the_folder(tmp_path, tiny_data_dir, capsys, monkeypatch):
    import huggingface_hub

    hub_reachable(monkeypatch)

    def no_network(self, *args, **kwargs):
        raise ConnectionError("network down for hf_secret_token_for_test")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", no_network)
    out = tmp_path / "pushed"
    with pytest.raises(SystemExit) as exit_info:
        main(tiny_args(tiny_data_dir, out, save_steps=0, push_to_hub=None, hub_model_id="my-org/tiny-dlr"))
    assert exit_info.value.code == 1
    err = [line for line in capsys.readouterr().err.splitlines() if "ssmhub-train: error:" in line]
    assert len(err) == 1 and "my-org/tiny-dlr" in err[0] and "network down" in err[0]
    assert "hf_secret_token_for_test" not in err[0]
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md", "loss.png"} <= {
        p.name for p in out.iterdir()
    }
    assert "my-org/tiny-dlr" in (out / "README.md").read_text()
    AutoModelForCausalLM.from_pretrained(out)


def no_token(monkeypatch):
    import huggingface_hub

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)


def token_refused(monkeypatch):
    import huggingface_hub

    def refuse(token=None):
        raise OSError(f"401 Client Error: invalid token {token}")

    hub_reachable(monkeypatch)
    monkeypatch.setattr(huggingface_hub, "whoami", refuse)


@pytest.mark.parametrize(
    ("hub", "message"),
    [
        (lambda mp: mp.setenv("HF_HUB_OFFLINE", "1"), "--push_to_hub: HF_HUB_OFFLINE is set"),
        (no_token, "--push_to_hub needs a Hugging Face token"),
        (token_refused, "--push_to_hub: the Hub did not accept the token"),
    ],
)
def test_a_push_that_cannot_work_is_refused_before_training(tmp_path, tiny_data_dir, capsys, monkeypatch, hub, message):
    hub_reachable(monkeypatch)
    hub(monkeypatch)
    out = tmp_path / "pushed"
    with pytest.raises(SystemExit) as exit_info:
        main(tiny_args(tiny_data_dir, out, push_to_hub=None, hub_model_id="my-org/tiny-dlr"))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "hf_secret_token_for_test" not in err
    assert not out.exists()  # nothing trained, nothing written


def test_train_api_returns_a_result(tmp_path, tiny_data_dir):
    config = TrainConfig(
        output_dir=str(tmp_path / "api"),
        data_dir=str(tiny_data_dir),
        vocab_size=300,
        seq_len=16,
        max_steps=2,
        per_device_train_batch_size=4,
        warmup_steps=1,
        save_steps=0,
        eval_steps=0,
        max_eval_windows=4,
        cpu=True,
        model_config=json.loads('{"hidden_size": 16, "num_hidden_layers": 1, "state_size": 4}'),
    )
    result = train(config)
    assert result.steps == 2 and result.tokens_seen == 2 * 4 * 16
    # the same float, returned and logged (JSON writes a float's shortest repr, which reads back to its bits)
    assert math.isfinite(result.eval_loss) and result.train_loss == losses(tmp_path / "api")[2]


def test_resume_with_a_different_data_option_errors(finished_run, tmp_path, tiny_data_dir, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    with pytest.raises(SystemExit):
        main([*tiny_args(tiny_data_dir, out, max_steps=9, seq_len=8), "--resume"])
    assert "--resume: seq_len is 8 but the run in" in capsys.readouterr().err


def test_fresh_run_into_a_used_output_dir_errors(finished_run, tmp_path, tiny_data_dir, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    with pytest.raises(SystemExit) as exit_info:
        main(tiny_args(tiny_data_dir, out))
    assert exit_info.value.code == 2
    assert f"--output_dir {out} is not empty" in capsys.readouterr().err
    main(tiny_args(tiny_data_dir, out, max_steps=4, overwrite_output_dir=None))
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-3", "tokenizer"]


def test_a_saved_model_without_checkpoints_is_never_overwritten(finished_run, tmp_path, tiny_data_dir, capsys):
    out = tmp_path / "model"
    shutil.copytree(finished_run, out, ignore=shutil.ignore_patterns("checkpoints"))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(SystemExit) as exit_info:
        main(tiny_args(tiny_data_dir, out, max_steps=2))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--output_dir" in err and "--overwrite_output_dir" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # untouched


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"resume": None}, "--resume: no checkpoint in"),
        ({"seq_len": 4096}, "seq_len 4096 is longer than the whole tokenized split"),
    ],
)
def test_a_start_that_fails_after_the_tokenizer_leaves_nothing(tmp_path, tiny_data_dir, capsys, overrides, message):
    out = tmp_path / "refused"
    with pytest.raises(SystemExit) as exit_info:
        main(tiny_args(tiny_data_dir, out, **overrides))
    assert exit_info.value.code in (1, 2)
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_a_failed_overwrite_keeps_the_earlier_run(finished_run, tmp_path, tiny_data_dir, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    with pytest.raises(SystemExit):
        main(tiny_args(tiny_data_dir, out, seq_len=4096, overwrite_output_dir=None))
    assert "seq_len 4096 is longer" in capsys.readouterr().err
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before  # checkpoints kept, no staging left


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda path: path.write_text("not a folder"), "is a file"),
        (lambda path: (path.parent / "blocker").write_text("x"), "blocker is a file"),
    ],
)
def test_an_output_dir_that_cannot_be_a_folder_is_refused(tmp_path, tiny_data_dir, capsys, make, message):
    out = tmp_path / "out"
    make(out)
    target = out if out.exists() else tmp_path / "blocker" / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(tiny_args(tiny_data_dir, target))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("ssmhub-train: error: --output_dir") and message in err and err.count("\n") == 1


def test_given_tokenizer_is_used(finished_run, tmp_path, tiny_data_dir):
    out = tmp_path / "tok"
    main(tiny_args(tiny_data_dir, out, tokenizer=finished_run, vocab_size=999, max_steps=2, save_steps=0))
    assert AutoTokenizer.from_pretrained(out).get_vocab() == AutoTokenizer.from_pretrained(finished_run).get_vocab()
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 300


def test_only_the_newest_checkpoints_are_kept(tmp_path, tiny_data_dir):
    out = tmp_path / "keep"
    main(tiny_args(tiny_data_dir, out, max_steps=5, save_steps=1, save_total_limit=2, eval_steps=0))
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-4", "step-5", "tokenizer"]
    state = json.loads((out / "checkpoints" / "step-5" / "trainer_state.json").read_text())
    assert state == {"step": 5, "epoch": 0, "position": 5}


def test_tensorboard_tracker_gets_the_logged_metrics(tmp_path, tiny_data_dir):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    main(tiny_args(tiny_data_dir, out, save_steps=0, report_to="tensorboard"))
    events = list(out.rglob("events.out.tfevents.*"))
    assert events, f"no TensorBoard event file under {out}"
    accumulator = EventAccumulator(str(events[0].parent))
    accumulator.Reload()
    logged = {e.step: e.value for e in accumulator.Scalars("train/loss")}
    assert logged.keys() == losses(out).keys()
    for step, loss in losses(out).items():
        assert logged[step] == pytest.approx(loss, rel=1e-6)
    assert [e.step for e in accumulator.Scalars("validation/loss")] == [3, 6]


def test_a_training_checkpoint_is_evaluated_like_the_saved_model(finished_run, tiny_data_dir, capsys):
    from ssmhub.evaluation.cli import run_evaluation

    options = ["--dataset", "wikitext-2", "--data_dir", str(tiny_data_dir), "--max_length", "16"]
    options += ["--max_documents", "2"]
    final = run_evaluation([str(finished_run), *options])
    checkpoint = run_evaluation([str(finished_run / "checkpoints" / "step-6"), *options])  # step 6 is the last
    assert checkpoint["tokenizer"] == str(finished_run / "checkpoints" / "tokenizer")
    assert checkpoint["results"] == final["results"]
    earlier = run_evaluation([str(finished_run / "checkpoints" / "step-3"), *options])
    assert earlier["results"]["token_perplexity"] != final["results"]["token_perplexity"]


def test_a_checkpoint_outside_its_run_folder_is_one_line(finished_run, tiny_data_dir, tmp_path, capsys):
    from ssmhub.evaluation.cli import main as evaluate

    alone = shutil.copytree(finished_run / "checkpoints" / "step-6", tmp_path / "step-6")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        evaluate([str(alone), "--dataset", "wikitext-2", "--data_dir", str(tiny_data_dir)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"training checkpoint {alone} cannot be evaluated" in err
    assert "train_config.json is missing" in err
