"""A ``transformers.TrainerCallback`` that trains for a budget of seconds rather than of steps.

Models of different speeds compared "at an equal CPU budget" (LRA ListOps, ``benchmarks/listops.py``) each
get the same training time, whatever number of steps that is. The clock is the process's CPU time by
default (``time.process_time``): on a shared machine other users' work slows the wall clock but not this
one, so the budget stays the same amount of computation on one thread. Time spent evaluating is not
counted. ``eval_every`` asks ``Trainer`` to evaluate every that many budget seconds, so runs of different
speeds give accuracy curves on one time axis.
"""

from __future__ import annotations

import time

from transformers import TrainerCallback

__all__ = ["CLOCKS", "TimeBudgetCallback"]

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


class TimeBudgetCallback(TrainerCallback):
    """Stop training once ``seconds`` of training time are spent; optionally evaluate every ``eval_every``.

    Args:
        seconds: the training budget (> 0), evaluation excluded.
        clock: ``"cpu"`` (this process's CPU time, default) or ``"wall"``.
        eval_every: budget seconds between evaluations (None: only as ``TrainingArguments`` asks).
    """

    def __init__(self, seconds: float, clock: str = "cpu", eval_every: float | None = None):
        if not seconds > 0:
            raise ValueError(f"TimeBudgetCallback seconds must be > 0; got {seconds!r}")
        if clock not in CLOCKS:
            raise ValueError(f"TimeBudgetCallback clock must be one of {sorted(CLOCKS)}; got {clock!r}")
        if eval_every is not None and not eval_every > 0:
            raise ValueError(f"TimeBudgetCallback eval_every must be > 0 or None; got {eval_every!r}")
        self.seconds, self.clock, self.eval_every = seconds, CLOCKS[clock], eval_every
        self.spent = 0.0  # training seconds so far, evaluation excluded
        self._since = None  # clock reading when training last resumed
        self._next_eval = eval_every

    def on_train_begin(self, args, state, control, **kwargs):
        self._since = self.clock()

    def on_step_end(self, args, state, control, **kwargs):
        now = self.clock()
        self.spent += now - self._since
        self._since = now
        if self._next_eval is not None and self.spent >= self._next_eval:
            control.should_evaluate = True
            self._next_eval += self.eval_every
        if self.spent >= self.seconds:
            control.should_training_stop = True
            control.should_evaluate = self.eval_every is not None  # the curve's last point
        return control

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if state.log_history and any(key.endswith("_runtime") for key in state.log_history[-1]):
            state.log_history[-1]["train_budget_seconds"] = round(self.spent, 2)  # the curve's time axis
        self._since = self.clock()  # evaluation is not training time

    def on_save(self, args, state, control, **kwargs):
        self._since = self.clock()  # nor is saving a checkpoint
