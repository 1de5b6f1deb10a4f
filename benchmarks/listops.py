"""Benchmark: LRA ListOps at an equal CPU budget over seeds, every model through ``run_classification.py``.

The models of the papers' ListOps comparisons, at one small size: DLR, bidirectional with GLU (arXiv 2212.00768
Table 4 and Table 9); H3 as a pure long convolution without regularization, with Squash (λ 0.002, the paper's
ListOps value, Table 17) and with Squash and Smooth (arXiv 2302.06646 Table 1's ablation); Mamba (SeRpEnt with
no resampling branch); SeRpEnt in its ``faithful`` resampling mode (arXiv 2501.11729 Table 1); the block-diagonal
LRNN (arXiv 2309.07412); and a transformers attention baseline (BERT, bidirectional) of DLR's size (within 15%).
Each run trains for the same CPU minutes on one thread (``--max_train_minutes``, ``--torch_num_threads 1``,
CPU time of its own process, so other users of a shared machine do not shrink it), evaluates every
``--eval_every`` minutes, and ends with the validation and test accuracy.

``--protocol paper`` trains as arXiv 2212.00768 §A.6 / Table 9 does, scaled to the budget: DLR's dropout 0.2,
weight decay 0.05 on the linear maps only (none on Λ, W: ``model.optimizer_param_groups``), a linear warmup
and a cosine schedule that reaches zero as the budget ends (``--lr_over_budget``), and the test accuracy of
the checkpoint best on validation (``--load_best_model_at_end``); ``--protocol baseline`` is the earlier
setting (constant learning rate after warmup, weight decay 0.01, no dropout, the last checkpoint).
``--seeds`` trains each model once per seed (initialization and batch order; the data are ListOps seed 0).

Runs are appended to ``benchmarks/results/listops_seeds.jsonl`` as they finish (a run already there, same
model, settings and seed, is skipped) and ``benchmarks/results/listops_seeds.md`` is rebuilt from all of them,
one section per setting, mean and spread over seeds::

    python benchmarks/listops.py --minutes 1.5 --seeds 0,1,2 --models dlr,transformer
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
from _listops_report import report
from _report import RESULTS_DIR, write_report

from ssmhub.fileio import append_jsonl, read_jsonl

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "text-classification" / "run_classification.py"
NAME = "listops_seeds"
JSONL = os.path.join(RESULTS_DIR, f"{NAME}.jsonl")
WIDTH = "hidden_size=64,num_hidden_layers=2"
LONG_CONV_SHAPE = f"{WIDTH},intermediate_size=0,attention_layers=[],max_kernel_length=512"  # no attention, no MLP
ATTENTION = "num_attention_heads=4,intermediate_size=256,max_position_embeddings=512"  # DLR's size within 15%
FAITHFUL = 'resampling_rates=[0.5],resampling_mode="faithful"'  # one branch: 64 = 2 x 32 (two rates need 3 | 64)
LONG_CONV = f"{LONG_CONV_SHAPE},smooth_width"
DLR = f"{WIDTH},bidirectional=true,state_size=256,use_glu=true,dt_min=0.001"  # Table 9: GLU, dt-min 1e-3
MODELS = {  # name: (model_type, config overrides, the paper's ListOps accuracy (LRA, 500-2,000 tokens) and source)
    "dlr": ("dlr", DLR, "60.5 (DLR; S4 59.6: arXiv 2212.00768 Table 4)"),
    "transformer": ("bert", f"{WIDTH},{ATTENTION}", "36.4 (Transformer: arXiv 2212.00768 Table 4)"),
    "h3_longconv": ("h3", f"{LONG_CONV}=0,squash_lambda=0.0", "53.4 (long convs: arXiv 2302.06646 Table 1)"),
    "h3_squash": ("h3", f"{LONG_CONV}=0,squash_lambda=0.002", "60.3 (+Squash: arXiv 2302.06646 Table 1)"),
    "h3_squash_smooth": ("h3", f"{LONG_CONV}=1,squash_lambda=0.002", "59.7 (+Squash+Smooth: arXiv 2302.06646 Table 1)"),
    "mamba": ("serpent", f"{WIDTH},resampling_rates=[]", "-"),
    "serpent": ("serpent", f"{WIDTH},{FAITHFUL}", "59.60 (SeRpEnt+S4; S4 59.60: arXiv 2501.11729 Table 1)"),
    "bdlrnn": ("bdlrnn", f"{WIDTH},transition_hidden_size=64", "-"),
}
PROTOCOLS = {  # name: (run_classification.py flags, config overrides per model_type)
    "paper": (  # arXiv 2212.00768 §A.6, Table 9 (ListOps): cosine after warmup, WD 0.05, dropout 0.2, best on val
        "--lr_scheduler_type cosine --lr_over_budget --weight_decay 0.05 --save_strategy best --save_total_limit 1 "
        "--load_best_model_at_end --metric_for_best_model accuracy".split(),
        {"dlr": "dropout=0.2"},
    ),
    "baseline": (  # the earlier setting: constant after warmup, WD 0.01, no dropout, the last checkpoint
        "--lr_scheduler_type constant_with_warmup --weight_decay 0.01 --save_strategy no".split(),
        {},
    ),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--protocol", default="paper", choices=sorted(PROTOCOLS), help="the training protocol")
    parser.add_argument("--seeds", default="0", help="comma-separated training seeds (one run per model and seed)")
    parser.add_argument("--minutes", type=float, default=1.5, help="CPU minutes of training per run")
    parser.add_argument("--eval_every", type=float, default=0.25, help="CPU minutes between evaluations")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--min_length", type=int, default=20, help="ListOps length, exclusive (LRA: 500)")
    parser.add_argument("--max_length", type=int, default=150, help="ListOps length, exclusive (LRA: 2000)")
    parser.add_argument("--num_train", type=int, default=12000)
    parser.add_argument("--num_validation", type=int, default=500)
    parser.add_argument("--num_test", type=int, default=1000)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--warmup_steps", type=int, default=100)
    parser.add_argument("--runs_dir", default="runs/listops", help="where each run's output folder goes")
    parser.add_argument("--report_only", action="store_true", help="rebuild the report from the jsonl")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.models.split(",")) - set(MODELS))
    if unknown:
        parser.error(f"--models: unknown {unknown}; choose from {', '.join(MODELS)}")
    try:
        args.seed_list = [int(seed) for seed in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds: comma-separated integers expected; got {args.seeds!r}")
    return args


def settings(args) -> dict:
    """What makes runs of one model comparable, seeds aside (a run's key in the jsonl is this and its seed)."""
    keys = ("minutes", "eval_every", "threads", "min_length", "max_length", "num_train", "num_validation",
            "num_test", "batch_size", "learning_rate", "warmup_steps", "protocol")  # fmt: skip
    return {key: getattr(args, key) for key in keys}


def run_command(name: str, args, output_dir: Path, seed: int) -> list[str]:
    """The ``run_classification.py`` command line of one model, protocol and seed."""
    model_type, overrides, _ = MODELS[name]
    protocol_flags, protocol_overrides = PROTOCOLS[args.protocol]
    overrides = ",".join(filter(None, (overrides, protocol_overrides.get(model_type))))
    return [
        sys.executable, str(SCRIPT.relative_to(ROOT)), "--output_dir", str(output_dir),
        "--do_train", "--do_eval", "--model_type", model_type, "--config_overrides", overrides,
        "--listops_min_length", str(args.min_length), "--listops_max_length", str(args.max_length),
        "--listops_num_train", str(args.num_train), "--listops_num_validation", str(args.num_validation),
        "--listops_num_test", str(args.num_test), "--max_train_minutes", str(args.minutes),
        "--eval_every_minutes", str(args.eval_every), "--torch_num_threads", str(args.threads),
        "--max_steps", "1000000", "--warmup_steps", str(args.warmup_steps), *protocol_flags,
        "--learning_rate", str(args.learning_rate), "--per_device_train_batch_size", str(args.batch_size),
        "--per_device_eval_batch_size", "64", "--logging_steps", "50", "--report_to", "none",
        "--seed", str(seed), "--dataloader_num_workers", "0",
    ]  # fmt: skip


def run_one(name: str, args, seed: int) -> dict:
    """Train and evaluate one model in its own process; its record for the jsonl."""
    tag = f"{args.protocol}_{args.min_length}-{args.max_length}"
    output_dir = Path(args.runs_dir) / tag / f"{name}_seed{seed}"
    command = run_command(name, args, output_dir, seed)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    load_before = os.getloadavg()
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - start
    results = json.loads((output_dir / "all_results.json").read_text())
    state = json.loads((output_dir / "trainer_state.json").read_text())
    history = state["log_history"]
    curve = [
        (entry["train_budget_seconds"], entry["step"], entry["eval_accuracy"])
        for entry in history
        if "eval_accuracy" in entry and "train_budget_seconds" in entry
    ]
    return {
        "model": name, "settings": settings(args), "seed": seed, "command": " ".join(command[1:]),
        "parameters": count_parameters(output_dir), "steps": history[-1]["step"], "wall_seconds": round(wall, 1),
        "best_checkpoint": state.get("best_model_checkpoint"),
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
        "eval_accuracy": results["eval_accuracy"], "test_accuracy": results["test_accuracy"], "curve": curve,
    }  # fmt: skip


def count_parameters(folder: Path) -> int:
    from transformers import AutoModelForSequenceClassification

    import ssmhub  # noqa: F401  (registers the families)

    model = AutoModelForSequenceClassification.from_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def label_baselines(setting: dict) -> dict:
    """Chance (1 / classes) and the majority class's share of the test split: the floors to beat."""
    from ssmhub.data.listops import NUM_CLASSES, ListOpsSpec, listops_splits

    spec = ListOpsSpec(min_length=setting["min_length"], max_length=setting["max_length"],
                       num_train=setting["num_train"], num_validation=setting["num_validation"],
                       num_test=setting["num_test"])  # fmt: skip
    test = listops_splits(spec, seed=0)["test"]
    counts = collections.Counter(row["label"] for row in test)
    label, count = counts.most_common(1)[0]
    mean_length = sum(len(row["text"].split()) for row in test) / len(test)
    return {"chance": 1 / NUM_CLASSES, "majority": count / len(test), "majority_label": label,
            "mean_length": mean_length}  # fmt: skip


def run_missing(args) -> None:
    """Every (seed, model) run of these settings not yet in the jsonl, seeds outermost."""
    for seed in args.seed_list:
        for name in args.models.split(","):
            done = {(r["model"], r.get("seed"), json.dumps(r["settings"], sort_keys=True)) for r in read_jsonl(JSONL)}
            if (name, seed, json.dumps(settings(args), sort_keys=True)) in done:  # another invocation may fill it
                print(f"{name} seed {seed}: already in {JSONL}, skipped", flush=True)
                continue
            try:
                record = run_one(name, args, seed)
            except subprocess.CalledProcessError as error:  # one failed run does not stop the others
                print(f"{name} seed {seed}: failed ({error}); not recorded", flush=True)
                continue
            append_jsonl(JSONL, record)
            print(json.dumps({k: record[k] for k in ("model", "seed", "steps", "eval_accuracy", "test_accuracy")}))


def main(argv=None) -> None:
    args = parse_args(argv)
    if not args.report_only:
        run_missing(args)
    records = read_jsonl(JSONL)
    sections = report(records, MODELS, label_baselines)
    path = write_report(NAME, "LRA ListOps at an equal CPU budget, over seeds and lengths", sections)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
