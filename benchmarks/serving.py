"""Serving throughput: every ssmhub family through vLLM (``ssmhub.serving``) against transformers' ``generate`` on
the same model, vLLM's own GPT-2 and vLLM's own Mamba-2 of equal parameters (``_serving_models``), in one run.

Two measurements, written to ``benchmarks/results/serving.md`` (or ``--name``):

* **Concurrency.** ``C`` requests submitted at once (``C`` = 1, 8, 32, 128; ``max_num_seqs`` ≥ ``C``, so all of
  them run together, as ``C`` clients of a server would), prompts of 64-512 random tokens, 128 tokens out (greedy,
  ``ignore_eos``). Output tokens/s is ``C × 128`` over the wall time, prefill included; the time per output token is
  the median over requests of vLLM's own timestamps (first to last token over 127). transformers' ``generate`` runs
  the same prompts as one left-padded batch of ``C``, as a user would; its time per output token is
  ``(T(128 tokens) − T(1 token)) / 127``. Each batch runs once unmeasured first (vLLM's compilation, a model's
  caches), then ``--repeats`` times; the tables give medians.
* **Long conversations.** One cache budget (``--budget-mib``, vLLM's ``kv_cache_memory_bytes``) and prompts of 2K
  and 8K tokens: how many requests fit at once is vLLM's own count (``kv_cache_max_concurrency``: its blocks over
  the blocks one request of ``max_model_len`` takes). GPT-2 then serves as many as fit; a recurrent model serves
  ``--long-factor`` times GPT-2's count (the target; its capacity is far larger, and the prefill of that many 8K
  prompts is what bounds a CPU run), and the output tokens/s of both are measured. The engine runs in-process there
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) for every model alike, so that its capacity can be read.

Every engine is float32 with vLLM's default compilation (``--eager``: ``enforce_eager``), ``max_num_batched_tokens``
``--chunk``; on a CPU vLLM's worker runs on all cores but one, which it keeps for its scheduler. Needs vLLM beside
ssmhub: ``make test-vllm`` builds ``.vllm/``; run it as ``.vllm/bin/python benchmarks/serving.py``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from _generate_floor import code_environment, generate_floor_section
from _report import write_report
from _serving_chat import chat_context, chat_section_and_targets
from _serving_models import FAMILIES, PEERS, SIZES, save_models
from _step_floor import median_rounds

OUTPUT_TOKENS = 128


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--models", nargs="+", default=FAMILIES + PEERS, choices=FAMILIES + PEERS)
    parser.add_argument("--concurrency", nargs="*", type=int, default=[1, 8, 32, 128])
    parser.add_argument("--generate-concurrency", nargs="*", type=int, default=None,
                        help="the concurrencies transformers' generate runs at (default: --concurrency)")  # fmt: skip
    parser.add_argument("--long-prompts", nargs="*", type=int, default=[2048, 8192])
    parser.add_argument("--long-factor", type=int, default=4)
    parser.add_argument("--budget-mib", type=int, default=128, help="the cache budget of the long conversations")
    parser.add_argument("--concurrency-budget-mib", type=int, default=1024, help="the cache budget of the rest")
    parser.add_argument("--step-floor", type=int, default=32, metavar="ROWS",
                        help="time each engine's decode step at ROWS running requests against its byte floor "
                             "(_step_floor; 0: skip)")  # fmt: skip
    parser.add_argument("--generate-floor", type=int, nargs="*", default=[], metavar="BATCH",
                        help="time each family's generate step at these batches against its byte floor "
                             "(_generate_floor)")  # fmt: skip
    parser.add_argument("--baseline-src", type=Path, default=None,
                        help="a checkout of the code before a change (git worktree): --generate-floor and "
                             "--step-floor measure it too, in its own processes")  # fmt: skip
    parser.add_argument("--step-floor-rounds", type=int, default=1,
                        help="--step-floor's processes this many times, every engine (and the baseline's) in turn "
                             "each round; each row the median of its rounds, its ratio to Mamba-2 the median of "
                             "each round's")  # fmt: skip
    parser.add_argument("--generate-rounds", type=int, default=1,
                        help="--generate-floor's processes this many times, this checkout's and the baseline's "
                             "in turn; each row the median of its rounds (a noisy machine's slow minutes hit "
                             "both)")  # fmt: skip
    parser.add_argument("--chat-turns", type=int, default=0, help="serve conversations of this many turns with "
                        "prefix caching (_serving_chat; 0: skip)")  # fmt: skip
    parser.add_argument("--chat-conversations", type=int, default=32)
    parser.add_argument("--chunk", type=int, default=2048, help="vLLM's max_num_batched_tokens")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--eager", action="store_true", help="vLLM's enforce_eager (default: its torch.compile)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of transformers' generate")
    parser.add_argument("--work-dir", type=Path, default=Path("runs/serving"))
    parser.add_argument("--name", default="serving")
    args = parser.parse_args(argv)
    if (
        any(c < 1 for c in args.concurrency + args.generate_floor)
        or min(args.repeats, args.long_factor, args.generate_rounds, args.step_floor_rounds) < 1
    ):
        parser.error("--concurrency, --generate-floor, --repeats, --long-factor, --generate-rounds and "
                     "--step-floor-rounds take positive integers")  # fmt: skip
    if min(args.step_floor, args.chat_turns) < 0 or args.chat_conversations < 1:
        parser.error("--step-floor and --chat-turns take integers ≥ 0, --chat-conversations a positive one")
    if args.baseline_src is not None and not (args.baseline_src / "src" / "ssmhub").is_dir():
        parser.error(f"--baseline-src must be a checkout of ssmhub (with src/ssmhub); got {args.baseline_src}")
    if args.generate_concurrency is None:
        args.generate_concurrency = args.concurrency
    return args


def prompts(count: int, vocab: int, low: int, high: int, seed: int = 0) -> list[list[int]]:
    """``count`` prompts of random token ids (never the pad id 0), lengths uniform in [low, high]."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (count,), generator=g).tolist()
    return [torch.randint(1, vocab, (n,), generator=g).tolist() for n in lengths]


