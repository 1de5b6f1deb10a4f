"""Training throughput (tokens/s) vs sequence length: DLR or H3 vs GPT-2 of the same width and depth, same trainer.

What is measured
----------------
Both models are trained by the project's own trainer, :func:`ssmhub.training.train`, with identical
options except ``model_type`` / ``model_config``: WikiText-2 (offline copy in ``$SSMHUB_DATA_DIR``), AdamW,
warmup + cosine schedule, gradient clipping at 1.0, fp32, ``cpu=True``, no intermediate evaluation or
checkpoints. Models (defaults; see the flags):

- DLR (``--family dlr``, the default): ``model_type="dlr"``, hidden 256, 4 layers, state size 64, MLP 1024.
- H3 (``--family h3``): ``model_type="h3"`` with learned long convolutions of ``--max-kernel-length`` taps
  (default: the longest sequence length, a kernel as long as the input as in the long-conv paper) and
  attention at ``--h3-attention-layers`` (default none: every layer is H3, so the comparison isolates the
  sequence mixer). The issue's shape is GPT-2-small's: ``--hidden 768 --layers 12 --intermediate 3072
  --heads 12``.
- GPT-2: ``model_type="gpt2"`` (transformers' ``GPT2LMHeadModel``), n_embd 256, 4 layers, 4 heads, MLP 1024,
  n_positions = the longest sequence length; dropout set to 0 (DLR's default dropout is 0 too), which also
  lets SDPA use its fused causal kernel on CPU.

Both share one tokenizer: a byte-level BPE of ``--vocab-size`` (default 4096) trained once on the
WikiText-2 train split with ``ssmhub.tokenization.train_bpe_tokenizer`` (what the trainer does when no
tokenizer is given) and passed to every run as ``tokenizer``, so the vocabulary is identical and the LM head
does not dominate the cost of these small models.

Tokens per optimizer step are kept equal at every length: batch = ``--tokens-per-step`` // seq_len
(4096 tokens: batch 8 / 2 / 1 at 512 / 2048 / 4096).

Timing: ``train(config, on_step_end=callback)`` calls the callback after each optimizer step; the callback
records ``time.perf_counter()``. The time of step k is the gap between the callbacks of steps k-1 and k, i.e.
everything the trainer does in one iteration of its loop: fetching the batch, forward + loss, backward,
gradient clipping, AdamW and scheduler step, zero_grad, the ``loss.item()`` sync and its metrics-file append.
The first ``--warmup`` steps are not timed (step 1 has no previous callback anyway), nor is the last step
(the trainer evaluates on the validation set after it, before the callback). Run setup (data loading,
tokenization, model build) and the final save are outside the timed steps. tokens/s = batch * seq_len /
median step time. For each length the runs are interleaved (DLR, GPT-2, DLR, GPT-2, ... for ``--repeats``)
and the median is taken over all timed steps of all repeats.

Run: ``SSMHUB_DATA_DIR=../shared/data python benchmarks/train_throughput.py`` or ``make bench``
(2-3 min on 2 idle CPU cores). H3 at GPT-2-small's shape (results/train_throughput_h3.md)::

    python benchmarks/train_throughput.py --family h3 --hidden 768 --layers 12 --intermediate 3072 \
        --heads 12 --seq-lens 1024 4096 8192 --tokens-per-step 8192 --steps 2 --warmup 1 --repeats 2
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import markdown_table, median, write_report

SCRIPT_NAME = "train_throughput"
FAMILY_LABELS = {"dlr": "DLR", "h3": "H3"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--family", choices=sorted(FAMILY_LABELS), default="dlr", help="the ssmhub family timed")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[512, 2048, 4096])
    p.add_argument("--tokens-per-step", type=int, default=4096, help="batch * seq_len, equal at every length")
    p.add_argument("--hidden", type=int, default=256, help="hidden_size = GPT-2 n_embd")
    p.add_argument("--layers", type=int, default=4, help="num_hidden_layers = GPT-2 n_layer")
    p.add_argument("--intermediate", type=int, default=1024, help="intermediate_size = GPT-2 n_inner")
    p.add_argument("--state-size", type=int, default=64, help="DLR state size N")
    p.add_argument("--max-kernel-length", type=int, default=None, help="H3 L_max (default: the longest seq len)")
    p.add_argument("--h3-attention-layers", type=int, nargs="*", default=[], help="H3 layers that are attention")
    p.add_argument("--heads", type=int, default=4, help="GPT-2 n_head (and the H3 attention layers')")
    p.add_argument("--gpt2-dropout", type=float, default=0.0, help="GPT-2 resid/embd/attn dropout (DLR's is 0)")
    p.add_argument(
        "--gpt2-activation",
        default="gelu_new",
        help="GPT-2 activation_function (default: GPT-2's own gelu_new, the tanh approximation; ssmhub's MLPs use "
        "the exact gelu)",
    )
    p.add_argument("--name", default=None, help="results/<name>.md (default: train_throughput[_<family>])")
    p.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary shared by both models")
    p.add_argument(
        "--tokenizer", default=None, help="use this tokenizer folder instead of training a BPE (e.g. GPT-2's)"
    )
    p.add_argument("--steps", type=int, default=4, help="timed optimizer steps per run")
    p.add_argument("--warmup", type=int, default=2, help="untimed optimizer steps at the start of each run")
    p.add_argument("--repeats", type=int, default=2, help="runs per model and length (interleaved)")
    p.add_argument("--data-dir", default=None, help="default: $SSMHUB_DATA_DIR")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: leave torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verbose", action="store_true", help="show the trainer's own output (progress bar, summary)")
    p.add_argument("--no-write", action="store_true", help="print only; do not write the results file")
    return p.parse_args(argv)


def family_config(args) -> dict:
    """The model_config of the timed ssmhub family."""
    common = {"hidden_size": args.hidden, "num_hidden_layers": args.layers, "intermediate_size": args.intermediate}
    if args.family == "dlr":
        return {**common, "state_size": args.state_size}
    return {
        **common,
        "max_kernel_length": args.max_kernel_length or max(args.seq_lens),
        "attention_layers": list(args.h3_attention_layers),
        "num_attention_heads": args.heads,
    }


def model_configs(args) -> dict[str, dict]:
    n_positions = max(args.seq_lens)
    return {
        args.family: family_config(args),
        "gpt2": {
            "n_embd": args.hidden,
            "n_layer": args.layers,
            "n_head": args.heads,
            "n_inner": args.intermediate,
            "n_positions": n_positions,
            "resid_pdrop": args.gpt2_dropout,
            "embd_pdrop": args.gpt2_dropout,
            "attn_pdrop": args.gpt2_dropout,
            "activation_function": args.gpt2_activation,
        },
    }


def make_config(args, model_type: str, model_config: dict, seq_len: int, tokenizer: str, output_dir: str):
    from ssmhub.training import TrainConfig

    return TrainConfig(
        output_dir=output_dir,
        overwrite_output_dir=True,
        dataset="wikitext-2",
        data_dir=args.data_dir,
        seq_len=seq_len,
        max_eval_windows=1,  # the trainer evaluates after the last step; keep that short (it is not timed)
        per_device_eval_batch_size=1,
        tokenizer=tokenizer,
        vocab_size=args.vocab_size,
        model_type=model_type,
        model_config=dict(model_config),
        per_device_train_batch_size=args.tokens_per_step // seq_len,
        max_steps=args.warmup + args.steps + 1,  # +1: the last step is followed by the (untimed) evaluation
        warmup_steps=args.warmup,
        eval_steps=0,
        save_steps=0,
        logging_steps=1,
        cpu=True,
        seed=args.seed,
    )


def build_tokenizer(args, workdir: str) -> str:
    """A tokenizer folder both models use: ``--tokenizer`` as given, else a BPE trained once on the train split."""
    if args.tokenizer:
        return args.tokenizer
    from ssmhub.tokenization import train_bpe_tokenizer
    from ssmhub.training import corpus_source, iter_documents

    start = time.perf_counter()
    tokenizer = train_bpe_tokenizer(
        iter_documents(corpus_source("wikitext-2", "train", args.data_dir)), vocab_size=args.vocab_size
    )
    path = os.path.join(workdir, "tokenizer")
    tokenizer.save_pretrained(path)
    print(f"trained a byte-level BPE of {len(tokenizer)} tokens in {time.perf_counter() - start:.1f} s", flush=True)
    return path


def model_facts(config) -> tuple[int, str]:
    """Parameter count and attention implementation of the model the trainer builds for ``config``."""
    from transformers import AutoModelForCausalLM

    from ssmhub.tokenization import load_tokenizer
    from ssmhub.training import build_model_config

    model = AutoModelForCausalLM.from_config(build_model_config(config, load_tokenizer(config.tokenizer)))
    params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    return params, str(getattr(model.config, "_attn_implementation", None) or "-")


def timed_run(config, warmup: int, verbose: bool) -> list[float]:
    """Train ``config``; return the wall times (s) of steps warmup+1 .. max_steps-1."""
    from ssmhub.training import train

    stamps: dict[int, float] = {}

    def on_step_end(step: int) -> None:
        stamps[step] = time.perf_counter()

    quiet_err = contextlib.nullcontext() if verbose else contextlib.redirect_stderr(io.StringIO())
    quiet_out = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())
    with quiet_err, quiet_out:
        train(config, on_step_end=on_step_end)
    last = config.max_steps - 1
    return [stamps[k] - stamps[k - 1] for k in range(warmup + 1, last + 1)]


def check_args(args) -> list[int]:
    """The sorted lengths; exits naming the flag where ``--tokens-per-step``, ``--warmup`` or ``--steps`` fail."""
    seq_lens = sorted(set(args.seq_lens))
    for seq_len in seq_lens:
        if args.tokens_per_step % seq_len:
            raise SystemExit(f"--tokens-per-step {args.tokens_per_step} is not a multiple of seq_len {seq_len}")
    if args.warmup < 1 or args.steps < 1:
        raise SystemExit("--warmup and --steps must be at least 1")
    return seq_lens


def print_model_facts(label: str, facts: dict, family: str) -> None:
    """Parameter counts of both models and GPT-2's attention implementation."""
    print(f"{label}: {facts[family][0]:,} parameters", flush=True)
    print(f"GPT-2: {facts['gpt2'][0]:,} parameters, attention implementation: {facts['gpt2'][1]}", flush=True)
    if facts["gpt2"][1] != "sdpa":
        print(f"  note: GPT-2 attention is {facts['gpt2'][1]!r}, not sdpa")


