"""benchmarks/induction_steps.py: a tiny hybrid learns to copy 4 random tokens of a vocabulary of 4 quickly and
reports the step; a run too short to learn reports that it did not."""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import induction_steps


def test_a_small_copy_task_is_learned_and_reported():
    threads = torch.get_num_threads()
    try:
        args = induction_steps.parse_args(["--steps", "150", "--batch-tokens", "256", "--hidden-size", "32"])
        reached, loss, _ = induction_steps.steps_to_induction(4, 4, args)
        assert reached is not None and reached <= 150 and loss < 0.5
        args = induction_steps.parse_args(["--steps", "1", "--batch-tokens", "64", "--hidden-size", "32"])
        assert induction_steps.steps_to_induction(64, 8, args)[0] is None
    finally:
        torch.set_num_threads(threads)