def _engine(folder: Path, max_len: int, max_seqs: int, args, budget_bytes: int):
    from vllm import LLM

    return LLM(model=str(folder), dtype="float32", max_model_len=max_len, max_num_seqs=max_seqs,
               max_num_batched_tokens=args.chunk, enforce_eager=args.eager, skip_tokenizer_init=True,
               disable_log_stats=False, seed=0, kv_cache_memory_bytes=budget_bytes)  # fmt: skip


def _shutdown(llm) -> None:
    core = llm.llm_engine.engine_core
    (core.shutdown if hasattr(core, "shutdown") else lambda: None)()
    del llm
    gc.collect()


def vllm_generate(llm, token_prompts: list[list[int]]) -> dict[str, float]:
    """Output tokens/s and the median time per output token of one batch of requests submitted at once."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=OUTPUT_TOKENS, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in token_prompts], params, use_tqdm=False)
    wall = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    tpot = [(o.metrics.last_token_ts - o.metrics.first_token_ts) / (OUTPUT_TOKENS - 1) for o in outputs]
    return {"tok_s": generated / wall, "tpot_ms": 1e3 * statistics.median(tpot), "wall_s": wall}


def hf_generate(model, token_prompts: list[list[int]]) -> dict[str, float]:
    """transformers' ``generate`` over the prompts as one left-padded batch (greedy, exactly 128 new tokens)."""
    width = max(map(len, token_prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in token_prompts])  # [C, width], left-padded
    mask = (torch.arange(width) >= torch.tensor([width - len(p) for p in token_prompts])[:, None]).long()

    def run(new_tokens: int) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           do_sample=False, pad_token_id=0)  # fmt: skip
        return time.perf_counter() - start

    first, full = run(1), run(OUTPUT_TOKENS)
    return {"tok_s": len(token_prompts) * OUTPUT_TOKENS / full, "tpot_ms": 1e3 * (full - first) / (OUTPUT_TOKENS - 1),
            "wall_s": full}  # fmt: skip


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def concurrency_rows(name: str, folder: Path, args, vocab: int) -> list[dict]:
    rows = []
    if not args.concurrency:  # transformers' generate alone
        return generate_rows(name, folder, args, vocab) if name in FAMILIES else []
    llm = _engine(folder, 1024, max(args.concurrency), args, args.concurrency_budget_mib << 20)
    for c in args.concurrency:
        batch = prompts(c, vocab, 64, 512)
        vllm_generate(llm, batch)  # warm-up: compiles what this batch's shapes and guards need
        runs = [vllm_generate(llm, batch) for _ in range(args.repeats)]
        rows.append({"model": name, "engine": "vLLM", "C": c, **_median(runs)})
        print(rows[-1], flush=True)
    _shutdown(llm)
    if name in FAMILIES:
        rows += generate_rows(name, folder, args, vocab)
    return rows