def measure_length(args, configs: dict, tokenizer: str, workdir: str, seq_len: int) -> tuple[list, list]:
    """One length: ``--repeats`` interleaved runs of each model; its results row and its per-step detail row."""
    fam = args.family
    times: dict[str, list[float]] = {m: [] for m in (fam, "gpt2")}
    for _ in range(args.repeats):
        for m in times:
            config = make_config(args, m, configs[m], seq_len, tokenizer, os.path.join(workdir, f"{m}-{seq_len}"))
            times[m] += timed_run(config, args.warmup, args.verbose)
    batch = args.tokens_per_step // seq_len
    ours_s, gpt2_s = median(times[fam]), median(times["gpt2"])
    ours_tps, gpt2_tps = batch * seq_len / ours_s, batch * seq_len / gpt2_s
    row = [
        seq_len,
        batch,
        f"{ours_tps:,.0f}",
        f"{gpt2_tps:,.0f}",
        f"{ours_tps / gpt2_tps:.2f}×",
        f"{1e3 * ours_s:.0f}",
        f"{1e3 * gpt2_s:.0f}",
    ]
    detail = [seq_len, *(", ".join(f"{1e3 * t:.0f}" for t in times[m]) for m in (fam, "gpt2"))]
    print("  " + " | ".join(str(c) for c in row), flush=True)
    return row, detail


