"""benchmarks/serpent_vs_mamba_lm.py: Mamba's width matches SeRpEnt's parameters within 2%, and the verdict states
each target as met or missed from the means over seeds."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from serpent_vs_mamba_lm import model_configs, parameters_of, parse_args, verdict


def test_mamba_gets_the_parameters_of_serpent_within_two_percent():
    args = parse_args(["--data-dir", "unused", "--hidden-size", "64", "--layers", "2", "--vocab-size", "512"])
    configs = model_configs(args)
    serpent, mamba = parameters_of(configs["serpent"]), parameters_of(configs["mamba"])
    assert configs["mamba"]["resampling_rates"] == [] and configs["serpent"]["branch_layout"] == "additive"
    assert abs(mamba - serpent) <= 0.02 * serpent
    assert configs["serpent-nocompress"]["resampling_rates"] == [1.0, 1.0]


def _record(name: str, seed: int, top1: float, step_s: float) -> dict:
    score = {"perplexity": 100.0, "top1": top1, "top5": 0.5}
    return {"name": name, "seed": seed, "step_cpu_s": step_s, "scores": {"validation": score, "test": score}}


def test_the_verdict_averages_seeds_and_says_met_or_missed():
    records = [_record("mamba", 0, 0.10, 1.0), _record("mamba", 1, 0.12, 1.0)]
    records += [_record("serpent", 0, 0.12, 1.1), _record("serpent", 1, 0.11, 1.1)]
    text = verdict(records)
    assert "top-1 +0.50 points. Target top-1 ≥ Mamba's: **met**" in text
    assert "1.10×" in text and "Target ≤ 1.15×: **met**" in text
    records[2] = _record("serpent", 0, 0.08, 1.4)
    text = verdict(records)
    assert "**missed**" in text and "Target ≤ 1.15×: **missed**" in text
