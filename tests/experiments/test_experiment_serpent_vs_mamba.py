"""experiments/serpent_vs_mamba.py: one worker at tiny sizes measures every row the report has, and counts the ops
of a decode step, which a SeRpEnt mixer (a base Mamba plus resampling branches) has more of than a Mamba mixer."""

import os
import sys

import torch

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments")
)
import serpent_vs_mamba


def test_a_worker_measures_decode_ops_decode_and_training_for_both_models():
    args = serpent_vs_mamba.parse_args(
        ["--width", "12", "--layers", "1", "--vocab-size", "32", "--contexts", "4", "--steps", "2", "--repeats", "1",
         "--train-lens", "8", "--train-tokens", "16"]
    )  # fmt: skip
    threads = torch.get_num_threads()
    try:
        result = serpent_vs_mamba.worker(args)  # sets one thread, as its process would
    finally:
        torch.set_num_threads(threads)
    assert list(result) == ["decode ops/token", "decode 4", "train 8"]
    for measure in result.values():
        assert set(measure) == {"mamba", "serpent"} and all(value > 0 for value in measure.values())
    assert result["decode ops/token"]["serpent"] > result["decode ops/token"]["mamba"]