def results_tables(label: str, rows: list, detail_rows: list) -> tuple[str, str]:
    """The medians table and the per-step detail table."""
    headers = [
        "seq_len",
        "batch",
        f"{label} tokens/s",
        "GPT-2 tokens/s",
        f"ratio ({label} ÷ GPT-2)",
        f"{label} ms/step",
        "GPT-2 ms/step",
    ]
    detail_headers = ["seq_len", f"{label} ms per timed step", "GPT-2 ms per timed step"]
    return markdown_table(headers, rows), markdown_table(detail_headers, detail_rows)


def model_notes(args, label: str, configs: dict, facts: dict) -> list[str]:
    """The notes on the two models: configs, tokenizer, parameters, attention and activation."""
    (ours_params, _), (gpt2_params, gpt2_attn) = facts[args.family], facts["gpt2"]
    vocab_text = (
        f"the tokenizer at `{args.tokenizer}`"
        if args.tokenizer
        else f"a byte-level BPE of {args.vocab_size} tokens trained once on the WikiText-2 train split"
    )
    n_positions = configs["gpt2"]["n_positions"]
    gelu_new = " (GPT-2's own, the tanh approximation, computed by transformers as several elementwise ops)."
    return [
        f"- Models: {label} `{configs[args.family]}`; GPT-2 `{configs['gpt2']}`. Both use {vocab_text}, passed to "
        "every run as `tokenizer`, and tie the LM head to the token embeddings.",
        f"- Parameters: {label} {ours_params:,} ({ours_params / 1e6:.2f}M); "
        f"GPT-2 {gpt2_params:,} ({gpt2_params / 1e6:.2f}M, of which {n_positions * args.hidden / 1e6:.2f}M position "
        f"embeddings for n_positions={n_positions}).",
        f"- GPT-2 attention runs with transformers' `{gpt2_attn}` implementation (torch "
        "`scaled_dot_product_attention`, causal, on CPU); GPT-2 dropout is "
        f"{args.gpt2_dropout} and {label}'s is 0. {label}'s sequence mixing is its FFT long convolution in "
        "training mode.",
        f"- MLP activation: {label}'s is the exact GELU (one fused op); GPT-2's is `{args.gpt2_activation}`"
        + (gelu_new if args.gpt2_activation == "gelu_new" else "."),
    ]


