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


def test_the_branch_ablation_scores_a_copy_with_the_branch_outputs_zeroed(tmp_path, monkeypatch):
    import serpent_vs_mamba_lm as bench

    import ssmhub

    config = ssmhub.SerpentConfig(
        vocab_size=32, hidden_size=16, num_hidden_layers=1, resampling_rates=[0.5], branch_output_init_std=0.2
    )
    folder = tmp_path / "serpent-seed0"
    ssmhub.SerpentForCausalLM(config).save_pretrained(folder)
    seen = []

    def fake_score(args, scored, data_dir, splits=("validation", "test")):
        model = ssmhub.SerpentForCausalLM.from_pretrained(str(scored))
        outputs = [p for n, p in model.named_parameters() if n.endswith("output_proj.weight")]
        seen.append((scored, all(not p.any() for p in outputs)))
        return {"validation": {"loss": 5.5, "top1": 0.1}}

    monkeypatch.setattr(bench, "score", fake_score)
    args = parse_args(["--data-dir", "unused", "--work-dir", str(tmp_path)])
    record = _record("serpent", 0, 0.12, 1.0)
    record["scores"]["validation"]["loss"] = 5.25
    table = bench.branch_ablation(args, [_record("mamba", 0, 0.1, 1.0), record], tmp_path)
    assert len(seen) == 1 and seen[0][0] != folder and seen[0][1]  # a copy, every branch output zeroed
    original = ssmhub.SerpentForCausalLM.from_pretrained(str(folder))
    assert any(p.any() for n, p in original.named_parameters() if n.endswith("output_proj.weight"))  # untouched
    assert "| `serpent` | 0 | 5.2500 | 5.5000 | -0.2500 | 12.00 | 10.00 |" in table
