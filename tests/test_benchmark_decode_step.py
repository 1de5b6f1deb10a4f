"""benchmarks/decode_step.py at a tiny width: a row per family, every timing measured, and the rows' slot states
written by the step it times (the hoisted step and the eager one leave the same states, float32 round-off apart)."""

import os
import sys

import torch
from comparisons import MODEL_REL, same_values

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import decode_step

from ssmhub.serving.flat_batch import compiled_decode, decode_rows


def test_a_row_per_family_with_every_timing():
    args = decode_step.parse_args(["--families", "dlr", "--width", "32", "--rows", "3", "--slots", "8", "--repeats",
                                   "1", "--no-write"])  # fmt: skip
    row = decode_step.family_row("dlr", args)
    assert row[0] == "dlr" and len(row) == 10
    assert all(float(cell) >= 0 for cell in row[1:8]) and float(row[4]) > 0  # sizes and timings, the step's > 0
    assert row[8].endswith("×") and row[9].endswith("%")


@torch.no_grad()
def test_the_in_graph_and_hoisted_steps_write_the_same_states():
    args = decode_step.parse_args(["--width", "32", "--slots", "8"])
    mixer, tables, _ = decode_step.layer_and_tables("h3-ssm", args)
    other = {name: table.clone() for name, table in tables.items()}
    before = {name: table.clone() for name, table in tables.items()}
    x, slots, new = torch.randn(3, 32), torch.tensor([1, 4, 6]), torch.tensor([False, True, False])
    y = decode_step.in_graph_decode(mixer)(mixer, x, tables, slots, new)
    expected = compiled_decode(mixer)(mixer, x, other, slots, new, mixer.kept_step_coefficients())
    same_values(y, expected, rel=MODEL_REL)
    eager = decode_rows(mixer, x, before, slots, new)
    same_values(eager, y, rel=MODEL_REL)
    for name, table in tables.items():
        same_values(table, other[name], rel=MODEL_REL, what=name)
        same_values(before[name], table, rel=MODEL_REL, what=name)
