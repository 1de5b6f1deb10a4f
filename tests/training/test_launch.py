"""Runs in subprocesses: two CPU processes under ``accelerate launch`` and runs killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from training_helpers import TRAINING_REL, losses, same_losses, tiny_args

from ssmhub.training.checkpoint import MARKER, list_checkpoints, verify_checkpoint
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
    for split in ("train", "validation"):  # two computations of the same training: to float32 round-off
        same_losses(losses(two, split), losses(tmp_path / "one", split), what=split)
    last = [r for r in MetricsLogger.read(two) if r["split"] == "train"][-1]
    assert last["step"] == 6 and last["tokens_seen"] == 6 * 2 * 2 * 16  # steps x batch x processes x seq_len


# A training run (``ssmhub.training.cli``) that SIGKILLs itself at a chosen point of saving checkpoint
# step-KILL_STEP: "files-written" just before the completion marker is written (every other file of the
# checkpoint is on disk), "marker-written" just before the checkpoint folder is renamed into place.
# The hooks match on the path only (a folder whose name ends in step-KILL_STEP), so they fire wherever
# the checkpoint is written.
_KILL_SCRIPT = """
import os, signal, sys
from pathlib import Path

import ssmhub.training.checkpoint as checkpoint
from ssmhub.training.cli import main

kill_step, point, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]

def of_kill_step(path):
    return Path(path).name.endswith(f"step-{kill_step}")

def die():
    os.kill(os.getpid(), signal.SIGKILL)

if point == "files-written":
    write_json_atomic = checkpoint.write_json_atomic

    def write_json_or_die(path, *args, **kwargs):
        if Path(path).name == checkpoint.MARKER and of_kill_step(Path(path).parent):
            die()
        return write_json_atomic(path, *args, **kwargs)

    checkpoint.write_json_atomic = write_json_or_die
elif point == "marker-written":
    rename = os.rename

    def rename_or_die(src, dst, *args, **kwargs):
        if of_kill_step(dst):
            die()
        return rename(src, dst, *args, **kwargs)

    os.rename = rename_or_die
else:
    raise SystemExit(f"unknown kill point {point}")
main(argv)
"""

KILL_OPTIONS = {"max_steps": 8, "save_steps": 2, "eval_steps": 2, "save_total_limit": 2}


@pytest.fixture(scope="module")
def uninterrupted_run(tiny_data_dir, tmp_path_factory) -> Path:
    """The run the killed-and-resumed runs must reproduce: same flags, never interrupted."""
    out = tmp_path_factory.mktemp("uninterrupted")
    main(tiny_args(tiny_data_dir, out, **KILL_OPTIONS))
    return out


@pytest.mark.parametrize("point", ["files-written", "marker-written"])
def test_sigkill_while_saving_a_checkpoint_leaves_none_that_resume_trusts(
    tiny_data_dir, uninterrupted_run, tmp_path, capsys, point
):
    """SIGKILL the run at a fixed point of saving step-6 (no race: the process kills itself there). Every
    step-N folder left must pass its checksums, the resume must start from step 4 (the half-saved step 6
    ignored, neither loaded nor an error) and reproduce the uninterrupted run's losses (the same steps; each loss to
    float32 round-off)."""
    kill_step = 6
    killed = tmp_path / "killed"
    args = tiny_args(tiny_data_dir, killed, **KILL_OPTIONS)
    done = subprocess.run(
        [sys.executable, "-c", _KILL_SCRIPT, str(kill_step), point, *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == -signal.SIGKILL, f"the kill hook did not fire:\n{done.stderr[-3000:]}"
    assert max(losses(killed)) == kill_step
    # The kill came where intended: step 6's model files are on disk, its marker only after "marker-written".
    (half_saved,) = [p for p in (killed / "checkpoints").iterdir() if p.name.endswith(f"step-{kill_step}")]
    assert (half_saved / "model.safetensors").is_file(), f"{MARKER} is written before the model's files"
    assert (half_saved / MARKER).is_file() == (point == "marker-written")
    left = list_checkpoints(killed)
    for checkpoint in left:
        verify_checkpoint(checkpoint)  # raises CheckpointError for a step-N folder a kill left incomplete
    assert [p.name for p in left] == ["step-2", "step-4"]

    capsys.readouterr()
    main([*args, "--resume"])
    assert f"resumed from {killed / 'checkpoints' / 'step-4'} at step 4" in capsys.readouterr().out
    same_losses(losses(killed), losses(uninterrupted_run), what="train")
    same_losses(losses(killed, "validation"), losses(uninterrupted_run, "validation"), what="validation")
    assert [p.name for p in list_checkpoints(killed)] == ["step-6", "step-8"]


@pytest.mark.slow  # races a running subprocess (kept out of the default run); its deterministic sibling is above
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
    # 120 steps, not a handful: the two computations' round-off has 10x as many steps to grow (10 x TRAINING_REL)
    same_losses(losses(killed), losses(tmp_path / "full"), rel=10 * TRAINING_REL, what="train")
    same_losses(losses(killed, "validation"), losses(tmp_path / "full", "validation"), rel=10 * TRAINING_REL)
