"""Does SeRpEnt improve its base? Causal SeRpEnt (additive branches) against Mamba at equal parameters (issue 53).

The paper reports SeRpEnt 1.2 top-1 points above Mamba on WikiText-103 (arXiv 2501.11729 Table 2: 38.3 vs 37.1).
This script trains, with the same trainer, data, tokenizer, token budget, batch and schedule, one CPU thread each,
one after the other, for each seed of ``--seeds``:

- ``mamba``: SeRpEnt without resampling branches (exactly Mamba), its width chosen so that its parameters equal
  ``serpent``'s within 2% (:func:`equal_parameter_width`);
- ``serpent``: SeRpEnt with the default ``branch_layout="additive"``: the base a whole Mamba of width H, plus
  branches κ = 0.5 and κ = 0.1 of width H/8 (K = 10), causal;
- ``serpent-nocompress``: the κ = 1 ablation (both branches κ = 1: a grid point per token, no compression).

and, with ``--finetune-steps N``, the fine-tune study: the ``mamba`` of ``--finetune-seed`` trained above, then N more
steps either as it is (``mamba+ft``) or with branches added by ``SerpentForCausalLM.from_mamba``
(``mamba+branches+ft``), the same schedule and data for both. Every model is scored by ``ssmhub-eval``'s code
(validation and test perplexity, top-1 and top-5 accuracy, as Table 2); each trained SeRpEnt is scored again
with its branches' output projections zeroed (the base alone, :func:`branch_ablation`). Training time per token is
``time.process_time()`` of the median step (one torch thread), so other jobs on a shared machine change it little.

Data: the WikiText-103 train slice of the data folder (about 0.7M BPE tokens; ``--tokens`` beyond it are further
passes over it), the shared byte-level BPE of :mod:`serpent_lm_fidelity`.

Run::

    python benchmarks/serpent_vs_mamba_lm.py --data-dir "$SSMHUB_DATA_DIR" --probe 3
    python benchmarks/serpent_vs_mamba_lm.py --data-dir "$SSMHUB_DATA_DIR" --tokens 1000000 --seeds 0 1 \
        --finetune-steps 100 --reuse
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import markdown_table, write_report
from _scoring import score_stream
from serpent_lm_fidelity import (
    final_losses,
    parameter_split,
    shared_tokenizer,
    slice_data_dir,
    train_timed,
    wikitext103_config,
)

BRANCHES = {"resampling_rates": [0.5, 0.1], "resampling_window": 10, "branch_layout": "additive"}
NOCOMPRESS = {**BRANCHES, "resampling_rates": [1.0, 1.0]}
FROM_SCRATCH = ("mamba", "serpent", "serpent-nocompress")
FINETUNED = ("mamba+ft", "mamba+branches+ft")
RECORD = "record.json"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--data-dir", default=os.environ.get("SSMHUB_DATA_DIR"), help="the shared data folder")
    p.add_argument("--work-dir", default="runs/serpent_vs_mamba_lm")
    p.add_argument("--models", nargs="+", default=list(FROM_SCRATCH), choices=FROM_SCRATCH)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--hidden-size", type=int, default=128, help="SeRpEnt's width H (Mamba's follows)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", type=int, default=1_000_000, help="training tokens per model")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--learning-rate", type=float, default=2e-3)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--finetune-steps", type=int, default=0, help="the fine-tune study's steps (0: none)")
    p.add_argument("--finetune-seed", type=int, default=None, help="whose trained mamba it starts from (first seed)")
    p.add_argument("--max-documents", type=int, default=15, help="score each split's first N articles")
    p.add_argument("--probe", type=int, default=0, help="train N steps of each model, print CPU s/step, stop")
    p.add_argument("--reuse", action="store_true", help="keep a model whose record has these settings")
    p.add_argument("--name", default="serpent_vs_mamba_lm", help="results/<name>.md")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--how", default="", help="a note on how the kept records were trained (e.g. in parallel)")
    args = p.parse_args(argv)
    if not args.data_dir:
        p.error("--data-dir (or $SSMHUB_DATA_DIR) is required: the folder with wikitext-103/")
    args.steps = max(1, args.tokens // (args.batch_size * args.seq_len))
    if args.finetune_seed is None:
        args.finetune_seed = args.seeds[0]
    return args


def parameters_of(model_config: dict) -> int:
    """Parameters of a SeRpEnt causal LM built from ``model_config`` (tied embeddings count once)."""
    from ssmhub.models.serpent import SerpentConfig, SerpentForCausalLM

    model = SerpentForCausalLM(SerpentConfig(**model_config))
    return sum(p.numel() for p in model.parameters())


def equal_parameter_width(target: int, base: dict) -> int:
    """The Mamba width (``base`` without branches) whose parameter count is nearest ``target``."""
    widths = range(8, 4096, 2)
    low, high = 0, len(widths) - 1
    while low < high:  # parameters grow with the width: the first width at or above the target
        middle = (low + high) // 2
        low, high = (
            (middle + 1, high) if parameters_of({**base, "hidden_size": widths[middle]}) < target else (low, middle)
        )
    near = [widths[max(low - 1, 0)], widths[low]]
    return min(near, key=lambda w: abs(parameters_of({**base, "hidden_size": w}) - target))


def model_configs(args) -> dict[str, dict]:
    """Every from-scratch model's config: SeRpEnt at ``--hidden-size``, Mamba at equal parameters."""
    common = {"vocab_size": args.vocab_size, "num_hidden_layers": args.layers}
    serpent = {**common, "hidden_size": args.hidden_size, **BRANCHES}
    width = equal_parameter_width(parameters_of(serpent), {**common, "resampling_rates": []})
    return {
        "mamba": {**common, "hidden_size": width, "resampling_rates": []},
        "serpent": serpent,
        "serpent-nocompress": {**common, "hidden_size": args.hidden_size, **NOCOMPRESS},
    }


