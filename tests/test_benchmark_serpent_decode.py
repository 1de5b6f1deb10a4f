"""benchmarks/serpent_decode.py: the three models it times and the verdict it writes from the medians of rounds."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from serpent_decode import model_configs, parse_args, verdict
from serpent_vs_mamba_lm import parameters_of


def test_serpent_is_timed_against_its_base_and_an_equal_parameter_mamba():
    configs = model_configs(parse_args(["--width", "64", "--layers", "2", "--vocab-size", "512"]))
    serpent, equal = parameters_of(configs["serpent"]), parameters_of(configs["mamba-equal"])
    assert configs["serpent"]["resampling_rates"] == [0.5, 0.1]
    assert configs["mamba"]["resampling_rates"] == [] and configs["mamba"]["hidden_size"] == 64
    assert abs(equal - serpent) <= 0.02 * serpent


def test_the_verdict_uses_medians_and_says_met_or_missed():
    times = {("mamba", mode): [1.0, 1.0, 9.0] for mode in ("eager", "compiled")}
    times |= {("mamba-equal", mode): [2.0, 2.0, 2.0] for mode in ("eager", "compiled")}
    times |= {("serpent", "eager"): [3.0, 3.0, 3.0], ("serpent", "compiled"): [1.2, 1.3, 0.1]}
    text = verdict(times)
    assert "compiled: SeRpEnt 1.20× the same-width Mamba's ms/token (0.60× Mamba's at equal parameters)" in text
    assert "**met**" in text
    times["serpent", "compiled"] = [1.4, 1.4, 1.4]
    assert "**missed**" in verdict(times)
