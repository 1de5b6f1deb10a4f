"""benchmarks/serpent_decode_profile.py: its models, how it splits profiler events into parts, and the slope."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from serpent_decode_profile import model_configs, overhead_slope, parse_args, step_parts


def test_mamba_and_serpent_with_one_to_three_branches_share_every_other_field():
    configs = model_configs(parse_args(["--width", "64", "--layers", "2"]))
    assert [c["resampling_rates"] for c in configs.values()] == [[], [0.5], [0.5, 0.1], [0.5, 0.25, 0.1]]
    assert len({str({k: v for k, v in c.items() if k != "resampling_rates"}) for c in configs.values()}) == 1


def test_profiler_events_split_into_parts_per_token():
    events = [
        SimpleNamespace(key="graph_1_cpp_fused_add_0", self_cpu_time_total=300.0),  # µs over all steps
        SimpleNamespace(key="graph_1_cpp_fused_mul_1", self_cpu_time_total=100.0),
        SimpleNamespace(key="## Call CompiledFxGraph fabc ##", self_cpu_time_total=200.0),
        SimpleNamespace(key="TorchDynamo Cache Lookup", self_cpu_time_total=80.0),
        SimpleNamespace(key="aten::mm", self_cpu_time_total=400.0),
        SimpleNamespace(key="aten::baddbmm", self_cpu_time_total=40.0),
        SimpleNamespace(key="aten::copy_", self_cpu_time_total=8.0),
        SimpleNamespace(key="Torch-Compiled Region: 0/1", self_cpu_time_total=50.0),  # in no part
    ]
    parts = step_parts(events, steps=4, wall_s=0.008)
    expected = {"kernels": 0.1, "wrapper": 0.05, "guards": 0.02, "lm head": 0.1, "other aten": 0.012, "step": 2.0}
    assert parts == pytest.approx(expected, rel=1e-12)


def test_the_overhead_slope_is_the_least_squares_line_through_inputs_and_wrapper_plus_guards():
    inputs = {"a": 50, "b": 150, "c": 250}
    parts = {name: {"wrapper": 0.1 + 0.004 * x, "guards": 0.2 + 0.002 * x} for name, x in inputs.items()}
    assert overhead_slope(inputs, parts) == pytest.approx(6.0, rel=1e-9)  # µs per input