def settings(args) -> dict:
    """What makes two records comparable (``--reuse`` keeps a record only if they match)."""
    keys = ("hidden_size", "layers", "steps", "batch_size", "seq_len", "learning_rate", "vocab_size")
    return {key: getattr(args, key) for key in keys} | {"max_documents": args.max_documents}


def train_config(args, output_dir: Path, data_dir: Path, tokenizer: Path, seed: int, steps: int, **model):
    """The TrainConfig of one run: ``model`` is ``model_config=...`` or ``model_name_or_path=...``."""
    tenth = max(1, steps // 10)
    options = {"max_eval_windows": 16, "warmup_steps": tenth, "logging_steps": tenth, "seed": seed, **model}
    return wikitext103_config(args, output_dir, data_dir, tokenizer, steps, **options)


def score(args, folder: Path, data_dir: Path, splits=("validation", "test")) -> dict:
    """Validation and test scores of the model in ``folder`` (ssmhub-eval's code, one stream per split)."""
    scores = {}
    for split in splits:
        result = score_stream(str(folder), "wikitext-103", split, 512, 512, 4, str(data_dir), args.max_documents)
        scores[split] = {
            "loss": result["nll_per_token"],
            "perplexity": result["token_perplexity"],
            "top1": result["top1_accuracy"],
            "top5": result["top5_accuracy"],
            "tokens": result.get("num_tokens"),
        }
    return scores


def run(args, name: str, seed: int, folder: Path, config, data_dir: Path, extra: dict) -> dict:
    """Train (unless a matching record is kept with ``--reuse``) and score one model: its record."""
    record_path = folder / RECORD
    if args.reuse and record_path.is_file():
        record = json.loads(record_path.read_text(encoding="utf-8"))
        if record["settings"] == settings(args) | extra:
            print(f"{name} seed {seed}: reusing {record_path}", flush=True)
            return record
    timing = train_timed(config)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder))
    record = {"name": name, "seed": seed, "settings": settings(args) | extra, **timing}
    record |= {"parameters": sum(p.numel() for p in model.parameters()), "steps": config.max_steps}
    record |= {"tokens": config.max_steps * args.batch_size * args.seq_len, "parameter_split": parameter_split(model)}
    record |= final_losses(folder) | {"scores": score(args, folder, data_dir)}
    record_path.write_text(json.dumps(record, indent=1), encoding="utf-8")
    print(f"{name} seed {seed}: {json.dumps(record['scores'])}", flush=True)
    return record


def from_scratch(args, configs, data_dir, tokenizer) -> list[dict]:
    records = []
    for seed in args.seeds:
        for name in args.models:
            folder = Path(args.work_dir) / f"{name}-seed{seed}"
            config = train_config(args, folder, data_dir, tokenizer, seed, args.steps, model_config=configs[name])
            records.append(run(args, name, seed, folder, config, data_dir, {"model_config": configs[name]}))
    return records


def finetune(args, data_dir, tokenizer) -> list[dict]:
    """A trained Mamba (``--finetune-seed``'s) fine-tuned ``--finetune-steps`` more, as it is and with branches
    (``from_mamba``)."""
    from ssmhub import SerpentForCausalLM

    mamba = Path(args.work_dir) / f"mamba-seed{args.finetune_seed}"
    with_branches = Path(args.work_dir) / "mamba+branches-start"
    SerpentForCausalLM.from_mamba(str(mamba), **BRANCHES).save_pretrained(with_branches)
    records, extra = [], {"finetune_steps": args.finetune_steps}
    for name, start in zip(FINETUNED, (mamba, with_branches)):
        folder = Path(args.work_dir) / name
        config = train_config(
            args, folder, data_dir, tokenizer, args.finetune_seed, args.finetune_steps, model_name_or_path=str(start)
        )
        records.append(run(args, name, args.finetune_seed, folder, config, data_dir, extra))
    return records


