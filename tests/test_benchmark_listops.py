"""benchmarks/listops.py: every model's command trains through run_classification.py at the same budget and
protocol, one run per seed, and the report shows each setting's mean and spread over seeds beside the paper."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from _listops_report import mean_and_spread, report
from listops import MODELS, PROTOCOLS, parse_args, run_command


def _flags(command: list[str]) -> dict:
    """Flags with their values (a flag followed by another flag maps to True)."""
    flags, words = {}, command[2:]
    for i, word in enumerate(words):
        if word.startswith("--"):
            following = words[i + 1] if i + 1 < len(words) else "--"
            flags[word] = True if following.startswith("--") else following
    return flags


def test_every_model_gets_the_same_budget_protocol_and_seed():
    args = parse_args(["--minutes", "2", "--threads", "1", "--seeds", "0,3"])
    assert args.seed_list == [0, 3]
    for name in MODELS:
        command = run_command(name, args, "out", seed=3)
        assert command[1] == os.path.join("examples", "text-classification", "run_classification.py")
        flags = _flags(command)
        assert flags["--model_type"] == MODELS[name][0] and flags["--seed"] == "3"
        assert (flags["--max_train_minutes"], flags["--torch_num_threads"]) == ("2.0", "1")
        assert flags["--lr_scheduler_type"] == "cosine" and flags["--lr_over_budget"] is True
        assert flags["--load_best_model_at_end"] is True and flags["--metric_for_best_model"] == "accuracy"


def test_the_paper_protocol_sets_dlrs_dropout_and_the_baseline_does_not():
    paper = _flags(run_command("dlr", parse_args([]), "out", seed=0))
    baseline = _flags(run_command("dlr", parse_args(["--protocol", "baseline"]), "out", seed=0))
    assert "dropout=0.2" in paper["--config_overrides"] and "dropout" not in baseline["--config_overrides"]
    assert baseline["--save_strategy"] == "no" and "--load_best_model_at_end" not in baseline
    assert set(PROTOCOLS) == {"paper", "baseline"}


@pytest.mark.parametrize(("flags", "named"), [(["--models", "dlr,gpt"], "--models"), (["--seeds", "0,a"], "--seeds")])
def test_bad_flags_are_refused_by_name(capsys, flags, named):
    with pytest.raises(SystemExit):
        parse_args(flags)
    assert named in capsys.readouterr().err


def test_mean_and_spread_over_seeds():
    assert mean_and_spread([0.4]) == "40.0"
    assert mean_and_spread([0.3, 0.4, 0.5]) == "40.0 ± 10.0 (30.0-50.0)"


def _record(model, seed, test_accuracy, protocol="paper"):
    return {"model": model, "seed": seed, "settings": {"minutes": 1.5, "min_length": 20, "max_length": 150,
            "threads": 1, "protocol": protocol}, "command": f"examples/x.py --seed {seed}", "parameters": 1234,
            "steps": 500, "eval_accuracy": 0.41, "test_accuracy": test_accuracy,
            "curve": [[15.0, 100, 0.2 + seed / 10], [90.02, 600, 0.41]]}  # fmt: skip


def test_report_has_a_section_per_setting_with_the_mean_over_seeds_and_the_gap():
    records = [_record("dlr", 0, 0.40), _record("dlr", 1, 0.50), _record("transformer", 0, 0.30),
               _record("transformer", 1, 0.32), _record("dlr", 0, 0.20, protocol="baseline")]  # fmt: skip
    floors = {"chance": 0.1, "majority": 0.17, "majority_label": 0, "mean_length": 50.0}
    sections = report(records, MODELS, lambda setting: floors)
    paper = next(s for s in sections if s.startswith("## paper protocol, lengths 20-150"))
    assert (
        "| dlr | dlr | 1,234 | 0,1 | 500 | 41.0 ± 0.0 (41.0-41.0) | 45.0 ± 7.1 (40.0-50.0) | 40.0, 50.0 | 60.5" in paper
    )
    assert "DLR - Transformer, mean test accuracy over seeds [0, 1]: +14.0 points." in paper
    assert "| model | 0.25 min | 1.50 min |" in paper and "| dlr | 25.0 | 41.0 |" in paper  # curve: mean of seeds
    assert any(s.startswith("## baseline protocol") and "| dlr | dlr | 1,234 | 0 |" in s for s in sections)
