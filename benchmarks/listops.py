"""Benchmark: LRA ListOps at an equal CPU budget, every model through ``run_classification.py`` of ``examples/``.

The models of the papers' ListOps comparisons, at one small size: DLR, bidirectional (arXiv 2212.00768
Table 4); H3 as a pure long convolution without regularization, with Squash (λ 0.002, the paper's ListOps
value, Table 17) and with Squash and Smooth (arXiv 2302.06646 Table 1's ablation); Mamba (SeRpEnt with
no resampling branch); SeRpEnt in its ``faithful`` resampling mode (arXiv 2501.11729 Table 1); and a
transformers attention baseline (BERT, bidirectional) of about the same size.
Each run trains for the same CPU minutes on one thread (``--max_train_minutes``, ``--torch_num_threads 1``,
CPU time of its own process, so other users of a shared machine do not shrink it), evaluates every
``--eval_every`` minutes, and ends with the validation and test accuracy.

Runs are appended to ``benchmarks/results/listops.jsonl`` as they finish (a run already there, same model
and settings, is skipped) and ``benchmarks/results/listops.md`` is rebuilt from all of them::

    python benchmarks/listops.py --minutes 6  # every model; --models dlr,transformer for some
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import RESULTS_DIR, command_line, markdown_table, write_report

from ssmhub.fileio import append_jsonl, read_jsonl

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "text-classification" / "run_classification.py"
JSONL = os.path.join(RESULTS_DIR, "listops.jsonl")
WIDTH = "hidden_size=64,num_hidden_layers=2"
LONG_CONV_SHAPE = f"{WIDTH},intermediate_size=0,attention_layers=[],max_kernel_length=256"  # no attention, no MLP
ATTENTION = "num_attention_heads=4,intermediate_size=128,max_position_embeddings=512"
FAITHFUL = 'resampling_rates=[0.5],resampling_mode="faithful"'  # one branch: 64 = 2 x 32 (two rates need 3 | 64)
LONG_CONV = f"{LONG_CONV_SHAPE},smooth_width"
MODELS = {  # name: (model_type, config overrides, the paper's ListOps accuracy (LRA, 500-2,000 tokens) and source)
    "dlr": ("dlr", f"{WIDTH},bidirectional=true,state_size=256", "60.5 (DLR; S4 59.6: arXiv 2212.00768 Table 4)"),
    "h3_longconv": ("h3", f"{LONG_CONV}=0,squash_lambda=0.0", "53.4 (long convs: arXiv 2302.06646 Table 1)"),
    "h3_squash": ("h3", f"{LONG_CONV}=0,squash_lambda=0.002", "60.3 (+Squash: arXiv 2302.06646 Table 1)"),
    "transformer": ("bert", f"{WIDTH},{ATTENTION}", "36.4 (Transformer: arXiv 2212.00768 Table 4)"),
    "mamba": ("serpent", f"{WIDTH},resampling_rates=[]", "-"),
    "serpent": ("serpent", f"{WIDTH},{FAITHFUL}", "59.60 (SeRpEnt+S4; S4 59.60: arXiv 2501.11729 Table 1)"),
    "h3_squash_smooth": ("h3", f"{LONG_CONV}=1,squash_lambda=0.002", "59.7 (+Squash+Smooth: arXiv 2302.06646 Table 1)"),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--minutes", type=float, default=6.0, help="CPU minutes of training per run")
    parser.add_argument("--eval_every", type=float, default=1.0, help="CPU minutes between evaluations")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--min_length", type=int, default=20, help="ListOps length, exclusive (LRA: 500)")
    parser.add_argument("--max_length", type=int, default=150, help="ListOps length, exclusive (LRA: 2000)")
    parser.add_argument("--num_train", type=int, default=20000)
    parser.add_argument("--num_validation", type=int, default=500)
    parser.add_argument("--num_test", type=int, default=1000)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--runs_dir", default="runs/listops", help="where each run's output folder goes")
    parser.add_argument("--report_only", action="store_true", help="rebuild the report from the jsonl")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.models.split(",")) - set(MODELS))
    if unknown:
        parser.error(f"--models: unknown {unknown}; choose from {', '.join(MODELS)}")
    return args


def settings(args) -> dict:
    """What makes two runs of one model comparable (the key of a run in the jsonl)."""
    keys = ("minutes", "eval_every", "threads", "min_length", "max_length", "num_train", "num_validation",
            "num_test", "batch_size", "learning_rate")  # fmt: skip
    return {key: getattr(args, key) for key in keys}


def run_command(name: str, args, output_dir: Path) -> list[str]:
    """The ``run_classification.py`` command line of one model."""
    model_type, overrides, _ = MODELS[name]
    return [
        sys.executable, str(SCRIPT.relative_to(ROOT)), "--output_dir", str(output_dir),
        "--do_train", "--do_eval", "--model_type", model_type, "--config_overrides", overrides,
        "--listops_min_length", str(args.min_length), "--listops_max_length", str(args.max_length),
        "--listops_num_train", str(args.num_train), "--listops_num_validation", str(args.num_validation),
        "--listops_num_test", str(args.num_test), "--max_train_minutes", str(args.minutes),
        "--eval_every_minutes", str(args.eval_every), "--torch_num_threads", str(args.threads),
        "--max_steps", "1000000", "--lr_scheduler_type", "constant_with_warmup", "--warmup_steps", "100",
        "--learning_rate", str(args.learning_rate), "--weight_decay", "0.01",
        "--per_device_train_batch_size", str(args.batch_size), "--per_device_eval_batch_size", "64",
        "--save_strategy", "no", "--logging_steps", "50", "--report_to", "none", "--seed", "0",
        "--dataloader_num_workers", "0",
    ]  # fmt: skip


def run_one(name: str, args) -> dict:
    """Train and evaluate one model in its own process; its record for the jsonl."""
    output_dir = Path(args.runs_dir) / name
    command = run_command(name, args, output_dir)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    load_before = os.getloadavg()
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - start
    results = json.loads((output_dir / "all_results.json").read_text())
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    curve = [
        (entry["train_budget_seconds"], entry["step"], entry["eval_accuracy"])
        for entry in history
        if "eval_accuracy" in entry and "train_budget_seconds" in entry
    ]
    return {
        "model": name, "settings": settings(args), "command": " ".join(command[1:]),
        "parameters": count_parameters(output_dir), "steps": history[-1]["step"], "wall_seconds": round(wall, 1),
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
        "eval_accuracy": results["eval_accuracy"], "test_accuracy": results["test_accuracy"], "curve": curve,
    }  # fmt: skip


def count_parameters(folder: Path) -> int:
    from transformers import AutoModelForSequenceClassification

    import ssmhub  # noqa: F401  (registers the families)

    model = AutoModelForSequenceClassification.from_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def label_baselines(args) -> dict:
    """Chance (1 / classes) and the majority class's share of the test split: the floors to beat."""
    from ssmhub.data.listops import NUM_CLASSES, ListOpsSpec, listops_splits

    spec = ListOpsSpec(min_length=args.min_length, max_length=args.max_length, num_train=args.num_train,
                       num_validation=args.num_validation, num_test=args.num_test)  # fmt: skip
    test = listops_splits(spec, seed=0)["test"]
    counts = collections.Counter(row["label"] for row in test)
    label, count = counts.most_common(1)[0]
    mean_length = sum(len(row["text"].split()) for row in test) / len(test)
    return {"chance": 1 / NUM_CLASSES, "majority": count / len(test), "majority_label": label,
            "mean_length": mean_length}  # fmt: skip