def branch_ablation(args, records: list[dict], data_dir: Path) -> str:
    """Each trained SeRpEnt scored on validation with and without its branches (every ``output_proj`` zeroed after
    training: what the resampling branches add to their base): a table."""
    from ssmhub import SerpentForCausalLM

    rows = []
    for r in records:
        if r["name"] not in FROM_SCRATCH[1:]:
            continue
        folder = Path(args.work_dir) / f"{r['name']}-seed{r['seed']}"
        with tempfile.TemporaryDirectory(prefix="serpent_ablation.") as base_only:
            shutil.copytree(folder, base_only, dirs_exist_ok=True, ignore=shutil.ignore_patterns("checkpoints"))
            model = SerpentForCausalLM.from_pretrained(str(folder))
            for name, parameter in model.named_parameters():
                if name.endswith("output_proj.weight"):
                    parameter.data.zero_()
            model.save_pretrained(base_only)
            alone = score(args, Path(base_only), data_dir, splits=("validation",))["validation"]
        full = r["scores"]["validation"]
        rows.append([f"`{r['name']}`", r["seed"], f"{full['loss']:.4f}", f"{alone['loss']:.4f}"])
        rows[-1] += [f"{full['loss'] - alone['loss']:+.4f}", f"{100 * full['top1']:.2f}", f"{100 * alone['top1']:.2f}"]
    headers = ["model", "seed", "validation loss", "branches zeroed", "change by the branches", "top-1 %"]
    return markdown_table([*headers, "top-1 %, branches zeroed"], rows)


def probe(args, configs, data_dir, tokenizer) -> None:
    for name in args.models:
        folder = Path(args.work_dir) / "probe" / name
        config = train_config(args, folder, data_dir, tokenizer, 0, args.probe, model_config=configs[name])
        step_s = train_timed(config)["step_cpu_s"]
        tokens_per_s = args.batch_size * args.seq_len / step_s
        print(
            f"{name}: {parameters_of(configs[name]) / 1e6:.3f}M params, {step_s:.3f} CPU s/step, {tokens_per_s:.0f} "
            f"tokens/CPU s -> {args.tokens:,} tokens ≈ {args.tokens / tokens_per_s / 60:.1f} CPU min",
            flush=True,
        )


# ----------------------------------------------------------------------------------------------------- the report
def results_table(records: list[dict]) -> str:
    headers = ["model", "seed", "params", "tokens", "CPU ms/step", "CPU µs/token", "final train loss", "split"]
    headers += ["loss (nats/token)", "token ppl", "top-1 %", "top-5 %"]
    rows = []
    for r in records:
        per_token = 1e6 * r["step_cpu_s"] / (r["tokens"] / r["steps"])
        for split, s in r["scores"].items():
            facts = [f"`{r['name']}`", r["seed"], f"{r['parameters'] / 1e6:.3f}M", f"{r['tokens']:,}"]
            facts += [f"{1e3 * r['step_cpu_s']:.0f}", f"{per_token:.1f}", f"{r['final_train_loss']:.3f}", split]
            rows.append([*facts, f"{s['loss']:.4f}", f"{s['perplexity']:.2f}", f"{100 * s['top1']:.2f}"])
            rows[-1].append(f"{100 * s['top5']:.2f}")
    return markdown_table(headers, rows)


def means(records: list[dict], name: str, split: str) -> dict | None:
    """Mean over seeds of one model's scores on ``split`` and of its CPU seconds per step."""
    own = [r for r in records if r["name"] == name]
    if not own:
        return None
    mean = {key: statistics.mean(r["scores"][split][key] for r in own) for key in ("perplexity", "top1", "top5")}
    return mean | {"step_cpu_s": statistics.mean(r["step_cpu_s"] for r in own), "seeds": len(own)}


