"""One-file checkpoints of a small online training run (``ssmhub-regular``, ``ssmhub-synthetic``).

Those runs draw a fresh batch every step from a seeded ``torch.Generator`` and have no data loader or scheduler, so
everything needed to continue one as if it had never stopped (the same batches and random draws; weights and losses
to float32 round-off, which another thread count or CPU may round differently) is: the run's settings, the model and
optimizer states, the data generator's state, torch's global RNG state and the run's own progress record.
:func:`save_run_state` writes them with one ``torch.save`` to a temporary name (fsync, then rename, through
:func:`ssmhub.fileio.atomic_path`), so the file at ``path`` is always a complete
checkpoint; :func:`load_run_state` refuses, naming the field, a checkpoint written with other settings
than the ones that may change between a run and its continuation.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..fileio import atomic_path

__all__ = ["load_run_state", "restore_run_state", "save_run_state"]


def save_run_state(
    path: str,
    config: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    data_generator: torch.Generator,
    progress: dict[str, Any],
) -> None:
    """Write everything needed to continue the run to ``path`` (atomically)."""
    payload = {
        "config": config,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "data_generator": data_generator.get_state(),
        "torch_rng": torch.get_rng_state(),
        "progress": progress,
    }
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def load_run_state(
    path: str, config: dict[str, Any], resumable: Iterable[str], defaults: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The checkpoint at ``path``, after checking it was written by a run with the settings ``config``.

    Raises ValueError naming the first setting that differs, unless it is one of ``resumable``. A setting
    the checkpoint does not name (one added to the config since it was written) counts as its value in
    ``defaults``, the behaviour before the setting existed.
    """
    payload = torch.load(path, map_location="cpu", weights_only=True)
    saved, resumable = {**(defaults or {}), **payload["config"]}, set(resumable)
    for name, value in config.items():
        if name not in resumable and saved.get(name) != value:
            raise ValueError(
                f"checkpoint {path} was written by a run with {name}={saved.get(name)!r}; this run has "
                f"{name}={value!r} (only {', '.join(sorted(resumable))} may change when resuming)"
            )
    return payload


def restore_run_state(
    payload: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer, data_generator: torch.Generator
) -> dict[str, Any]:
    """Load a checkpoint's states into the run's objects (and torch's RNG); returns its progress record."""
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(_regrouped(payload["optimizer"], model, optimizer))
    data_generator.set_state(payload["data_generator"])
    torch.set_rng_state(payload["torch_rng"])
    return payload["progress"]


def _regrouped(saved: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``saved`` (an optimizer state dict) in the parameter groups of ``optimizer``.

    A checkpoint written before a run's optimizer had parameter groups holds one group over
    ``model.parameters()`` in that order; its per-parameter states (Adam's step and moments) are moved
    to where each parameter sits in ``optimizer``'s groups, which keep their own hyperparameters. Any
    other state dict is returned as it is, for ``Optimizer.load_state_dict`` to check.
    """
    if len(saved["param_groups"]) != 1 or len(optimizer.param_groups) == 1:
        return saved
    old_keys = saved["param_groups"][0]["params"]  # state keys, in model.parameters() order
    saved_key = {id(param): key for param, key in zip(model.parameters(), old_keys)}
    flat = [param for group in optimizer.param_groups for param in group["params"]]
    if not len(old_keys) == len(saved_key) == len(flat):
        raise ValueError(
            f"the checkpoint's optimizer holds {len(old_keys)} parameters in one group; the model has "
            f"{len(list(model.parameters()))} and the optimizer {len(flat)} in {len(optimizer.param_groups)} groups"
        )
    current = optimizer.state_dict()  # its param_groups number the parameters 0, 1, ... in group order
    moved = ((index, saved_key[id(param)]) for index, param in enumerate(flat))
    state = {index: saved["state"][key] for index, key in moved if key in saved["state"]}
    return {"state": state, "param_groups": current["param_groups"]}
