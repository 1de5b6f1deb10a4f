"""SeRpEnt's decode step and training step against ssmhub's Mamba of the same width, in one run.

SeRpEnt (arXiv 2501.11729) runs a base Mamba branch and one resampling branch per κ; its decode step carries each
branch's streaming clock, window and Mamba state. This script times, interleaved in one process (one thread):

- decode: ms/token of greedy steps after a prompt, batch 1, at each context (median of repeats);
- training: seconds of a forward + backward at each length (median of repeats);

for SeRpEnt [0.5, 0.1] at width W − W mod 3 (its default branch layout) and Mamba (SeRpEnt with no resampling branch) at
width W, W × layers as given, and reports SeRpEnt ÷ Mamba. Every round runs in a fresh worker process;
``--before-src DIR`` also runs the workers on another source tree of ssmhub (e.g. ``git archive`` of an earlier
commit, its ``src``), round by round with the current one, to show a change's effect in the same run.

    python experiments/serpent_vs_mamba.py [--before-src runs/old/src] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import _experiments  # noqa: F401  (benchmarks/'s helpers, results into experiments/results/)
import torch
from _report import markdown_table, median, print_and_write

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--width", type=int, default=256, help="Mamba's hidden size W; SeRpEnt's is W − W mod 3")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--contexts", type=int, nargs="+", default=[128, 1024], help="decode: prompt lengths")
    p.add_argument("--steps", type=int, default=32, help="decode: greedy steps per timed block")
    p.add_argument("--repeats", type=int, default=3, help="timed blocks / training steps per model in a worker")
    p.add_argument("--train-lens", type=int, nargs="+", default=[256, 1024], help="training: sequence lengths")
    p.add_argument("--train-tokens", type=int, default=1024, help="training: batch = max(1, this // L)")
    p.add_argument("--rounds", type=int, default=5, help="worker processes per source tree")
    p.add_argument("--before-src", help="another ssmhub source tree to time in the same run (its src folder)")
    p.add_argument("--compiled", action="store_true", help="also time the compiled decode step (this tree only)")
    p.add_argument("--name", default="serpent_vs_mamba", help="results file stem")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--no-write", action="store_true", help="print only")
    return p.parse_args(argv)


# --------------------------------------------------------------------------------------------- worker
def build(args, rates):
    import ssmhub

    width = args.width - args.width % (1 + len(rates))
    config = ssmhub.SerpentConfig(
        vocab_size=args.vocab_size,
        hidden_size=width,
        num_hidden_layers=args.layers,
        state_size=16,
        expand=2,
        resampling_rates=rates,
    )
    torch.manual_seed(0)
    return ssmhub.SerpentForCausalLM(config)


def decode_ms(model, context: int, steps: int) -> float:
    """ms/token of ``steps`` greedy steps after a ``context``-token prompt (a few untimed steps first)."""
    from ssmhub.models.cache_argument import CACHE_FIELD  # `cache`, or `past_key_values` before transformers 5.24

    ids = torch.randint(0, model.config.vocab_size, (1, context), generator=torch.Generator().manual_seed(context))
    with torch.no_grad():
        out = model(ids, use_cache=True, logits_to_keep=1)
        cache, token = getattr(out, CACHE_FIELD), out.logits[:, -1:].argmax(-1)
        for i in range(steps + 4):
            if i == 4:
                start = time.perf_counter()
            out = model(token, use_cache=True, **{CACHE_FIELD: cache})
            token = out.logits[:, -1:].argmax(-1)
    return 1e3 * (time.perf_counter() - start) / steps


def decode_ops(model, steps: int = 8) -> float:
    """Tensor ops dispatched per decode token (after a 16-token prompt): a count that, unlike ms/token, does not
    depend on what else the machine is doing."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from ssmhub.models.cache_argument import CACHE_FIELD

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    ids = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(ids, use_cache=True, logits_to_keep=1)
        cache, token = getattr(out, CACHE_FIELD), out.logits[:, -1:].argmax(-1)
        model(token, use_cache=True, **{CACHE_FIELD: cache})
        with Count():
            for _ in range(steps):
                token = model(token, use_cache=True, **{CACHE_FIELD: cache}).logits[:, -1:].argmax(-1)
    return Count.calls / steps


