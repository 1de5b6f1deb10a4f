"""experiments/induction_steps.py: the step at which the repeat's top-1 first reaches 0.9 and the last loss are
reported, a run too short to learn reports that it did not, and (slow) a tiny hybrid learns to copy 4 random tokens
of a vocabulary of 4 quickly."""

import math
import os
import sys

import pytest
import torch

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments")
)
import induction_steps


def _steps_to_induction(vocab, distance, *options):
    threads = torch.get_num_threads()
    try:
        return induction_steps.steps_to_induction(vocab, distance, induction_steps.parse_args(list(options)))
    finally:
        torch.set_num_threads(threads)


def test_the_first_step_at_top1_0_9_and_the_last_loss_are_reported(monkeypatch):
    """Scripted steps (repeat loss, top-1): the first one at 0.9 or more is reported, a later dip does not move it,
    the loss is the last step's; a real run of one step has not learned and says so."""
    script = iter([(2.0, 0.5), (1.0, 0.95), (0.8, 0.7), (0.5, 0.92)])
    monkeypatch.setattr(induction_steps, "copy_step", lambda model, optimizer, x, n: next(script))
    reached, loss, seconds = _steps_to_induction(4, 4, "--steps", "4", "--batch-tokens", "64", "--hidden-size", "8")
    assert (reached, loss) == (2, 0.5) and seconds > 0
    monkeypatch.undo()
    reached, loss, _ = _steps_to_induction(64, 8, "--steps", "1", "--batch-tokens", "64", "--hidden-size", "32")
    assert reached is None and math.isfinite(loss) and loss > 0


@pytest.mark.slow  # whether and when a tiny model learns depends on every rounding along the way
def test_a_small_copy_task_is_learned_and_reported():
    reached, loss, _ = _steps_to_induction(4, 4, "--steps", "150", "--batch-tokens", "256", "--hidden-size", "32")
    assert reached is not None and reached <= 150 and loss < 0.5
