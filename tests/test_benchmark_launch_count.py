"""benchmarks/launch_count.py and the profile helpers of the GPU suite: what they count and the inputs they refuse."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import launch_count
from _gpu_profile import count_aten_ops, profile_step, top_ops


def test_views_and_allocations_are_not_counted_kernels_are():
    x = torch.ones(2, 2)

    def three_kernels():
        y = x.view(4).unsqueeze(0).t()  # views: no kernel
        return torch.empty(3), (y + 1) * 2, y.sum()  # an allocation (none), then add, mul and sum

    assert count_aten_ops(three_kernels) == 3


def test_a_row_counts_one_training_step_of_the_model_at_its_depth():
    args = launch_count.parse_args(["--width", "24", "--length", "16", "--no_write"])
    name, layers, ops, per_layer = launch_count.count_row(args, "gpt2")
    assert (name, layers) == ("gpt2", "12") and int(ops) > 12 * 10 and int(per_layer) == round(int(ops) / 12)


def test_top_ops_give_shares_of_the_step():
    a = torch.randn(64, 64)
    rows, summary = top_ops(profile_step(lambda: (a @ a).relu(), torch.device("cpu")), torch.device("cpu"), n=2)
    assert len(rows) == 2 and all(row[3].endswith("%") for row in rows)
    assert "2 leaf ATen ops" in summary  # aten::mm (not its resolve_conj children) and relu's clamp_min


@pytest.mark.parametrize(("argv", "message"), [(["--width", "25"], "--width"), (["--length", "8"], "--length")])
def test_bad_arguments_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit):
        launch_count.parse_args(argv)
    assert message in capsys.readouterr().err
