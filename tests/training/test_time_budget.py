"""TimeBudgetCallback: training stops once its budget of seconds is spent, evaluation time excluded, with an
evaluation every ``eval_every`` budget seconds (driven here by a hand-set clock, as Trainer would call it)."""

from __future__ import annotations

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from ssmhub.training.time_budget import TimeBudgetCallback


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _train(callback, clock, step_seconds, eval_seconds, max_steps=100):
    """Run the callback's hooks as Trainer's loop does; returns (steps run, steps that evaluated)."""
    args, state, control = TrainingArguments(output_dir="unused", report_to="none"), TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control)
    evaluated = []
    for step in range(1, max_steps + 1):
        clock.now += step_seconds
        control = callback.on_step_end(args, state, control)
        if control.should_evaluate:
            clock.now += eval_seconds
            state.log_history.append({"eval_accuracy": 0.5, "eval_runtime": eval_seconds, "step": step})
            callback.on_evaluate(args, state, control, metrics={})
            evaluated.append(step)
            control.should_evaluate = False
        if control.should_training_stop:
            return step, evaluated, state
    return max_steps, evaluated, state


def test_stops_at_the_budget_and_evaluates_on_its_time_axis_without_counting_evaluation():
    clock = Clock()
    callback = TimeBudgetCallback(10.0, eval_every=3.0)
    callback.clock = clock
    steps, evaluated, state = _train(callback, clock, step_seconds=1.0, eval_seconds=5.0)
    assert steps == 10  # 10 one-second steps; the 3 evaluations' 15 seconds are not counted
    assert evaluated == [3, 6, 9, 10]  # every 3 budget seconds, and the last step
    assert [entry["train_budget_seconds"] for entry in state.log_history] == [3.0, 6.0, 9.0, 10.0]


def test_without_eval_every_it_only_stops():
    clock = Clock()
    callback = TimeBudgetCallback(2.5)
    callback.clock = clock
    assert _train(callback, clock, step_seconds=1.0, eval_seconds=0.0)[:2] == (3, [])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seconds": 0}, "seconds"),
        ({"seconds": 1, "clock": "gpu"}, "clock"),
        ({"seconds": 1, "eval_every": -1}, "eval_every"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TimeBudgetCallback(**kwargs)