def compiled_decode_ms(model, context: int, steps: int) -> float:
    """ms/token of ``steps`` greedy steps of the decode step compiled by ``torch.compile(fullgraph=True)``
    (Inductor) on a preallocated cache (``model.static_cache``), after a ``context``-token prompt."""
    from ssmhub.models.cache_argument import CACHE_FIELD

    ids = torch.randint(0, model.config.vocab_size, (1, context), generator=torch.Generator().manual_seed(context))
    cache = model.static_cache(1, context + steps + 8)
    step = torch.compile(model.forward, fullgraph=True)
    with torch.no_grad():
        token = model(ids, use_cache=True, **{CACHE_FIELD: cache}).logits[:, -1:].argmax(-1)
        for i in range(steps + 4):  # the first calls compile
            if i == 4:
                start = time.perf_counter()
            token = step(token, use_cache=True, **{CACHE_FIELD: cache}).logits[:, -1:].argmax(-1)
    return 1e3 * (time.perf_counter() - start) / steps


def train_s(model, length: int, batch: int) -> float:
    ids = torch.randint(0, model.config.vocab_size, (batch, length), generator=torch.Generator().manual_seed(length))
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    model(ids, labels=ids).loss.backward()
    return time.perf_counter() - start


def worker(args) -> dict:
    torch.set_num_threads(1)
    models = {"mamba": build(args, []), "serpent": build(args, [0.5, 0.1])}
    result = {"decode ops/token": {name: decode_ops(model.eval()) for name, model in models.items()}}
    for context in args.contexts:
        for model in models.values():
            model.eval()
            decode_ms(model, context, 2)  # warm-up
        times = {name: [] for name in models}
        for _ in range(args.repeats):
            for name, model in models.items():
                times[name].append(decode_ms(model, context, args.steps))
        result[f"decode {context}"] = {name: median(v) for name, v in times.items()}
    if args.compiled:
        for context in args.contexts:
            result[f"compiled decode {context}"] = {
                name: compiled_decode_ms(model.eval(), context, args.steps) for name, model in models.items()
            }
    for length in args.train_lens:
        batch = max(1, args.train_tokens // length)
        for model in models.values():
            model.train()
            train_s(model, length, batch)  # warm-up
        times = {name: [] for name in models}
        for _ in range(args.repeats):
            for name, model in models.items():
                times[name].append(train_s(model, length, batch))
        result[f"train {length}"] = {name: median(v) for name, v in times.items()}
    return result


# --------------------------------------------------------------------------------------------- driver
def run_worker(src: str, argv: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), *argv, "--worker"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def worker_argv(args) -> list[str]:
    return [
        "--width", str(args.width), "--layers", str(args.layers), "--vocab-size", str(args.vocab_size),
        "--contexts", *map(str, args.contexts), "--steps", str(args.steps), "--repeats", str(args.repeats),
        "--train-lens", *map(str, args.train_lens), "--train-tokens", str(args.train_tokens),
        *(["--compiled"] if args.compiled else []),
    ]  # fmt: skip


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    trees = {"this tree": SRC}
    if args.before_src:
        trees = {"before": os.path.abspath(args.before_src), **trees}
    runs = {label: [] for label in trees}
    for round_ in range(args.rounds):
        for label, src in trees.items():
            runs[label].append(run_worker(src, worker_argv(args)))
            print(f"round {round_ + 1} {label}: {json.dumps(runs[label][-1])}", flush=True)
    rows = []
    for measure in runs["this tree"][0]:
        unit = "" if measure.endswith("ops/token") else "s/step" if measure.startswith("train") else "ms/token"
        for label in trees:
            mamba = median([r[measure]["mamba"] for r in runs[label]])
            serpent = median([r[measure]["serpent"] for r in runs[label]])
            ratios = [r[measure]["serpent"] / r[measure]["mamba"] for r in runs[label]]
            values = [f"{value:.3g} {unit}".strip() for value in (mamba, serpent)]
            ratio, spread = f"**{median(ratios):.2f}×**", f"{min(ratios):.2f}–{max(ratios):.2f}"
            rows.append([measure, label, *values, ratio, spread])
    headers = ["measure", "source", "Mamba", "SeRpEnt [0.5, 0.1]", "SeRpEnt ÷ Mamba (median of rounds)", "range"]
    import ssmhub

    width = args.width - args.width % 3
    text = (
        f"Mamba: width {args.width}; SeRpEnt: width {width}, κ = 0.5, 0.1 in SerpentConfig's default "
        f"branch_layout ({ssmhub.SerpentConfig().branch_layout!r}: additive, a whole base Mamba and branches of width "
        f"{width // 8}; concatenated, before issue 53: three branches of width {width // 3}); "
        f"{args.layers} layers, state 16, expand 2, vocabulary {args.vocab_size}; batch 1 decode "
        f"of {args.steps} greedy steps after a random prompt; training: forward + backward of batch "
        f"max(1, {args.train_tokens} // L). Each of {args.rounds} rounds is a fresh process per source tree, "
        f"{args.repeats} repeats per model inside it, models interleaved; one thread."
    )
    print_and_write(args, "SeRpEnt vs Mamba: decode and training step", text, markdown_table(headers, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
