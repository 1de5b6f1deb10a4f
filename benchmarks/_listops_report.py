"""The markdown report of ``benchmarks/listops.py``: one section per setting, mean and spread over seeds."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable

from _report import command_line, markdown_table

__all__ = ["group_by_setting", "mean_and_spread", "report"]


def group_by_setting(records: list[dict]) -> dict[str, list[dict]]:
    """Records keyed by their settings (seeds of one setting together), ordered by protocol, lengths and budget."""
    groups: dict[str, list[dict]] = {}
    for record in records:
        groups.setdefault(json.dumps(record["settings"], sort_keys=True), []).append(record)

    def order(runs: list[dict]) -> tuple:
        setting = runs[0]["settings"]
        return setting.get("protocol", ""), setting["min_length"], setting["max_length"], setting["minutes"]

    return {key: groups[key] for key in sorted(groups, key=lambda key: order(groups[key]))}


def mean_and_spread(values: list[float]) -> str:
    """``"mean ± sd (min-max)"`` in percent of accuracies in [0, 1]; the sample sd (n - 1), none for one value."""
    percent = [100 * value for value in values]
    if len(percent) == 1:
        return f"{percent[0]:.1f}"
    sd = statistics.stdev(percent)
    return f"{statistics.mean(percent):.1f} ± {sd:.1f} ({min(percent):.1f}-{max(percent):.1f})"


def _model_row(name: str, runs: list[dict], models: dict) -> list:
    runs = sorted(runs, key=lambda r: r.get("seed", 0))
    steps = statistics.mean(r["steps"] for r in runs)
    per_seed = ", ".join(f"{100 * r['test_accuracy']:.1f}" for r in runs)
    return [name, models[name][0], f"{runs[0]['parameters']:,}", ",".join(str(r.get("seed", 0)) for r in runs),
            f"{steps:.0f}", mean_and_spread([r["eval_accuracy"] for r in runs]),
            mean_and_spread([r["test_accuracy"] for r in runs]), per_seed, models[name][2]]  # fmt: skip


def _gap(by_model: dict[str, list[dict]]) -> str:
    """DLR minus the Transformer, mean test accuracy over the seeds both have."""
    if "dlr" not in by_model or "transformer" not in by_model:
        return ""
    seeds = {r.get("seed", 0) for r in by_model["dlr"]} & {r.get("seed", 0) for r in by_model["transformer"]}
    if not seeds:
        return ""
    dlr, transformer = (
        statistics.mean(r["test_accuracy"] for r in by_model[model] if r.get("seed", 0) in seeds)
        for model in ("dlr", "transformer")
    )
    gap = 100 * (dlr - transformer)
    return f" DLR - Transformer, mean test accuracy over seeds {sorted(seeds)}: {gap:+.1f} points."


def _curves(by_model: dict[str, list[dict]], models: dict) -> str:
    """Validation accuracy over training CPU minutes, the mean over seeds at each evaluation (to ``eval_every``)."""
    points: dict[str, dict[float, list[float]]] = {}
    for name in (name for name in models if name in by_model):
        for record in by_model[name]:
            every = record["settings"].get("eval_every", 0.05)  # a slow step overshoots it: bin to its multiples
            for seconds, _, accuracy in record.get("curve", []):
                points.setdefault(name, {}).setdefault(round(seconds / 60 / every) * every, []).append(accuracy)
    minutes = sorted({m for curve in points.values() for m in curve})
    rows = [
        [name, *(f"{100 * statistics.mean(curve[m]):.1f}" if m in curve else "" for m in minutes)]
        for name, curve in points.items()
    ]
    return "Validation accuracy (%) over training CPU minutes, mean over seeds:\n\n" + markdown_table(
        ["model", *(f"{m:.2f} min" for m in minutes)], rows
    )


def _section(setting: dict, runs: list[dict], models: dict, floors: dict) -> str:
    by_model: dict[str, list[dict]] = {}
    for record in runs:
        by_model.setdefault(record["model"], []).append(record)
    headers = ["model", "model_type", "parameters", "seeds", "steps (mean)", "validation acc %", "test acc %",
               "test acc % per seed", "paper (LRA, 500-2,000 tokens)"]  # fmt: skip
    rows = [_model_row(name, by_model[name], models) for name in models if name in by_model]
    commands = "\n".join(f"- {name}: `python {by_model[name][0]['command']}`" for name in models if name in by_model)
    title = (
        f"## {setting.get('protocol', 'baseline')} protocol, lengths {setting['min_length']}-{setting['max_length']}, "
        f"{setting['minutes']:g} CPU minutes per run"
    )
    text = (
        f"Settings: {json.dumps(setting)}. Floors on the test split: chance {100 * floors['chance']:.1f}%, majority "
        f"class ({floors['majority_label']}) {100 * floors['majority']:.1f}%. Mean test length "
        f"{floors['mean_length']:.0f} tokens. Accuracy: mean ± sample sd (min-max) over seeds.{_gap(by_model)}"
    )
    how = f"One command per model (seeds differ only in `--seed`; each run `OMP_NUM_THREADS={setting['threads']}`)"
    sections = [title, text, markdown_table(headers, rows), _curves(by_model, models), f"{how}:\n\n{commands}"]
    return "\n\n".join(sections)


def report(records: list[dict], models: dict, floors_of: Callable[[dict], dict]) -> list[str]:
    """The markdown sections: one per setting (its floors, the table over seeds, the commands), then how the
    report was written. ``floors_of(setting)`` gives the chance and majority-class floors of a setting."""
    sections = []
    for runs in group_by_setting(records).values():
        setting = runs[0]["settings"]
        sections.append(_section(setting, runs, models, floors_of(setting)))
    sections.append(
        f"Report written by `{command_line()}`; the machine above is the one the report was written on; each run's "
        "load averages before and after are in the jsonl beside this file."
    )
    return sections
