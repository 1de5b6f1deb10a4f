"""benchmarks/synthetic_tasks.py: which run a report cell shows, in the table and in the plot."""

import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from synthetic_tasks import _mqar_best, _precision_note, mqar_plot, mqar_section


def _row(family, width, steps, lr, value, batch=128):
    return {
        "section": "mqar",
        "L": 64,
        "num_kv_pairs": 4,
        "family": family,
        "width": width,
        "steps": steps,
        "lr": lr,
        "value": value,
        "batch_size": batch,
        "wall_s": 600.0,
        "matmul_precision": "medium",
        "final_train_loss": 1.25,
        "vocab_size": 8192,
    }


ROWS = [
    _row("dlr", 64, 600, 1e-3, 0.40),
    _row("dlr", 64, 600, 1e-4, 0.55),  # best over learning rates at the largest budget
    _row("dlr", 64, 300, 1e-2, 0.90),  # a smaller budget never wins, whatever its score
    _row("h3", 128, 600, 1e-3, 0.75),
]


def test_a_cell_is_the_best_learning_rate_at_the_largest_budget():
    assert _mqar_best(ROWS, 64, 4, "dlr", 64)["value"] == 0.55
    assert _mqar_best(ROWS, 64, 4, "dlr", 128) is None
    section = mqar_section(ROWS)
    table = section.split("### Every MQAR run")[0]
    dlr_line = next(line for line in table.splitlines() if "| dlr |" in line)
    assert "0.550 (lr 0.0001, 600 steps × 128, 10 min, medium)" in dlr_line
    assert "not run" in dlr_line  # width 128
    assert "0.900" not in table


def test_every_mqar_run_is_listed_with_its_final_loss():
    runs = mqar_section(ROWS).split("### Every MQAR run")[1]
    lines = [line for line in runs.splitlines() if line.startswith("| L 64")]
    assert lines == [  # sorted by setting, family, width, learning rate, budget
        "| L 64, 4 pairs | dlr | 64 | 0.0001 | 600 × 128 | 0.550 | 1.25 |",
        "| L 64, 4 pairs | dlr | 64 | 0.001 | 600 × 128 | 0.400 | 1.25 |",
        "| L 64, 4 pairs | dlr | 64 | 0.01 | 300 × 128 | 0.900 | 1.25 |",
        "| L 64, 4 pairs | h3 | 128 | 0.001 | 600 × 128 | 0.750 | 1.25 |",
    ]
    assert "ln(V/2) = 8.32 (V = 8192)" in runs and "ln P = 1.39 (P = 4)" in runs


@pytest.mark.filterwarnings("ignore:No artists with labels")  # Axes.plot is replaced below
def test_the_plot_shows_the_cells_of_the_table(tmp_path, monkeypatch):
    plotted = {}

    import matplotlib.axes
    import matplotlib.figure

    def record(self, xs, ys, *args, label=None, color=None, **kwargs):
        plotted.setdefault(label, []).append((self, list(xs), list(ys), color))

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", record)
    other_setting = [{**r, "L": 128, "num_kv_pairs": 8} for r in ROWS if r["family"] == "h3"]
    legends = []
    monkeypatch.setattr(matplotlib.figure.Figure, "legend", lambda self, handles, **kw: legends.append(handles))
    line = mqar_plot(ROWS + other_setting, str(tmp_path))
    assert line.startswith("![")
    assert (tmp_path / "synthetic_mqar.png").exists()
    nudged = {label: [xs[0] for _, xs, _, _ in calls] for label, calls in plotted.items()}
    # each family's points sit slightly apart along the log width axis, so equal accuracies do not hide each other
    assert nudged["dlr"][0] / 64 != nudged["h3"][0] / 128
    assert all(abs(math.log2(x) - round(math.log2(x))) < 0.1 for xs in nudged.values() for x in xs)
    plotted = {
        label: [(ax.get_title(), [2 ** round(math.log2(x)) for x in xs], *rest) for ax, xs, *rest in calls]
        for label, calls in plotted.items()
    }
    h3_color = plotted["h3"][0][3]
    assert plotted == {
        "dlr": [("L = 64, 4 pairs", [64], [0.55], "C0")],
        "h3": [("L = 64, 4 pairs", [128], [0.75], h3_color), ("L = 128, 8 pairs", [128], [0.75], h3_color)],
    }
    assert h3_color != "C0"  # h3 keeps its colour in a panel where it is the only family
    assert [h.get_label() for h in legends[0]] == ["dlr", "h3"]  # one legend naming every family


def test_a_medium_run_without_bf16_is_marked_as_float32():
    row = _row("dlr", 64, 600, 1e-3, 0.4)
    assert _precision_note(row) == ", medium"  # a row from before the cpu field
    assert _precision_note({**row, "cpu": {"capability": "AVX512", "avx512_bf16": True}}) == ", medium"
    assert _precision_note({**row, "cpu": {"capability": "AVX2", "avx512_bf16": False}}) == (
        ", medium: float32, no AVX512-BF16"
    )
    assert _precision_note({**row, "cpu": {"capability": "AVX2", "avx512_bf16": None}}) == ", medium"  # unknown
    assert _precision_note({**row, "matmul_precision": "high", "cpu": {"avx512_bf16": False}}) == ""
