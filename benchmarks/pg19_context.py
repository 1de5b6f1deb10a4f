"""The PG-19 context curve: perplexity by position in the book, recurrent models evaluated statefully vs GPT-2.

What is measured (issue 26 §4)
------------------------------
Small causal LMs (≈ 5M parameters) trained on the PG-19 train books with one byte-level BPE (trained here on
those books, ``--vocab-size`` tokens) and the same number of training tokens each (``--max-steps`` ×
``--batch-size`` × ``--seq-len``), by ``ssmhub-train`` on the CPU:

- DLR, H3 (pure long convolution: no attention layers), Mamba (``SerpentConfig(resampling_rates=[])``) and
  SeRpEnt, each trained twice: ``windowed`` (independent ``--seq-len`` windows, each from a zero state) and
  ``stateful`` (``--stateful``: each batch row reads its books in consecutive windows, the detached state of
  one window the initial state of the next: truncated backpropagation through time);
- transformers' GPT-2 of the same size, at its training window (``n_positions = --seq-len``).

Each is then scored on the PG-19 test books: the recurrent models statefully (every token conditioned on its
whole book before it, :func:`ssmhub.evaluation.evaluate_perplexity_stateful`, windows of
``--eval-max-length``), GPT-2 with sliding windows of its ``--seq-len`` and stride ``--seq-len / 2``
(:func:`ssmhub.evaluation.evaluate_perplexity`). Both report token perplexity by the token's position in its
book. The claim checked (and reported either way): stateful training makes a recurrent model's perplexity keep
falling with position well past its training window, where GPT-2's flattens at its window.

Results: ``benchmarks/results/pg19_context.md`` and ``pg19_context.png`` (perplexity against position, log x
axis, one line per model). Trained models and their logs stay in ``--work-dir`` (git-ignored); ``--reuse``
skips the training of a model whose folder is complete.

Run: ``python benchmarks/pg19_context.py`` (needs ``$SSMHUB_DATA_DIR`` or ``--data-dir`` with PG-19 in the
official layout; about an hour on 2 CPU cores with the defaults).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from ssmhub.data import iter_pg19_books
from ssmhub.evaluation import evaluate_perplexity, evaluate_perplexity_stateful
from ssmhub.evaluation.scores import bucket_name
from ssmhub.tokenization import encode_document, train_bpe_tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import RESULTS_DIR, markdown_table, write_report

SCRIPT_NAME = "pg19_context"
COARSE_BUCKETS = (0, 1024, 4096, 16384, 65536)  # the table's buckets, ssmhub-eval's
FINE_BUCKETS = (0, *(2**k for k in range(4, 17)))  # the plot's: 0, 16, 32, ..., 64K (each coarse start is one)

# name -> (model_type, model_config): ≈ 5M parameters each with a 4,096-token vocabulary.
ARCHITECTURES = {
    "dlr": ("dlr", {"hidden_size": 384, "num_hidden_layers": 8}),
    "h3": (
        "h3",
        {
            "hidden_size": 256,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "attention_layers": [],
            "intermediate_size": 1024,
        },
    ),
    "mamba": ("serpent", {"hidden_size": 256, "num_hidden_layers": 8, "resampling_rates": []}),
    "serpent": ("serpent", {"hidden_size": 240, "num_hidden_layers": 8}),
    "gpt2": ("gpt2", {"n_embd": 256, "n_layer": 6, "n_head": 4}),
}
RECURRENT = ("dlr", "h3", "mamba", "serpent")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--data-dir", default=os.environ.get("SSMHUB_DATA_DIR"), help="default $SSMHUB_DATA_DIR")
    p.add_argument("--work-dir", default="runs/pg19_context", help="tokenizer, trained models, logs")
    p.add_argument(
        "--models", nargs="+", default=["dlr", "h3", "gpt2", "mamba", "serpent"], choices=list(ARCHITECTURES)
    )
    p.add_argument("--skip", nargs="*", default=[], help="run names to leave out, e.g. serpent-stateful")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--seq-len", type=int, default=256, help="training window (and GPT-2's n_positions)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-steps", type=int, default=400)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--eval-max-length", type=int, default=1024, help="stateful evaluation: tokens per forward")
    p.add_argument("--max-test-books", type=int, default=None, help="evaluate only the first N test books")
    p.add_argument(
        "--reuse", action="store_true", help="keep the trained models (and their test scores) found in --work-dir"
    )
    p.add_argument("--no-write", action="store_true", help="print only; do not write the results")
    args = p.parse_args(argv)
    if not args.data_dir or not (Path(args.data_dir) / "pg19" / "train").is_dir():
        p.error(f"--data-dir must hold pg19/train (the official layout); got {args.data_dir!r}")
    return args


def runs(models: list[str], skip: list[str]) -> list[tuple[str, str, bool]]:
    """(run name, architecture, stateful training) of every model to train, fast ones first, but ``skip``."""
    out = []
    for name in models:
        for stateful in (False, True) if name in RECURRENT else (False,):
            run = f"{name}-{'stateful' if stateful else 'windowed'}"
            if run not in skip:
                out.append((run, name, stateful))
    return out


def train_tokenizer(args, folder: Path) -> None:
    """One byte-level BPE for every model, trained on the PG-19 train books."""
    if (folder / "tokenizer.json").exists():
        return
    books = (book.text for book in iter_pg19_books("train", data_dir=args.data_dir))
    train_bpe_tokenizer(books, vocab_size=args.vocab_size).save_pretrained(folder)


def train(args, run: str, architecture: str, stateful: bool, tokenizer: Path) -> float:
    """Train one model with ``ssmhub-train`` into ``work-dir/run``; its wall seconds (NaN if reused)."""
    folder = Path(args.work_dir) / run
    if args.reuse and (folder / "model.safetensors").exists():
        return math.nan
    model_type, model_config = ARCHITECTURES[architecture]
    if model_type == "gpt2":
        model_config = {**model_config, "n_positions": args.seq_len}
    command = [
        sys.executable, "-m", "ssmhub.training.cli",
        "--dataset", "pg19", "--data_dir", args.data_dir, "--tokenizer", str(tokenizer),
        "--model_type", model_type, "--model_config", json.dumps(model_config),
        "--seq_len", str(args.seq_len), "--per_device_train_batch_size", str(args.batch_size),
        "--max_steps", str(args.max_steps), "--learning_rate", str(args.learning_rate),
        "--warmup_steps", str(max(1, args.max_steps // 10)), "--eval_steps", "0", "--save_steps", "0",
        "--logging_steps", "50", "--cpu", "--output_dir", str(folder), "--overwrite_output_dir",
        *(["--stateful"] if stateful else []),
    ]  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(folder.parent / f"{run}.log", "w") as log:
        subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=True)
    return time.perf_counter() - start


def book_tokens(args, tokenizer, split: str, max_books: int | None = None) -> list[list[int]]:
    books = iter_pg19_books(split, data_dir=args.data_dir, max_books=max_books)
    return [encode_document(tokenizer, book.text) for book in books]


def evaluate(args, run: str, architecture: str, documents: list[list[int]]) -> dict:
    """Score the test books by position (fine buckets): recurrent models statefully, GPT-2 with sliding windows."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(Path(args.work_dir) / run).eval()
    start = time.perf_counter()
    if architecture in RECURRENT:
        result = evaluate_perplexity_stateful(model, documents, args.eval_max_length, bucket_starts=FINE_BUCKETS)
        protocol = f"stateful, windows of {args.eval_max_length}"
    else:
        result = evaluate_perplexity(
            model, documents, args.seq_len, args.seq_len // 2, batch_size=8, bucket_starts=FINE_BUCKETS
        )
        protocol = f"sliding windows of {args.seq_len}, stride {args.seq_len // 2}"
    return {
        "protocol": protocol,
        "parameters": sum(p.numel() for p in model.parameters()),
        "eval_seconds": time.perf_counter() - start,
        **result.to_dict(),
    }


