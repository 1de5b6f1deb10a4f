"""Language-model quality of models trained by the same trainer: perplexity and accuracy on WikiText.

What is measured
----------------
Each ``--models`` folder is a run of ``ssmhub-train`` (any family, e.g. H3 and transformers' GPT-2 with the
same data, tokenizer, steps, batch and schedule). Every model is scored by ``ssmhub-eval``'s own code
(:func:`ssmhub.evaluation.cli.run_evaluation`: the split as one stream, windows of ``--max-length`` tokens
advancing by ``--stride``, exact NLL sums) on each ``--splits`` split. The table also lists what the runs
had in common or not: parameters, optimizer steps, tokens seen, and the training wall time from each run's
``metrics.jsonl``.

The training commands of each comparison are in ``TRAINING_COMMANDS`` below and printed into the results
file: ``--comparison issue5`` (H3 vs GPT-2, the long-conv paper's Table 7 direction at small scale) and
``--comparison issue7`` (SeRpEnt with base + κ = 0.5 + κ = 0.1 branches vs plain Mamba at equal parameter
count, the SeRpEnt paper's Table 2 columns: loss, perplexity, top-1 and top-5).

Run: ``python benchmarks/lm_quality.py --models runs/h3-wt2 runs/gpt2-wt2`` and
``python benchmarks/lm_quality.py --comparison issue7 --name serpent_quality --models runs/serpent-wt2 runs/mamba-wt2``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import markdown_table, write_report
from _scoring import score_stream

from ssmhub.fileio import read_jsonl

_COMMON = "--seq_len 512 --per_device_train_batch_size 8 --max_steps 1000 --eval_steps 250 --save_steps 250"
H3_SIZE = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "intermediate_size": 1024,
    "attention_layers": [],
    "max_kernel_length": 512,
}
GPT2_SIZE = {"n_embd": 256, "n_layer": 4, "n_head": 4, "n_inner": 1024, "n_positions": 512}
GPT2_SIZE.update({"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0})
_ISSUE7_COMMON = (
    "--seq_len 512 --per_device_train_batch_size 8 --max_steps 600 --warmup_steps 60 --eval_steps 300 --save_steps 300"
)
# SeRpEnt 255 = 3 × 85 wide (the paper: 510 = 3 × 170); Mamba 304 wide has the same parameter count (±1.3%)
SERPENT_SIZE = {  # the paper's concatenated layout, the default when these runs were made (issue 7)
    "hidden_size": 255,
    "num_hidden_layers": 4,
    "resampling_rates": [0.5, 0.1],
    "resampling_window": 10,
    "branch_layout": "concatenated",
}
MAMBA_SIZE = {"hidden_size": 304, "num_hidden_layers": 4, "resampling_rates": []}
# ablations: window K = 5 at width 300 = 3 × 100 (parameters and width both ≈ Mamba's), and the paper's own
# protocol (Table 2: SeRpEnt about as wide as Mamba, more parameters): width 303 = 3 × 101, K = 10
SERPENT_K5_SIZE = {**SERPENT_SIZE, "hidden_size": 300, "resampling_window": 5}
SERPENT_WIDE_SIZE = {**SERPENT_SIZE, "hidden_size": 303}
TRAINING_COMMANDS = {
    "issue5": (
        "the issue-5 H3 vs GPT-2 runs (WikiText-2, the trainer's byte-level BPE of 4096 tokens, AdamW lr 1e-3, "
        "warmup 100, cosine to 10%, batch 8 × 512 tokens, one CPU thread each)",
        [
            f"ssmhub-train --output_dir runs/h3-wt2 --model_type h3 --model_config '{json.dumps(H3_SIZE)}' {_COMMON}",
            f"ssmhub-train --output_dir runs/gpt2-wt2 --model_type gpt2 --model_config '{json.dumps(GPT2_SIZE)}' "
            f"{_COMMON}",
        ],
    ),
    "issue7": (
        "the issue-7 SeRpEnt vs Mamba runs (WikiText-2, the trainer's byte-level BPE of 4096 tokens, AdamW lr 1e-3, "
        "weight decay 0.1, warmup 60, cosine to 10%, batch 8 × 512 tokens, 600 steps, one CPU thread each, two "
        "runs at a time; the last two are the ablations: K = 5 at width 300, parameters and width ≈ Mamba's, and "
        "the paper's protocol, width ≈ Mamba's with K = 10 and 36% more parameters)",
        [
            f"ssmhub-train --output_dir runs/serpent-wt2 --model_type serpent --model_config "
            f"'{json.dumps(SERPENT_SIZE)}' {_ISSUE7_COMMON}",
            f"ssmhub-train --output_dir runs/mamba-wt2 --model_type serpent --model_config "
            f"'{json.dumps(MAMBA_SIZE)}' {_ISSUE7_COMMON}",
            f"ssmhub-train --output_dir runs/serpent300k5-wt2 --model_type serpent --model_config "
            f"'{json.dumps(SERPENT_K5_SIZE)}' {_ISSUE7_COMMON}",
            f"ssmhub-train --output_dir runs/serpent303k10-wt2 --model_type serpent --model_config "
            f"'{json.dumps(SERPENT_WIDE_SIZE)}' {_ISSUE7_COMMON}",
        ],
    ),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--models", nargs="+", required=True, help="folders written by ssmhub-train")
    p.add_argument("--dataset", default="wikitext-2")
    p.add_argument("--splits", nargs="+", default=["validation", "test"])
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--stride", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--data-dir", default=None, help="default: $SSMHUB_DATA_DIR")
    p.add_argument("--name", default="lm_quality", help="results/<name>.md")
    p.add_argument(
        "--comparison", choices=sorted(TRAINING_COMMANDS), default="issue5", help="whose training commands to list"
    )
    p.add_argument("--no-write", action="store_true", help="print only; do not write the results file")
    return p.parse_args(argv)


def run_facts(folder: str) -> dict:
    """Family, parameters, steps, tokens and training wall time of an ssmhub-train folder."""
    import transformers

    import ssmhub  # noqa: F401  (registers the families)

    with open(os.path.join(folder, "train_config.json"), encoding="utf-8") as f:
        train_config = json.load(f)
    rows = read_jsonl(os.path.join(folder, "metrics.jsonl"))
    train_rows = [r for r in rows if r.get("split") == "train"]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    overrides = train_config.get("model_config") or {}
    variant = f" {overrides['resampling_rates']}" if "resampling_rates" in overrides else ""
    if overrides.get("resampling_rates"):
        variant += f" H={model.config.hidden_size} K={model.config.resampling_window}"
    return {
        "family": train_config["model_type"] + variant,
        "parameters": sum(p.numel() for p in model.parameters()),
        "steps": train_rows[-1]["step"] if train_rows else 0,
        "tokens": train_rows[-1]["tokens_seen"] if train_rows else 0,
        "train_s": max((r.get("elapsed_s") or 0) for r in rows) if rows else 0.0,
        "seq_len": train_config["seq_len"],
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    rows = []
    for folder in args.models:
        facts = run_facts(folder)
        for split in args.splits:
            result = score_stream(
                folder, args.dataset, split, args.max_length, args.stride, args.batch_size, args.data_dir
            )
            row = [
                f"`{folder}`",
                facts["family"],
                f"{facts['parameters'] / 1e6:.2f}M",
                facts["steps"],
                f"{facts['tokens']:,}",
                f"{facts['train_s'] / 60:.0f}",
                split,
                f"{result['nll_per_token']:.4f}",
                f"{result['token_perplexity']:.2f}",
                f"{100 * result['top1_accuracy']:.2f}",
                f"{100 * result['top5_accuracy']:.2f}",
            ]
            rows.append(row)
            print("  " + " | ".join(str(c) for c in row), flush=True)
    headers = [
        "model",
        "family",
        "params",
        "steps",
        "tokens seen",
        "train min",
        "split",
        "loss (nats/token)",
        "token ppl",
        "top-1 %",
        "top-5 %",
    ]
    table = markdown_table(headers, rows)
    notes = "\n".join(
        [
            f"- Scored with ssmhub-eval's code on {args.dataset}, each split as one stream, windows of "
            f"{args.max_length} tokens, stride {args.stride}.",
            "- `train min`: the runs' own elapsed time (CPU, shared machine, other jobs running): not a speed "
            "comparison; see train_throughput*.md for that.",
            f"- Whole script wall time: {time.perf_counter() - start:.0f} s.",
            f"- Training commands of {TRAINING_COMMANDS[args.comparison][0]}:",
            "",
            "```",
            *TRAINING_COMMANDS[args.comparison][1],
            "```",
        ]
    )
    print()
    print(table)
    print()
    print(notes)
    if not args.no_write:
        path = write_report(
            args.name,
            "Language-model quality, same trainer, data and steps",
            ["## Results\n\n" + table, "## Notes\n\n" + notes],
        )
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
