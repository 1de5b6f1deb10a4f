"""``ssmhub-train --resume`` and the learning-rate schedule: a changed schedule is refused, saying what would
change, unless ``--allow_schedule_change``; then the run follows the new schedule from the checkpoint's step.
A resume with no checkpoint is bad input (exit 2), as every other argument error."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from training_helpers import tiny_args

from ssmhub.training.cli import main
from ssmhub.training.schedule import lr_lambda


def _rates(output_dir):
    """step -> the learning rate logged at that training step."""
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["lr"] for r in records if r["split"] == "train"}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"max_steps": 9}, "max_steps 6 -> 9"),
        ({"max_steps": 9, "warmup_steps": 3}, "warmup_steps 2 -> 3"),
        ({"learning_rate": 0.02}, "learning_rate 0.01 -> 0.02"),
    ],
)
def test_a_changed_schedule_is_refused_saying_what_would_change(
    finished_run, tmp_path, tiny_data_dir, capsys, change, named
):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    with pytest.raises(SystemExit) as exit_info:
        main([*tiny_args(tiny_data_dir, out, **change), "--resume"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err and "at its step 6 the rate would go from" in err
    assert "--allow_schedule_change" in err
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before  # nothing written


def test_allow_schedule_change_follows_the_new_schedule_from_the_checkpoint(finished_run, tmp_path, tiny_data_dir):
    """Steps 7-9 of a resumed run with max_steps 6 -> 9 run at the new warmup + cosine's rates (the old schedule
    had reached its floor at step 6; the scheduler's lambda is the new run's, its step the checkpoint's)."""
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    main([*tiny_args(tiny_data_dir, out, max_steps=9), "--resume", "--allow_schedule_change"])
    rates = _rates(out)
    for step in (7, 8, 9):  # a logged step s ran at the schedule's rate of optimizer step s - 1
        expected = 0.01 * lr_lambda(step - 1, 2, 9, 0.1)
        assert math.isclose(rates[step], expected, rel_tol=1e-6), (step, rates[step], expected)


def test_resume_without_a_checkpoint_is_bad_input(tmp_path, tiny_data_dir, capsys):
    out = tmp_path / "empty"
    with pytest.raises(SystemExit) as exit_info:
        main([*tiny_args(tiny_data_dir, out), "--resume"])
    assert exit_info.value.code == 2
    assert "--resume: no checkpoint in" in capsys.readouterr().err


def test_resuming_a_finished_run_prints_no_empty_summary(finished_run, tmp_path, tiny_data_dir, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    main([*tiny_args(tiny_data_dir, out), "--resume"])
    printed = capsys.readouterr().out
    assert "trained 6 steps" in printed and "; ;" not in printed