def verdict(records: list[dict]) -> str:
    """The issue's two targets, met or missed, and the ablation, from the validation means."""
    mamba, serpent, nocompress = (means(records, n, "validation") for n in FROM_SCRATCH)
    if not (mamba and serpent):
        return "- (mamba and serpent are not both in this report: no verdict)"
    gap = 100 * (serpent["top1"] - mamba["top1"])
    time_ratio = serpent["step_cpu_s"] / mamba["step_cpu_s"]
    lines = [
        f"- Validation, mean over {serpent['seeds']} seed(s): serpent {serpent['perplexity']:.2f} ppl / "
        f"{100 * serpent['top1']:.2f}% top-1, mamba {mamba['perplexity']:.2f} ppl / {100 * mamba['top1']:.2f}%: "
        f"top-1 {gap:+.2f} points. Target top-1 ≥ Mamba's: **{'met' if gap >= 0 else 'missed'}**.",
        f"- Training CPU time per token, serpent / mamba: {time_ratio:.2f}× (median step, mean over seeds). "
        f"Target ≤ 1.15×: **{'met' if time_ratio <= 1.15 else 'missed'}**.",
    ]
    if nocompress:
        lines.append(
            f"- κ = 1 ablation: {nocompress['perplexity']:.2f} ppl / {100 * nocompress['top1']:.2f}% top-1, "
            f"{nocompress['step_cpu_s'] / mamba['step_cpu_s']:.2f}× Mamba's time per token."
        )
    tuned = {n: means(records, n, "validation") for n in FINETUNED}
    if all(tuned.values()):
        plain, branched = tuned["mamba+ft"], tuned["mamba+branches+ft"]
        lines.append(
            f"- Fine-tune study: mamba+branches+ft {branched['perplexity']:.2f} ppl / {100 * branched['top1']:.2f}% "
            f"top-1 vs mamba+ft {plain['perplexity']:.2f} ppl / {100 * plain['top1']:.2f}% "
            f"({100 * (branched['top1'] - plain['top1']):+.2f} points)."
        )
    return "\n".join(lines)


def notes(args, configs: dict, wall_s: float) -> str:
    return "\n".join(
        [
            f"- Training: `ssmhub.training.train` on the WikiText-103 train slice (`wiki.train.tokens.head`; about "
            f"160 articles, ~0.7M tokens: never a WikiText-103 result), BPE of {args.vocab_size}, AdamW lr "
            f"{args.learning_rate:g}, weight decay 0.1, warmup 10% of the steps, cosine to 10%, batch "
            f"{args.batch_size} × {args.seq_len}, {args.steps} steps ({args.steps * args.batch_size * args.seq_len:,} "
            f"tokens) per from-scratch model, seeds {args.seeds}, 1 torch thread, one run after the other.",
            f"- Fine-tune study: {args.finetune_steps} steps from the seed-{args.finetune_seed} `mamba`, same schedule "
            "shape (warmup 10%, cosine), data order of that seed."
            if args.finetune_steps
            else "- No fine-tune study.",
            f"- Scored with ssmhub-eval's code on the first {args.max_documents} articles of the official validation "
            "and test splits, each one stream, windows of 512, stride 512.",
            "- Model configs (`model_type serpent`): "
            + "; ".join(f"`{n}` `{json.dumps(c)}`" for n, c in configs.items()),
            f"- Whole script wall time: {wall_s:.0f} s (records kept with `--reuse` cost none of it).",
        ]
        + ([f"- How the kept records were trained: {args.how}"] if args.how else [])
    )


def parameter_table(records: list[dict]) -> str:
    seen, rows = set(), []
    for r in records:
        if r["name"] in seen:
            continue
        seen.add(r["name"])
        split = r["parameter_split"]
        total = sum(split.values()) or 1
        rows.append([f"`{r['name']}`", *(f"{n / 1e6:.3f}M ({100 * n / total:.0f}%)" for n in split.values())])
    return markdown_table(["model", *records[0]["parameter_split"]], rows)


def main(argv=None) -> int:
    import torch

    import ssmhub.evaluation.cli  # noqa: F401  (imported now: the code that scores is the code that trained)

    args = parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    work_dir = Path(args.work_dir)
    data_dir = slice_data_dir(args.data_dir, work_dir)
    tokenizer = shared_tokenizer(data_dir, work_dir, args.vocab_size)
    configs = model_configs(args)
    if args.probe:
        probe(args, configs, data_dir, tokenizer)
        return 0
    records = from_scratch(args, configs, data_dir, tokenizer)
    if args.finetune_steps:
        records += finetune(args, data_dir, tokenizer)
    sections = [
        "## Results\n\n" + results_table(records),
        "## Where the parameters are\n\n" + parameter_table(records),
        "## What the branches add (zeroed after training)\n\n" + branch_ablation(args, records, data_dir),
        "## Reading\n\n" + verdict(records),
        "## Notes\n\n" + notes(args, configs, time.perf_counter() - start),
    ]
    print("\n\n".join(sections))
    if not args.no_write:
        title = "Causal SeRpEnt (additive branches) against Mamba at equal parameters"
        print(f"\nwrote {write_report(args.name, title, sections)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
