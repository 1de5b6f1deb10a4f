"""``ssmhub-train --fsdp``: the run sharded with FSDP2 (:func:`ssmhub.training.fsdp.shard_model`), in one process and
in two CPU processes started by ``torchrun`` (gloo).

Without mixed precision a sharded run computes what an unsharded one computes (the same global batches, the same
float32 ops; only the order of a few sums differs: gradients averaged over the processes, the clipping norm summed
over shards), so the losses agree within ``TRAINING_REL`` (tests/training/training_helpers.py). A stateful run
(``--stateful``) shards the same way: each process carries the states of its own rows (the document streams deal
every row's documents identically on every process), so it too computes what one process computes, with the same
tolerance (each row's forward runs in a batch of 2 instead of 4: other blockings, the same float32 ops). The bf16
policy's tolerance against one process is tests/training/test_fsdp2.py's; here a bf16 run is checked to train, to
keep the recurrence float32 where it is saved and to leave a checkpoint that ``ssmhub-eval`` reads.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from training_helpers import losses, same_losses, tiny_args
from transformers import AutoModelForCausalLM, AutoTokenizer

from ssmhub.training.checkpoint_model import load_checkpoint_model
from ssmhub.training.cli import main

TORCHRUN = [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", "2", "--standalone"]


def torchrun_train(args: list[str]) -> None:
    done = subprocess.run([*TORCHRUN, "-m", "ssmhub.training.cli", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_one_process_fsdp_trains_as_the_unsharded_run(finished_run, tiny_data_dir, tmp_path):
    out = tmp_path / "fsdp"
    main(tiny_args(tiny_data_dir, out, fsdp=None))
    for split in ("train", "validation"):
        same_losses(losses(out, split), losses(finished_run, split), what=split)
    assert (out / "checkpoints" / "step-3" / "shards").is_dir()
    assert not (out / "checkpoints" / "step-3" / "model.safetensors").exists()  # the shards hold the weights
    saved, reference = load_file(out / "model.safetensors"), load_file(finished_run / "model.safetensors")
    assert saved.keys() == reference.keys()
    tokenizer = AutoTokenizer.from_pretrained(out / "checkpoints" / "tokenizer")
    at_step_6 = load_checkpoint_model(out / "checkpoints" / "step-6", tokenizer).state_dict()
    for name, weight in saved.items():
        torch.testing.assert_close(at_step_6[name], weight, rtol=0, atol=0, msg=name)  # the same tensors, copied


def test_one_process_fsdp_bf16_keeps_the_recurrence_float32(tiny_data_dir, tmp_path):
    out = tmp_path / "bf16"
    main(tiny_args(tiny_data_dir, out, fsdp=None, mixed_precision="bf16", max_steps=2, save_steps=0, eval_steps=0))
    assert all(math.isfinite(loss) for loss in losses(out).values()) and len(losses(out)) == 2
    model = AutoModelForCausalLM.from_pretrained(out)
    recurrence = {name: p.dtype for name, p in model.named_parameters() if ".ssm." in name}
    assert recurrence and set(recurrence.values()) == {torch.float32}


def test_fsdp_refuses_fp16(tiny_data_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        main(tiny_args(tiny_data_dir, tmp_path / "refused", fsdp=None, mixed_precision="fp16"))
    assert exit.value.code == 2
    assert "fsdp with mixed_precision" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()


@pytest.fixture(scope="module")
def stateful_run(tiny_data_dir, tmp_path_factory) -> Path:
    """``tiny_args`` with ``--stateful`` in one process without sharding: 4 rows carrying their states."""
    out = tmp_path_factory.mktemp("stateful")
    main(tiny_args(tiny_data_dir, out, stateful=None))
    return out


@pytest.mark.slow  # another torchrun start (~50-90 s on 2 busy cores); the one-process sharded run below is its sibling
def test_two_torchrun_processes_train_a_stateful_run_as_one(stateful_run, tiny_data_dir, tmp_path):
    """``--fsdp --stateful`` over 2 processes of 2 rows each equals the unsharded one-process run of 4 rows, and
    its checkpoints hold both the model shards and each process's carried states."""
    two = tmp_path / "two"
    torchrun_train(tiny_args(tiny_data_dir, two, fsdp=None, stateful=None, per_device_train_batch_size=2))
    for split in ("train", "validation"):
        same_losses(losses(two, split), losses(stateful_run, split), what=split)
    step_3 = two / "checkpoints" / "step-3"
    assert len(list((step_3 / "shards").glob("*.distcp"))) == 2
    assert sorted(path.name for path in step_3.glob("stateful_states-*")) == [
        "stateful_states-0.safetensors",
        "stateful_states-1.safetensors",
    ]


def test_one_process_fsdp_stateful_resumes_its_shards_and_states(stateful_run, tiny_data_dir, tmp_path):
    """A sharded stateful run resumed from its step-3 checkpoint (shards and carried states) continues as the
    uninterrupted unsharded run."""
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    main(tiny_args(tiny_data_dir, full, fsdp=None, stateful=None))
    shutil.copytree(full, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-6")
    main([*tiny_args(tiny_data_dir, resumed, fsdp=None, stateful=None), "--resume"])
    for split in ("train", "validation"):
        same_losses(losses(full, split), losses(stateful_run, split), what=f"fsdp {split}")
        same_losses(losses(resumed, split), losses(full, split), what=f"resumed {split}")


@pytest.fixture(scope="module")
def two_process_run(tiny_data_dir, tmp_path_factory) -> Path:
    """``tiny_args`` sharded over 2 torchrun processes of batch 2 (the global batch of ``finished_run``'s 4)."""
    two = tmp_path_factory.mktemp("two")
    torchrun_train(tiny_args(tiny_data_dir, two, fsdp=None, per_device_train_batch_size=2))
    return two


def test_two_torchrun_processes_match_one(two_process_run, finished_run):
    for split in ("train", "validation"):
        same_losses(losses(two_process_run, split), losses(finished_run, split), what=split)
    assert json.loads((two_process_run / "train_config.json").read_text())["num_processes"] == 2
    shards = list((two_process_run / "checkpoints" / "step-3" / "shards").glob("*.distcp"))
    assert len(shards) == 2  # one file of shards per process


@pytest.mark.slow  # a second torchrun start (~50 s on 2 busy cores); the one-process resume below is its sibling
def test_two_torchrun_processes_resume_from_their_shards(two_process_run, tiny_data_dir, tmp_path):
    resumed = tmp_path / "resumed"
    shutil.copytree(two_process_run, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-6")
    torchrun_train([*tiny_args(tiny_data_dir, resumed, fsdp=None, per_device_train_batch_size=2), "--resume"])
    for split in ("train", "validation"):
        same_losses(losses(resumed, split), losses(two_process_run, split), what=split)


def test_one_process_fsdp_resumes_from_its_shards(tiny_data_dir, tmp_path):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    main(tiny_args(tiny_data_dir, full, fsdp=None, mixed_precision="bf16"))
    shutil.copytree(full, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-6")
    main([*tiny_args(tiny_data_dir, resumed, fsdp=None, mixed_precision="bf16"), "--resume"])
    for split in ("train", "validation"):
        same_losses(losses(resumed, split), losses(full, split), what=split)
