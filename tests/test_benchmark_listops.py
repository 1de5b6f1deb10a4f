"""benchmarks/listops.py: every model's command trains through run_classification.py at the same budget, and
the report shows each run's accuracies and curve beside the paper's number."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from listops import MODELS, parse_args, report, run_command


def test_every_model_gets_the_same_budget_flags():
    args = parse_args(["--minutes", "2", "--threads", "1"])
    commands = {name: run_command(name, args, "out") for name in MODELS}
    for name, command in commands.items():
        assert command[1] == os.path.join("examples", "text-classification", "run_classification.py")
        flags = dict(zip(command[2::2], command[3::2]))
        assert flags["--model_type"] == MODELS[name][0]
        assert (flags["--max_train_minutes"], flags["--torch_num_threads"]) == ("2.0", "1")


def test_unknown_model_is_refused_by_flag(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--models", "dlr,gpt"])
    assert "--models" in capsys.readouterr().err


def test_report_lists_accuracy_curve_and_paper_number():
    args = parse_args([])
    record = {"model": "dlr", "settings": {"minutes": 6.0}, "command": "examples/x.py --a", "parameters": 1234,
              "steps": 500, "wall_seconds": 600.0, "load_before": [1.0], "load_after": [2.0], "eval_accuracy": 0.41,
              "test_accuracy": 0.4, "curve": [[30.0, 100, 0.2], [60.0, 200, 0.41]]}  # fmt: skip
    baselines = {"chance": 0.1, "majority": 0.17, "majority_label": 0, "mean_length": 50.0}
    text = "\n\n".join(report([record], args, baselines))
    assert "| dlr | dlr | 1,234 | 500 | 6 | 10.0 | 41.0 | 40.0 | 60.5" in text
    assert "| dlr | 20.0 | 41.0 |" in text and "majority class (0) 17.0%" in text
