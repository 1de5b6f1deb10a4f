"""A training checkpoint (``output_dir/checkpoints/step-N``) as a causal LM and its tokenizer, for evaluation.

A checkpoint folder holds Accelerate's state (``model.safetensors``, the optimizer, scheduler and RNG
states), ``trainer_state.json`` and the ``complete.json`` marker (:mod:`.checkpoint`), but no
``config.json`` or tokenizer: those are the run's. The model's config is rebuilt from the run's
``output_dir/train_config.json`` and tokenizer (``output_dir/checkpoints/tokenizer``) exactly as the run
built it (:func:`~ssmhub.training.trainer.build_model_config`), and the weights are loaded from the
checkpoint after its checksums are verified (a sharded run's from its ``shards`` folder, written by
``torch.distributed.checkpoint``, read here in one process). ``ssmhub-eval runs/x/checkpoints/step-N`` uses this.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .checkpoint import MARKER, STATE_FILE, verify_checkpoint

__all__ = ["checkpoint_tokenizer_dir", "is_training_checkpoint", "load_checkpoint_model"]

_RUN_CONFIG = "train_config.json"
_WEIGHTS = "model.safetensors"
_SHARDS = "shards"  # trainer.SHARDS_SUBDIR: an fsdp run's model and optimizer shards


def is_training_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder written by :func:`~ssmhub.training.checkpoint.save_checkpoint`."""
    path = Path(path)
    return path.is_dir() and ((path / MARKER).is_file() or (path / STATE_FILE).is_file())


def _run_dir(checkpoint: Path) -> Path:
    """The run's ``output_dir`` of a checkpoint (``output_dir/checkpoints/step-N``)."""
    return checkpoint.absolute().parent.parent


def checkpoint_tokenizer_dir(checkpoint: str | os.PathLike) -> Path:
    """The tokenizer of a checkpoint's run, after checking that the run's files a model needs are there.

    Raises FileNotFoundError naming the missing file (a checkpoint copied without its run folder).
    """
    checkpoint = Path(checkpoint)
    run = _run_dir(checkpoint)
    weights = checkpoint / (_SHARDS if (checkpoint / _SHARDS).is_dir() else _WEIGHTS)
    for needed in (weights, run / _RUN_CONFIG, run / "checkpoints" / "tokenizer"):
        if not needed.exists():
            raise FileNotFoundError(
                f"training checkpoint {checkpoint} cannot be evaluated: {needed} is missing (a checkpoint is "
                "evaluated within its run folder, output_dir/checkpoints/step-N, which holds its config and tokenizer)"
            )
    return run / "checkpoints" / "tokenizer"


def load_checkpoint_model(checkpoint: str | os.PathLike, tokenizer):
    """The causal LM of a training checkpoint (in eval mode), with the run's config and the checkpoint's weights.

    Raises :class:`~ssmhub.training.checkpoint.CheckpointError` for a damaged checkpoint and ValueError when
    its weights do not fit the model the run's config describes.
    """
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from .config import TrainConfig
    from .trainer import build_model_config

    checkpoint = Path(checkpoint)
    verify_checkpoint(checkpoint)
    saved = json.loads((_run_dir(checkpoint) / _RUN_CONFIG).read_text(encoding="utf-8"))
    saved.pop("num_processes", None)
    model = AutoModelForCausalLM.from_config(build_model_config(TrainConfig.from_dict(saved), tokenizer))
    if (checkpoint / _SHARDS).is_dir():
        state = _sharded_weights(checkpoint / _SHARDS, model)
    else:  # under DDP, Accelerate saves the wrapped model's state: its names start with "module."
        state = {name.removeprefix("module."): tensor for name, tensor in load_file(checkpoint / _WEIGHTS).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {name for name in missing if name not in state and _is_tied(model, name)}
    if set(missing) - tied or unexpected:
        raise ValueError(
            f"training checkpoint {checkpoint}: its weights do not fit the run's model (missing: "
            f"{sorted(set(missing) - tied)[:3]}, unexpected: {sorted(unexpected)[:3]})"
        )
    model.tie_weights()
    return model.eval()


def _sharded_weights(folder: Path, model) -> dict:
    """The model weights of an fsdp run's checkpoint shards (``torch.distributed.checkpoint``, any number of
    processes), whole, in ``model``'s names (FSDP2 keeps them), read without a process group."""
    import torch.distributed.checkpoint as dcp

    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(folder), no_dist=True)
    return state["model"]


def _is_tied(model, name: str) -> bool:
    """Whether the parameter ``name`` shares its storage with another one (a tied output embedding, which
    the checkpoint stores once)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    return name in params and any(other != name and tensor is params[name] for other, tensor in params.items())