def generate_rows(name: str, folder: Path, args, vocab: int) -> list[dict]:
    from transformers import AutoModelForCausalLM, MambaForCausalLM

    torch.set_num_threads(args.threads)
    model_class = MambaForCausalLM if name == "mamba-hf" else AutoModelForCausalLM  # a Mamba folder loads as SeRpEnt
    model = model_class.from_pretrained(folder).eval()
    rows = []
    for c in args.generate_concurrency:
        batch = prompts(c, vocab, 64, 512)
        hf_generate(model, batch)  # warm-up: a model's first batch of a shape fills its caches
        runs = [hf_generate(model, batch) for _ in range(args.repeats)]
        rows.append({"model": name, "engine": "generate", "C": c, **_median(runs)})
        print(rows[-1], flush=True)
    return rows


def step_floor_rows(names: list[str], folders: dict[str, Path], args, vocab: int) -> tuple[list[dict], list[dict]]:
    """Each engine's decode step at ``--step-floor`` requests against its byte floor (_step_floor), each in a
    process of its own, every engine in turn ``--step-floor-rounds`` times (a noisy machine's slow minutes hit
    all of them); with ``--baseline-src``, the code there right after this checkout's, model by model. Returns
    (this checkout's rows, the baseline's), each the median of its rounds (:func:`_step_floor.median_rounds`)."""
    arguments = json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()})
    sources = [None] if args.baseline_src is None else [None, args.baseline_src]
    rows = {src: [] for src in sources}
    for round_index in range(args.step_floor_rounds):
        for name in names:
            command = [sys.executable, str(Path(__file__).with_name("_step_floor.py")), "--folder",
                       str(folders[name]), "--name", name, "--arguments", arguments, "--vocab", str(vocab)]  # fmt: skip
            for src in sources:
                done = subprocess.run(command, stdout=subprocess.PIPE, text=True, env=code_environment(src))
                if done.returncode:
                    print(f"{name}: the step-floor run on {src or 'this checkout'} failed (exit {done.returncode}); "
                          "its row is left out", flush=True)  # fmt: skip
                    continue
                rows[src].append({**json.loads(done.stdout.strip().splitlines()[-1]), "round": round_index})
                print(src or "this checkout", rows[src][-1], flush=True)
    return median_rounds(rows[None]), median_rounds(rows[args.baseline_src]) if args.baseline_src else []


def step_floor_change_table(now: list[dict], before: list[dict]) -> list[str]:
    """This checkout's step against the baseline's, model by model (the two processes one after the other)."""
    lines = ["| model | step ms before | step ms now | tok/s now ÷ before | floor ÷ step before | floor ÷ step now |",
             "|---" * 6 + "|"]  # fmt: skip
    earlier = {r["model"]: r for r in before}
    for r in [r for r in now if r["model"] in earlier]:
        b = earlier[r["model"]]
        lines.append(f"| {r['model']} | {b['step_ms']:.1f} | {r['step_ms']:.1f} | {r['tok_s'] / b['tok_s']:.2f}× | "
                     f"{100 * b['floor_fraction']:.0f}% | {100 * r['floor_fraction']:.0f}% |")  # fmt: skip
    return lines


def step_floor_table(rows: list[dict]) -> list[str]:
    lines = ["| model | decode params | state bytes per request | step ms | model forward ms | tok/s | ÷ Mamba-2's "
             "| weight products ms | (each alone) | state pass ms | (fresh buffer) | floor ms | floor ÷ step |",
             "|---" * 13 + "|"]  # fmt: skip
    for r in rows:
        vs = "–" if r["vs_mamba2"] is None else f"{r['vs_mamba2']:.2f}×"
        low, high = r["step_range"]
        step = f"{r['step_ms']:.1f}" + (f" ({low:.1f}-{high:.1f})" if r["rounds"] > 1 else "")
        lines.append(f"| {r['model']} | {r['decode_params'] / 1e6:.2f}M | {r['state_bytes']:,} | {step} | "
                     f"{r['forward_ms']:.1f} | {r['tok_s']:.0f} | {vs} | {r['products_ms']:.2f} | "
                     f"{r['products_alone_ms']:.2f} | {r['state_ms']:.2f} | {r['state_fresh_ms']:.2f} | "
                     f"{r['floor_ms']:.2f} | "
                     f"{100 * r['floor_fraction']:.0f}% |")  # fmt: skip
    return lines


