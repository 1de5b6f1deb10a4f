"""benchmarks/decode_vs_context.py's measurements and report pieces, on stand-ins: no model is timed here.

The lanes resume decoding block after block as the script's rounds need; the tables and checks built from a
context's results have one cell per header and judge the project's targets from the numbers given.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import decode_vs_context as bench


def counting_step(calls: list):
    """A decode step function that records its calls and returns the token plus the steps taken."""

    def step(callee, cache, token, steps):
        calls.append((callee, cache, int(token), steps))
        return token + steps

    return step


@pytest.mark.parametrize("feed_back", [True, False])
def test_a_lane_resumes_from_its_last_token_or_restarts_from_the_same_one(feed_back):
    calls = []
    lane = bench.Lane(counting_step(calls), "model", "cache", torch.tensor(5), feed_back=feed_back)
    lane.run(3)
    lane.time_block(2)
    lane.time_block(2)
    assert [c[2] for c in calls] == ([5, 8, 10] if feed_back else [5, 5, 5])
    assert [c[3] for c in calls] == [3, 2, 2] and len(lane.ms) == 2 and all(ms >= 0 for ms in lane.ms)


def dlr_result(dlr_ms: float, gpt2_ms: float, compiled: bool) -> dict:
    r = {
        "dlr_ms": dlr_ms,
        "gpt2_ms": gpt2_ms,
        "dlr_bytes": 1_000,
        "dlr_bytes_prefill": 1_000,
        "gpt2_bytes": 500_000,
        "prefill_s": 0.5,
        "dlr_all": [dlr_ms],
        "gpt2_all": [gpt2_ms],
        "static_ms": gpt2_ms / 2,
        "static_all": [gpt2_ms / 2],
    }
    if compiled:
        r |= {"floor_ms": 0.9 * dlr_ms / 2, "dlr_compiled_ms": dlr_ms / 2, "gpt2_compiled_ms": 2 * dlr_ms}
        r |= {"bandwidth": 1e10, "bandwidths": [1e10]}
    return r


@pytest.mark.parametrize("compiled", [True, False])
def test_the_dlr_tables_have_a_cell_per_header(compiled):
    results = {128: dlr_result(10.0, 40.0, compiled), 16384: dlr_result(11.0, 400.0, compiled)}
    tables = bench.dlr_tables(results)
    assert set(tables) == {"table", "detail", "static", *(["compiled"] if compiled else [])}
    for table in tables.values():
        header, rule, *rows = table.splitlines()
        assert len(rows) == 2
        assert all(row.count("|") == header.count("|") == rule.count("|") for row in rows)


def test_the_dlr_checks_judge_the_numbers_given():
    results = {128: dlr_result(10.0, 40.0, True), 16384: dlr_result(11.0, 400.0, True)}
    checks = bench.dlr_checks(results)
    assert len(checks) == 6 and all(line.startswith("- [PASS]") for line in checks), checks
    results[16384] = dlr_result(13.0, 30.0, False)  # 1.3× slower at 16K, under 3× GPT-2's speed, no compiled rows
    verdicts = [line.split("]")[0] for line in bench.dlr_checks(results)]
    assert verdicts == ["- [FAIL", "- [PASS", "- [FAIL", "- [PASS"]


@pytest.mark.parametrize("names", [("exact", "distilled"), ("exact", "distilled", "mixed")])
@pytest.mark.parametrize("with_gpt2", [True, False])
def test_an_h3_row_has_a_cell_per_header(names, with_gpt2):
    models = dict.fromkeys(names)
    timed = (*names, "gpt2") if with_gpt2 else names
    result = {
        "ms": dict.fromkeys(timed, 2.0),
        "mem": dict.fromkeys(timed, 1.0),
        "peak": dict.fromkeys(timed, 3.0),
        "prefill_s": dict.fromkeys(names, 0.1),
    }
    labels = bench.h3_labels(type("Args", (), {"num_modes": 8, "tolerance": 0.3})())
    assert len(bench.h3_row(1024, result, models)) == len(bench.h3_headers(labels, models))