def report(records: list[dict], args, baselines: dict) -> str:
    """The markdown sections: settings and floors, results, curves, commands."""
    rows = [
        [r["model"], MODELS[r["model"]][0], f"{r['parameters']:,}", r["steps"], f"{r['settings']['minutes']:g}",
         f"{r['wall_seconds'] / 60:.1f}", f"{100 * r['eval_accuracy']:.1f}", f"{100 * r['test_accuracy']:.1f}",
         MODELS[r["model"]][2]]
        for r in records
    ]  # fmt: skip
    headers = ["model", "model_type", "parameters", "steps", "CPU min (budget)", "wall min (whole run)",
               "validation acc %", "test acc %", "paper (LRA, 500-2,000 tokens)"]  # fmt: skip
    points = sorted({round(t / 60, 1) for r in records for t, _, _ in r["curve"]})
    curve_rows = [
        [r["model"], *(next((f"{100 * a:.1f}" for t, _, a in r["curve"] if round(t / 60, 1) == p), "") for p in points)]
        for r in records
    ]
    floors = (
        f"Floors on the test split: chance {100 * baselines['chance']:.1f}%, majority class "
        f"({baselines['majority_label']}) {100 * baselines['majority']:.1f}%. Mean test length "
        f"{baselines['mean_length']:.0f} tokens."
    )
    commands = "\n".join(f"- {r['model']}: `python {r['command']}` (load average before {r['load_before']}, "
                         f"after {r['load_after']})" for r in records)  # fmt: skip
    return [
        f"Settings: {json.dumps(settings(args))}. {floors}",
        markdown_table(headers, rows),
        "Validation accuracy (%) over training CPU minutes:\n\n"
        + markdown_table(["model", *(f"{p:g} min" for p in points)], curve_rows),
        f"Commands (each run: `OMP_NUM_THREADS={args.threads}`, its own process):\n\n{commands}",
        f"Report written by `{command_line()}`; the machine above is the one the report was written on, the "
        "load averages beside each command are the ones its run saw.",
    ]


def main(argv=None) -> None:
    args = parse_args(argv)
    key = json.dumps(settings(args), sort_keys=True)
    if not args.report_only:
        for name in args.models.split(","):
            done = {(r["model"], json.dumps(r["settings"], sort_keys=True)) for r in read_jsonl(JSONL)}
            if (name, key) in done:  # read before each run: another invocation may be filling the same file
                print(f"{name}: already in {JSONL}, skipped", flush=True)
                continue
            record = run_one(name, args)
            append_jsonl(JSONL, record)
            print(json.dumps({k: record[k] for k in ("model", "steps", "eval_accuracy", "test_accuracy")}), flush=True)
    records = [r for r in read_jsonl(JSONL) if json.dumps(r["settings"], sort_keys=True) == key]
    path = write_report("listops", "LRA ListOps at an equal CPU budget", report(records, args, label_baselines(args)))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
