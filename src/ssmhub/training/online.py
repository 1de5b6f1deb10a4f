"""The training loop of the online runs, ``ssmhub-regular`` and ``ssmhub-synthetic``.

An online run draws a fresh batch every step from a seeded ``torch.Generator``; there is no dataset, data loader or
scheduler object. :func:`train_online` takes its optimizer steps; what differs between the two commands is passed in:
the loss of a step (it draws its batch with the run's generator), the learning-rate factor of a step (a schedule, or
none), and an evaluation called every ``eval_every`` steps that may end the run early. Every ``log_every`` steps it
logs the loss, and every ``checkpoint_every`` steps (and after the last step of each cadence) it saves the run.

Checkpoints keep :mod:`ssmhub.training.run_state`'s one-file format rather than the trainer's ``step-N`` folders
(:mod:`ssmhub.training.checkpoint`). Those folders are written by ``accelerator.save_state`` with a data-loader
position and a registered scheduler, for a run that may span processes; an online run is one process with neither, so
its whole state is the model, the optimizer (which keeps each group's ``base_lr``, so a schedule needs no state of its
own), the data generator, torch's RNG and a small progress record: one atomic ``torch.save``. Moving to folders would
bring in Accelerate and a second reader for the files these commands have written so far, for no saved field.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .run_state import restore_run_state, save_run_state

__all__ = ["OnlineRun", "new_progress", "set_learning_rates", "train_online"]


def new_progress(**extra: Any) -> dict[str, Any]:
    """A fresh progress record: steps taken, the last loss, training and wall seconds of the saved sessions, and
    the caller's own fields ``extra`` (saved with it in every checkpoint)."""
    return {"step": 0, "loss": math.nan, "train_s": 0.0, "elapsed_s": 0.0, **extra}


@dataclass
class OnlineRun:
    """One online run's objects, settings and progress, and this session's wall clock.

    ``progress["elapsed_s"]`` and ``progress["train_s"]`` hold the seconds up to the last save (earlier sessions
    included); ``started`` is the ``time.perf_counter()`` at which this session's unsaved wall time began.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    data: torch.Generator  # draws every training batch
    config: dict[str, Any]  # the run's settings, saved in each checkpoint and checked on resuming
    checkpoint: str | None = None  # the run_state file, or None for a run that is never saved
    progress: dict[str, Any] = field(default_factory=new_progress)
    started: float = field(default_factory=time.perf_counter)

    def resume(self, saved: dict[str, Any]) -> None:
        """Continue from the checkpoint ``saved`` (:func:`~ssmhub.training.run_state.load_run_state`): its states
        into the model, optimizer, data generator and torch's RNG; its progress over this one's (a field added since
        it was written keeps its fresh value)."""
        self.progress = {**self.progress, **restore_run_state(saved, self.model, self.optimizer, self.data)}

    def save(self) -> None:
        """Add this session's wall time to the progress and write everything to ``checkpoint`` (atomically)."""
        now = time.perf_counter()
        self.progress["elapsed_s"] += now - self.started
        self.started = now  # the save itself counts as wall time of the next piece
        save_run_state(self.checkpoint, self.config, self.model, self.optimizer, self.data, self.progress)

    def wall_s(self) -> float:
        """Wall seconds of the whole run so far, earlier sessions included."""
        return self.progress["elapsed_s"] + time.perf_counter() - self.started


def set_learning_rates(optimizer: torch.optim.Optimizer, factor: float) -> None:
    """Every group's rate at ``factor`` times the rate it was built with (kept in the group as ``base_lr``, so it is
    saved with the optimizer and a resumed run continues the same schedule)."""
    for group in optimizer.param_groups:
        group["lr"] = group.setdefault("base_lr", group["lr"]) * factor


def train_online(
    run: OnlineRun,
    step_loss: Callable[[torch.Generator], torch.Tensor],
    max_steps: int,
    *,
    lr_factor: Callable[[int], float] | None = None,
    evaluate: Callable[[int], bool] | None = None,
    eval_every: int = 0,
    log: Callable[[str], None] = print,
    log_every: int = 0,
    checkpoint_every: int = 0,
) -> None:
    """Train ``run`` from the step after ``run.progress["step"]`` to ``max_steps``, one fresh batch a step.

    Args:
        step_loss: the loss of one step, a scalar with a graph; it draws its batch with the generator it is given.
        lr_factor: step (0-based) -> factor of every group's rate (:func:`set_learning_rates`); None leaves the
            rates alone.
        evaluate: called with the step every ``eval_every`` steps and after the last; True ends the run there
            (after that step's checkpoint).
        log_every: log the loss and the training seconds per step this often (0: never).
        checkpoint_every: save the run this often when it has a checkpoint file (0: never).

    Each cadence also fires at ``max_steps``. ``run.progress`` ends with the last step taken, its loss and the
    training seconds; its wall seconds are :meth:`OnlineRun.wall_s`.
    """
    progress = run.progress
    run.model.train()
    train_start = time.perf_counter()
    for step in range(progress["step"] + 1, max_steps + 1):
        if lr_factor is not None:
            set_learning_rates(run.optimizer, lr_factor(step - 1))
        loss = step_loss(run.data)
        run.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        run.optimizer.step()
        progress |= {"step": step, "loss": loss.item()}
        stop = evaluate is not None and _due(step, eval_every, max_steps) and evaluate(step)
        if _due(step, log_every, max_steps):
            rate = (progress["train_s"] + time.perf_counter() - train_start) / step
            log(f"step {step}/{max_steps}: loss {progress['loss']:.5f} ({rate:.3f} s/step)")
        if run.checkpoint and _due(step, checkpoint_every, max_steps):
            progress["train_s"] += time.perf_counter() - train_start
            run.save()
            train_start = time.perf_counter()  # the save counts as wall time, not training time
        if stop:
            break
    progress["train_s"] += time.perf_counter() - train_start


def _due(step: int, every: int, max_steps: int) -> bool:
    """Whether a cadence of ``every`` steps (0: never) fires at ``step``: at its multiples and at ``max_steps``."""
    return every > 0 and (step % every == 0 or step == max_steps)