def method_notes(args, label: str, total_s: float) -> list[str]:
    """The notes on what is timed, the threads and the script's wall time."""
    return [
        "- Same training code for both: `ssmhub.training.train` with identical options (AdamW, warmup + cosine "
        "schedule, grad-norm clipping 1.0, fp32, `cpu=True`, `eval_steps=0`, `save_steps=0`); only `model_type` and "
        "`model_config` differ.",
        f"- Tokens per optimizer step are equal at every length: {args.tokens_per_step} "
        f"(batch = {args.tokens_per_step} // seq_len), no gradient accumulation.",
        "- Timed: the wall time between consecutive `on_step_end` callbacks, i.e. one full iteration of the "
        "trainer's loop (batch fetch, forward + loss, backward, clipping, AdamW + scheduler step, zero_grad, "
        f"`loss.item()`, metrics append). Per run: {args.warmup} warm-up steps untimed, {args.steps} timed steps, "
        "then one more untimed step (the trainer evaluates after its last step). "
        f"{args.repeats} run(s) per model and length, interleaved {label} / GPT-2; medians over all timed steps. "
        "Data loading, tokenization, model build and the final save are not timed.",
        f"- Threads: torch.get_num_threads() = {torch.get_num_threads()}. The machine is shared; individual steps "
        "are noisy (see the per-step detail).",
        f"- Whole script wall time: {total_s:.0f} s.",
    ]


def notes_text(args, label: str, configs: dict, facts: dict, total_s: float) -> str:
    """The notes in the results file's order."""
    models, method = model_notes(args, label, configs, facts), method_notes(args, label, total_s)
    return "\n".join([models[0], models[1], *method[:3], models[2], models[3], *method[3:]])


def report(args, label: str, table: str, notes: str, detail: str) -> None:
    """Prints the tables and notes; writes ``results/<name>.md`` unless ``--no-write``."""
    print(f"\n{table}\n\n{notes}\n\n{detail}")
    if args.no_write:
        return
    path = write_report(
        args.name or (SCRIPT_NAME if args.family == "dlr" else f"{SCRIPT_NAME}_{args.family}"),
        f"Training throughput vs sequence length: {label} vs GPT-2 (same trainer)",
        ["## Results (medians)\n\n" + table, "## Notes\n\n" + notes, "## Per-step detail (ms)\n\n" + detail],
    )
    print(f"\nwrote {path}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.data_dir is None and not os.environ.get("SSMHUB_DATA_DIR"):
        print("note: neither --data-dir nor $SSMHUB_DATA_DIR is set; the trainer will try the Hugging Face Hub")
    seq_lens = check_args(args)
    configs, label = model_configs(args), FAMILY_LABELS[args.family]
    script_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="train_throughput.") as workdir:
        tokenizer = build_tokenizer(args, workdir)
        facts = {
            m: model_facts(make_config(args, m, configs[m], seq_lens[0], tokenizer, workdir))
            for m in (args.family, "gpt2")
        }
        print_model_facts(label, facts, args.family)
        measured = [measure_length(args, configs, tokenizer, workdir, seq_len) for seq_len in seq_lens]
    table, detail = results_tables(label, [row for row, _ in measured], [detail for _, detail in measured])
    report(args, label, table, notes_text(args, label, configs, facts, time.perf_counter() - script_start), detail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