def step_floor_targets(rows: list[dict]) -> list[str]:
    """Issue 71's targets: ≥ 1.0× Mamba-2's tokens/s and ≥ 80% of the floor (70% with branches or a learned MLP)."""
    lines = []
    for r in [r for r in rows if r["model"] in FAMILIES]:
        if r["vs_mamba2"] is not None and r["model"] in ("dlr", "serpent-mamba", "h3-ssm", "h3-distilled"):
            lines.append(f"- {r['model']}: ≥ 1.0× vLLM's Mamba-2 decode tokens/s at {r['rows']} requests: "
                         f"{_check(r['vs_mamba2'] >= 1.0)} ({r['vs_mamba2']:.2f}×)")  # fmt: skip
        need = 0.7 if r["model"] in ("bdlrnn", "serpent") else 0.8
        lines.append(f"- {r['model']}: ≥ {need:.0%} of its byte floor: {_check(r['floor_fraction'] >= need)} "
                     f"({r['floor_fraction']:.0%})")  # fmt: skip
    return lines


def long_rows(names: list[str], folders: dict[str, Path], args, vocab: int) -> list[dict]:
    """Capacity in the budget and tokens/s at 2K/8K prompts; GPT-2 first, its count sets the others'."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    rows = []
    for prompt_len in args.long_prompts:
        gpt2_fit = None
        for name in sorted(names, key=lambda n: n != "gpt2"):
            max_len = prompt_len + OUTPUT_TOKENS
            llm = _engine(folders[name], max_len, 1024, args, budget_bytes=args.budget_mib << 20)
            fit = int(llm.llm_engine.vllm_config.cache_config.kv_cache_max_concurrency)
            gpt2_fit = fit if name == "gpt2" else gpt2_fit
            served = fit if name == "gpt2" or gpt2_fit is None else min(fit, args.long_factor * max(gpt2_fit, 1))
            vllm_generate(llm, prompts(8, vocab, 64, 512, seed=99))  # warm-up (compilation), short prompts
            result = vllm_generate(llm, prompts(served, vocab, prompt_len, prompt_len, seed=1)) if served else {}
            rows.append({"model": name, "prompt": prompt_len, "fit": fit, "served": served, **result})
            print(rows[-1], flush=True)
            _shutdown(llm)
    os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    return rows


def _ratio(value: float | None, base: float | None) -> str:
    return f"{value / base:.1f}×" if value and base else "–"


def concurrency_table(rows: list[dict], params: dict) -> list[str]:
    by = {(r["model"], r["engine"], r["C"]): r for r in rows}
    levels = sorted({r["C"] for r in rows})
    head = "| model | params (non-emb.) | engine | " + " | ".join(f"C={c} tok/s (ms/tok)" for c in levels)
    lines = [head + " | vLLM ÷ generate at 32 | ÷ vLLM Mamba-2 at 32 |", "|" + "---|" * (len(levels) + 5)]
    for model, engine in dict.fromkeys((r["model"], r["engine"]) for r in rows):
        cells = [f"{by[model, engine, c]['tok_s']:.0f} ({by[model, engine, c]['tpot_ms']:.1f})"
                 if (model, engine, c) in by else "–" for c in levels]  # fmt: skip
        at32 = by.get((model, engine, 32), {}).get("tok_s")
        vs_generate = _ratio(at32, by.get((model, "generate", 32), {}).get("tok_s")) if engine == "vLLM" else ""
        vs_mamba2 = _ratio(at32, by.get(("mamba2", "vLLM", 32), {}).get("tok_s")) if engine == "vLLM" else ""
        total, non_embedding = params[model]
        lines.append(f"| {model} | {total / 1e6:.2f}M ({non_embedding / 1e6:.2f}M) | {engine} | "
                     + " | ".join(cells) + f" | {vs_generate} | {vs_mamba2} |")  # fmt: skip
    return lines


def long_table(rows: list[dict]) -> list[str]:
    lines = ["| model | prompt | requests that fit | ÷ GPT-2's | served | output tok/s | ÷ GPT-2's |", "|---" * 7 + "|"]
    gpt2 = {r["prompt"]: r for r in rows if r["model"] == "gpt2"}
    for r in rows:
        base = gpt2.get(r["prompt"], {})
        fit, speed = _ratio(r["fit"], base.get("fit")), _ratio(r.get("tok_s"), base.get("tok_s"))
        lines.append(
            f"| {r['model']} | {r['prompt']} | {r['fit']} | {fit} | {r['served']} | {r.get('tok_s', 0):.0f} | {speed} |"
        )
    return lines


def _check(met: bool) -> str:
    return "**met**" if met else "**missed**"


def target_lines(rows: list[dict], long: list[dict]) -> list[str]:
    """The issue's targets, each with the measured ratio."""
    at32 = {(r["model"], r["engine"]): r["tok_s"] for r in rows if r["C"] == 32}
    lines = []
    for model in [m for m in FAMILIES if (m, "vLLM") in at32 and (m, "generate") in at32]:
        ratio = at32[model, "vLLM"] / at32[model, "generate"]
        lines.append(f"- {model}: vLLM ≥ 10× generate at 32 requests: {_check(ratio >= 10)} ({ratio:.1f}×)")
    for model in [m for m in ("dlr", "serpent-mamba") if (m, "vLLM") in at32 and ("mamba2", "vLLM") in at32]:
        ratio = at32[model, "vLLM"] / at32["mamba2", "vLLM"]
        lines.append(f"- {model}: ≥ 0.8× vLLM's Mamba-2 at 32 requests: {_check(ratio >= 0.8)} ({ratio:.2f}×)")
    gpt2 = {r["prompt"]: r for r in long if r["model"] == "gpt2" and r.get("tok_s")}
    for r in [r for r in long if r["model"] in FAMILIES and r["prompt"] in gpt2 and r.get("tok_s")]:
        base = gpt2[r["prompt"]]
        fit, speed = r["fit"] / max(base["fit"], 1), r["tok_s"] / base["tok_s"]
        lines.append(f"- {r['model']} at {r['prompt']}-token prompts: ≥ 4× GPT-2's requests {_check(fit >= 4)} "
                     f"({fit:.0f}×), ≥ 2× its tokens/s {_check(speed >= 2)} ({speed:.1f}× serving {r['served']} "
                     f"against {base['served']})")  # fmt: skip
    return lines


