"""transformers' ``generate`` on an ssmhub model: its decode step at a batch against the step's byte floor, in the
process that runs it (``benchmarks/serving.py --generate-floor``; issue 71).

* **Step**: ``generate`` greedy on a batch of prompts of 64 random tokens, the time between consecutive decode
  steps (a logits processor's clock), the median over ``--repeats`` runs of ``n`` steps: what one more token of
  every row costs, prefill excluded.
* **Floor**: the serving step's (:mod:`_step_floor`), at the batch's rows: every decode weight's product through
  oneDNN on a prepared weight (vLLM's CPU GEMM), swept once each as a step reads them (results before 2026-12-05
  evening summed each product timed alone), plus one read and write of every row's state (a fresh buffer's copy:
  ``generate``'s cache has no engine pages).

``--src DIR`` puts another checkout's ``src`` first on the path (``git worktree add``): the same measurement of the
code before a change, in the same run. Prints one JSON row per batch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

PROMPT_TOKENS = 64


class TokenClock:
    """A logits processor that stamps the time each step's scores reach it: between two stamps lies exactly one
    decode step of every row (its forward, the cache update, the sampler), prefill excluded."""

    def __init__(self):
        self.stamps: list[float] = []

    def __call__(self, input_ids, scores):
        self.stamps.append(time.perf_counter())
        return scores


def step_intervals_ms(model, batch: int, new_tokens: int, vocab: int) -> list[float]:
    """The ``new_tokens − 1`` decode-step times (ms) of one greedy ``generate`` for ``batch`` prompts of 64 tokens."""
    from transformers import LogitsProcessorList

    ids = torch.randint(1, vocab, (batch, PROMPT_TOKENS), generator=torch.Generator().manual_seed(batch))
    clock = TokenClock()
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                       logits_processor=LogitsProcessorList([clock]))  # fmt: skip
    return [1e3 * (b - a) for a, b in zip(clock.stamps, clock.stamps[1:])]


def decode_step_ms(model, batch: int, tokens: int, repeats: int, vocab: int) -> float:
    """The median decode step over ``repeats`` generates of ``1 + tokens`` tokens (``tokens`` steps each): what one
    more token of every row costs. A difference of whole ``generate`` times would carry the prefill's noise, which
    at 64-token prompts can exceed 16 steps (SeRpEnt-as-Mamba at batch 8: prefill 2.0-2.8 s, a step 25 ms)."""
    step_intervals_ms(model, batch, 2, vocab)  # warm-up: a shape's first call fills caches (and numba's compilation)
    return statistics.median(ms for _ in range(repeats) for ms in step_intervals_ms(model, batch, 1 + tokens, vocab))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--batches", type=int, nargs="+", required=True)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    from _step_floor import decode_weights, state_pass_ms, state_per_request, weight_products_ms
    from transformers import AutoModelForCausalLM

    import ssmhub

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.folder).eval()
    state = state_per_request(args.name, model, 0)
    weights = decode_weights(model)
    for batch in args.batches:
        step = decode_step_ms(model, batch, args.tokens, args.repeats, model.config.vocab_size)
        products, state_ms = weight_products_ms(weights, batch), state_pass_ms(batch * state["bytes"], True)
        print(json.dumps({"model": args.name, "batch": batch, "step_ms": step, "floor_ms": products["sweep"] + state_ms,
                          "products_ms": products["sweep"], "state_ms": state_ms, "tok_s": 1e3 * batch / step,
                          "src": str(Path(ssmhub.__file__).parents[1]), "numba": _numba_version()}),
              flush=True)  # fmt: skip


def _numba_version() -> str | None:
    """numba's version (the one-pass kernels' compiler; its OpenMP pool shares the cores with torch's), or None."""
    try:
        import numba
    except ImportError:
        return None
    return numba.__version__


