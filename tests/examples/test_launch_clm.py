"""``accelerate launch`` of examples/language-modeling/run_clm.py on two CPU processes (DDP over gloo): the
losses of every step are one process's at the same global batch (to float32 round-off).

Why DDP and not FSDP: accelerate 1.x only shards with FSDP on an accelerator. Under an FSDP config on a
CPU-only machine, ``TrainingArguments(use_cpu=True)`` (and ``ssmhub-train --cpu``) runs as DDP
(``DistributedType.MULTI_CPU``) without a word; without it, ``FullyShardedDataParallelPlugin`` raises
"There are currently no available devices found, must be one of 'XPU', 'CUDA', 'MLU', 'NPU', 'MUSA', or
'HPU'." (README, "Training on several processes"). PyTorch's own FSDP does run on the CPU with gloo;
the FSDP path is tested on a GPU (issue 12's suite).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from example_helpers import EXAMPLES, load_example
from training.training_helpers import TRAINING_REL  # tests/training: the tolerance of two training runs

VENV_BIN = Path(sys.executable).parent
LAUNCH = [str(VENV_BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
          "--mixed_precision", "no", "--dynamo_backend", "no"]  # fmt: skip


def _argv(tiny_corpus, output_dir: Path, batch_size: int) -> list[str]:
    return ["--output_dir", str(output_dir), "--train_file", str(tiny_corpus["train"]),
            "--tokenizer_name", str(tiny_corpus["tokenizer"]), "--block_size", "16", "--do_train",
            "--max_steps", "4", "--per_device_train_batch_size", str(batch_size), "--logging_steps", "1",
            "--learning_rate", "0.01", "--use_cpu", "--report_to", "none", "--save_strategy", "no",
            "--config_overrides", "hidden_size=16,num_hidden_layers=1,state_size=4",
            "--cache_dir", str(output_dir.parent / f"cache-{output_dir.name}")]  # fmt: skip


def _losses(output_dir: Path) -> dict[int, float]:
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: entry["loss"] for entry in history if "loss" in entry}


def test_two_cpu_processes_train_run_clm_as_one_with_the_same_global_batch(tiny_corpus, tmp_path):
    two = tmp_path / "two"
    script = str(EXAMPLES / "language-modeling" / "run_clm.py")
    done = subprocess.run([*LAUNCH, script, *_argv(tiny_corpus, two, 2)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    load_example("language-modeling/run_clm.py").main(_argv(tiny_corpus, tmp_path / "one", 4))
    one_losses, two_losses = _losses(tmp_path / "one"), _losses(two)
    assert sorted(one_losses) == sorted(two_losses) == [1, 2, 3, 4]
    # two computations of the same training (a batch split over processes, its gradients all-reduced): each loss to
    # float32 round-off, which grows over the steps (tests/training/training_helpers.py, TRAINING_REL)
    assert two_losses == pytest.approx(one_losses, rel=TRAINING_REL)