def perplexity_in(buckets: list[dict], begin: int, end: int | None) -> tuple[float, int]:
    """Token perplexity and scored tokens of the fine ``buckets`` that start in positions [begin, end)."""
    inside = [x for x in buckets if x["first_position"] >= begin and (end is None or x["first_position"] < end)]
    nll, tokens = sum(x["total_nll"] for x in inside), sum(x["num_tokens"] for x in inside)
    return (math.exp(nll / tokens) if tokens else math.nan), tokens


def coarse(fine_buckets: list[dict]) -> list[dict]:
    """The fine buckets summed into :data:`COARSE_BUCKETS`: ``{"positions", "tokens", "ppl"}`` each."""
    out = []
    for begin, end in zip(COARSE_BUCKETS, [*COARSE_BUCKETS[1:], None]):
        ppl, tokens = perplexity_in(fine_buckets, begin, end)
        out.append({"positions": bucket_name(begin, end), "tokens": tokens, "ppl": ppl})
    return out


def plot(results: dict[str, dict], seq_len: int, path: Path) -> None:
    """Perplexity against position in the book (geometric middle of each fine bucket), log x axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for run, result in results.items():
        points = [
            (
                math.sqrt(max(b["first_position"], 1) * (b["end_position"] or 2 * b["first_position"])),
                b["token_perplexity"],
            )
            for b in result["by_position"]
            if b["num_tokens"]
        ]
        style = "--" if run.endswith("windowed") else "-"
        ax.plot(
            *zip(*points), style, marker="o", markersize=3, label=run, color="black" if run == "gpt2-windowed" else None
        )
    ax.axvline(seq_len, color="grey", linewidth=0.8, linestyle=":")
    ax.text(seq_len * 1.05, ax.get_ylim()[1] * 0.97, f"training window ({seq_len})", color="grey", va="top", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("position in the book (tokens before the scored token)")
    ax.set_ylabel("token perplexity")
    ax.set_title("PG-19 test books: perplexity by position")
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, path)


def falls_past_window(result: dict, seq_len: int) -> tuple[float, float]:
    """Perplexity at positions [seq_len, 4·seq_len) and at 16K and beyond (the claim's two points)."""
    return perplexity_in(result["by_position"], seq_len, 4 * seq_len)[0], perplexity_in(
        result["by_position"], 16384, None
    )[0]


def report(args, results: dict[str, dict], train_seconds: dict[str, float], documents, train_tokens: int) -> list[str]:
    tokens = args.max_steps * args.batch_size * args.seq_len
    setup = (
        f"Training: the {args.vocab_size}-token BPE of the PG-19 train books, {args.max_steps} steps × "
        f"{args.batch_size} rows × {args.seq_len} tokens = {tokens:,} tokens per model, learning rate "
        f"{args.learning_rate} (warmup {max(1, args.max_steps // 10)} steps, cosine), float32 on the CPU; the train "
        f"books hold {train_tokens:,} tokens ({tokens / train_tokens:.2f} epochs).\n\n"
        f"Test: {len(documents)} PG-19 test books, {sum(len(d) for d in documents):,} tokens "
        f"(longest {max(len(d) for d in documents):,})."
    )
    rows = []
    for run, result in results.items():
        buckets = coarse(result["by_position"])
        rows.append([
            run, f"{result['parameters'] / 1e6:.2f}M", result["protocol"],
            "reused" if math.isnan(train_seconds.get(run, math.nan)) else f"{train_seconds[run]:.0f}",
            f"{result['token_perplexity']:.2f}", *(f"{b['ppl']:.2f}" if b["tokens"] else "-" for b in buckets),
        ])  # fmt: skip
    first = coarse(next(iter(results.values()))["by_position"])
    table = markdown_table(
        ["model", "parameters", "evaluation", "train s", "ppl", *(b["positions"] for b in first)], rows
    )
    token_counts = ", ".join(f"{b['positions']}: {b['tokens']:,}" for b in first)
    fine_rows = [
        [run, *(f"{b['token_perplexity']:.2f}" if b["num_tokens"] else "-" for b in result["by_position"])]
        for run, result in results.items()
    ]
    fine_names = [b["positions"] for b in next(iter(results.values()))["by_position"]]
    relative = ""
    if "gpt2-windowed" in results:  # the books' own difficulty changes with position: divide it out
        peer = coarse(results["gpt2-windowed"]["by_position"])
        relative_rows = [
            [
                run,
                *(f"{b['ppl'] / g['ppl']:.3f}" if b["tokens"] else "-" for b, g in zip(coarse(r["by_position"]), peer)),
            ]
            for run, r in results.items()
        ]
        relative = (
            "\n\n## Relative to GPT-2 in the same bucket\n\nEach bucket holds other passages of the books, some harder "
            "than others for every model (4K–16K here); a model's perplexity divided by GPT-2's in the same bucket "
            "takes the passages' difficulty out, so a ratio falling with position is context being used:\n\n"
            + markdown_table(["model", *(b["positions"] for b in first)], relative_rows)
        )
    checks = []
    for run, result in results.items():
        near, far = falls_past_window(result, args.seq_len)
        checks.append(
            f"- {run}: ppl {near:.2f} at positions {args.seq_len}–{4 * args.seq_len} → {far:.2f} at 16K+ "
            f"({(far / near - 1) * 100:+.1f}%)"
        )
    return [
        setup,
        f"## Token perplexity by position in the book\n\n{table}\n\nScored tokens per bucket: {token_counts}."
        + relative,
        f"![perplexity by position]({SCRIPT_NAME}.png)",
        "## Finer buckets (the plot's points)\n\n" + markdown_table(["model", *fine_names], fine_rows),
        "## The claim: does perplexity keep falling past the training window?\n\n" + "\n".join(checks),
    ]


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    tokenizer_folder = work / "tokenizer"
    train_tokenizer(args, tokenizer_folder)
    times_file = work / "train_seconds.json"
    train_seconds = json.loads(times_file.read_text()) if times_file.exists() else {}
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    documents = book_tokens(args, tokenizer, "test", args.max_test_books)
    train_tokens = sum(len(book) for book in book_tokens(args, tokenizer, "train"))
    results = {}
    for run, architecture, stateful in runs(args.models, args.skip):
        seconds = train(args, run, architecture, stateful, tokenizer_folder)
        if not math.isnan(seconds):
            train_seconds[run] = seconds
            times_file.write_text(json.dumps(train_seconds, indent=1))
        scored = work / run / "pg19_test.json"
        if args.reuse and math.isnan(seconds) and scored.exists():
            results[run] = json.loads(scored.read_text())
        else:
            results[run] = evaluate(args, run, architecture, documents)
            scored.write_text(json.dumps(results[run], indent=1))
        print(run, f"train {train_seconds.get(run, math.nan):.0f} s", coarse(results[run]["by_position"]), flush=True)
    sections = report(args, results, train_seconds, documents, train_tokens)
    print("\n\n".join(sections))
    if not args.no_write:
        plot(results, args.seq_len, Path(RESULTS_DIR) / f"{SCRIPT_NAME}.png")
        write_report(SCRIPT_NAME, "The PG-19 context curve: perplexity by position in the book", sections)


if __name__ == "__main__":
    main()