def code_environment(src: Path | None) -> dict[str, str]:
    """The environment of a process that runs ssmhub from the checkout ``src`` (None: this one's)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(src) / "src"), env.get("PYTHONPATH", "")])
    return env


def generate_floor_rows(name: str, folder: Path, args, src: Path | None) -> list[dict]:
    """:func:`main`'s rows for one model in a process of its own, on ``src`` (None: this checkout's code)."""
    env = code_environment(src)
    command = [sys.executable, __file__, "--folder", str(folder), "--name", name, "--threads", str(args.threads),
               "--repeats", str(args.repeats), "--batches", *map(str, args.generate_floor)]  # fmt: skip
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, env=env)
    if done.returncode:
        print(f"{name}: the generate-floor run on {src or 'this checkout'} failed (exit {done.returncode})")
        return []
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def generate_floor_table(now: list[dict], before: list[dict]) -> list[str]:
    """One line per (model, batch): ms per step before and now, the speed-up, and each as a fraction of the floor."""
    base = {(r["model"], r["batch"]): r for r in before}
    lines = ["| model | batch | ms/step before | ms/step now | now ÷ before tok/s | tok/s now | floor ms "
             "| floor ÷ step before | floor ÷ step now |", "|---" * 9 + "|"]  # fmt: skip
    for r in now:
        b, floor, step = base.get((r["model"], r["batch"])), r["floor_ms"], r["step_ms"]
        cells = (f"{b['step_ms']:.1f}", f"{b['step_ms'] / step:.2f}×", f"{floor / b['step_ms']:.0%}") if b else "–––"
        lines.append(f"| {r['model']} | {r['batch']} | {cells[0]} | {step:.1f} | {cells[1]} | {r['tok_s']:.0f} | "
                     f"{floor:.2f} | {cells[2]} | {floor / step:.0%} |")  # fmt: skip
    return lines


def generate_floor_targets(now: list[dict], before: list[dict]) -> list[str]:
    """Issue 71's: batched ``generate`` at 32 rows ≥ 2× the tokens/s of the code before."""
    base = {(r["model"], r["batch"]): r for r in before}
    lines = []
    for r in [r for r in now if r["batch"] == 32 and (r["model"], 32) in base]:
        ratio = base[r["model"], 32]["step_ms"] / r["step_ms"]
        lines.append(f"- {r['model']}: generate at 32 rows ≥ 2× the tokens/s before: "
                     f"{'**met**' if ratio >= 2 else '**missed**'} ({ratio:.2f}×)")  # fmt: skip
    return lines


def generate_floor_section(families: list[str], folders: dict[str, Path], args) -> tuple[list[str], list[str]]:
    """The report's section and target lines for ``--generate-floor`` (nothing when no batch is asked for); with
    ``--baseline-src``, the code there measured too, after this checkout's, ``--generate-rounds`` times in turn."""
    if not args.generate_floor:
        return [], []
    sources = [None] if args.baseline_src is None else [None, args.baseline_src]
    rounds = {src: [] for src in sources}
    for _ in range(args.generate_rounds):
        for src in sources:
            rounds[src] += [row for name in families for row in generate_floor_rows(name, folders[name], args, src)]
    now, before = median_rows(rounds[None]), median_rows(rounds[args.baseline_src]) if args.baseline_src else []
    table = "\n".join(generate_floor_table(now, before))
    numba = ", ".join(sorted({str(row.get("numba")) for row in now + before}))
    median = f"; each row the median of {args.generate_rounds} rounds" if args.generate_rounds > 1 else ""
    header = f"## generate's decode step against its byte floor\n\nnumba: {numba}; python: {sys.executable}{median}"
    return [f"{header}\n\n{table}"], generate_floor_targets(now, before)


def median_rows(rows: list[dict]) -> list[dict]:
    """One row per (model, batch): the median of its rounds' step, floor, products and state pass (tokens/s of the
    median step)."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["model"], row["batch"]), []).append(row)
    timed = ("step_ms", "floor_ms", "products_ms", "state_ms")
    medians = [{**group[0], **{key: statistics.median(r[key] for r in group) for key in timed}}
               for group in groups.values()]  # fmt: skip
    return [{**row, "tok_s": 1e3 * row["batch"] / row["step_ms"]} for row in medians]


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
