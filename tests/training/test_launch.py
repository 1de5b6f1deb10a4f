"""Runs in subprocesses: two CPU processes under ``accelerate launch`` and a run killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from training_helpers import losses, tiny_args

from ssmhub.training.cli import main
from ssmhub.training.metrics import MetricsLogger

VENV_BIN = Path(sys.executable).parent


def test_two_cpu_processes_match_one_with_twice_the_batch(tiny_data_dir, tmp_path):
    # `accelerate launch --cpu --num_processes 2` starts a single process in accelerate 1.x (without mpirun);
    # --multi_gpu starts two torchrun workers, which run on the CPU with gloo (--cpu is a TrainConfig flag).
    launch = [
        str(VENV_BIN / "accelerate"),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "-m",
        "ssmhub.training.cli",
    ]
    two = tmp_path / "two"
    done = subprocess.run(
        [*launch, *tiny_args(tiny_data_dir, two, per_device_train_batch_size=2)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    main(tiny_args(tiny_data_dir, tmp_path / "one", per_device_train_batch_size=4))
    for split in ("train", "validation"):
        one_losses, two_losses = losses(tmp_path / "one", split), losses(two, split)
        assert one_losses.keys() == two_losses.keys()
        for step, loss in one_losses.items():
            assert two_losses[step] == pytest.approx(loss, abs=1e-5)
    last = [r for r in MetricsLogger.read(two) if r["split"] == "train"][-1]
    assert last["step"] == 6 and last["tokens_seen"] == 6 * 2 * 2 * 16  # steps x batch x processes x seq_len


@pytest.mark.slow  # a few seconds, but it races a subprocess: kept out of the default run on busy machines
def test_resume_after_sigkill_gives_the_same_losses(tiny_data_dir, tmp_path):
    options = {"max_steps": 120, "save_steps": 10, "eval_steps": 20, "save_total_limit": 2}
    main(tiny_args(tiny_data_dir, tmp_path / "full", **options))
    killed = tmp_path / "killed"
    args = [sys.executable, "-m", "ssmhub.training.cli", *tiny_args(tiny_data_dir, killed, **options)]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = killed / "checkpoints" / "step-20" / "complete.json"
    deadline = time.monotonic() + 120
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    last_logged = max(losses(killed))
    assert 20 <= last_logged < 120, "the run ended before it could be killed"
    main([*tiny_args(tiny_data_dir, killed, **options), "--resume"])
    assert losses(killed) == losses(tmp_path / "full")
    assert losses(killed, "validation") == losses(tmp_path / "full", "validation")