def main(argv=None) -> None:
    args = parse_args(argv)
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override kv_cache_memory_bytes
    size = SIZES[args.size]
    folder = args.work_dir / size.name
    longest = max(max(args.long_prompts, default=0) + OUTPUT_TOKENS, chat_context(args.chat_turns)) + 1024
    params = save_models(size, args.models, folder, longest)
    folders = {name: folder / name for name in args.models}
    rows = [row for name in args.models for row in concurrency_rows(name, folders[name], args, size.vocab)]
    sections = []
    if rows:
        head = f"## Output tokens/s (median ms per output token), {size.name}: width {size.hidden}"
        head += f", {size.layers} layers, vocabulary {size.vocab}"
        sections.append(f"{head}\n\n" + "\n".join(concurrency_table(rows, params)))
    floor, floor_before = step_floor_rows(args.models, folders, args, size.vocab) if args.step_floor else ([], [])
    if floor:
        rounds = f"; each row the median of {args.step_floor_rounds} rounds (step: its range)"
        rounds = rounds if args.step_floor_rounds > 1 else ""
        sections.append(f"## Decode step against its byte floor, {args.step_floor} running requests{rounds}\n\n"
                        + "\n".join(step_floor_table(floor)))  # fmt: skip
    if floor_before:
        sections.append(f"## Decode step before ({args.baseline_src}) and now, {args.step_floor} running requests"
                        "\n\n" + "\n".join(step_floor_change_table(floor, floor_before)))  # fmt: skip
    generate_section, generate_targets = generate_floor_section(
        [m for m in args.models if m in FAMILIES], folders, args
    )
    sections += generate_section
    long = long_rows(args.models, folders, args, size.vocab) if args.long_prompts else []
    if long:
        sections.append(
            f"## Long conversations in a {args.budget_mib} MiB cache budget\n\n" + "\n".join(long_table(long))
        )
    chat_section, chat_goals = chat_section_and_targets(args.models, folders, args, size.vocab)
    sections += chat_section
    targets = target_lines(rows, long) + step_floor_targets(floor) + generate_targets + chat_goals
    sections.append("## Targets\n\n" + "\n".join(targets))
    print("\n\n".join(sections))
    write_report(args.name, "Serving through vLLM: every family against generate, GPT-2 and Mamba-2", sections)


if __name__ == "__main__":
    main()
