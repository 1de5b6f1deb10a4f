"""Conversations through vLLM with prefix caching: each turn repeats the conversation so far and adds a message
(``benchmarks/serving.py --chat-turns``; issue 72).

``--chat-conversations`` conversations of ``--chat-turns`` turns run in one engine with prefix caching on and one
cache budget (``--budget-mib``). Turn t of every conversation is submitted at once: its prompt is the conversation's
earlier messages and answers, then a new message of :data:`MESSAGE_TOKENS` random tokens; greedy, exactly
:data:`ANSWER_TOKENS` out. Per turn: time to first token (vLLM's ``first_token_latency``, median and p90 over the
conversations: a turn's prefills share the engine, so it includes waiting for the others'), tokens prefilled
(the prompt less vLLM's ``num_cached_tokens``: what the prefix cache did not hold), output tokens/s over the turn's
wall time. How many conversations the budget holds at the last turn's length is vLLM's own count
(``kv_cache_max_concurrency`` at ``max_model_len``: its blocks over one request's).

Each engine runs in a process of its own (``python benchmarks/_serving_chat.py --folder ...``, printing its rows as
JSON lines): vLLM 0.32 cannot start a second in-process engine in one process.
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

MESSAGE_TOKENS = 512
ANSWER_TOKENS = 128


def chat_context(turns: int) -> int:
    """Tokens of a conversation's last turn, prompt and answer."""
    return turns * (MESSAGE_TOKENS + ANSWER_TOKENS)


def _message(conversation: int, turn: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(1000 * conversation + turn)
    return torch.randint(1, vocab, (MESSAGE_TOKENS,), generator=g).tolist()


def _p90(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(0.9 * len(values)))]


def run_turns(llm, conversations: int, turns: int, vocab: int, name: str) -> list[dict]:
    """Every turn of every conversation, turn by turn; one row per turn."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=ANSWER_TOKENS, temperature=0.0, ignore_eos=True)
    history = [[] for _ in range(conversations)]
    rows = []
    for turn in range(1, turns + 1):
        token_prompts = [history[c] + _message(c, turn, vocab) for c in range(conversations)]
        start = time.perf_counter()
        outputs = llm.generate([{"prompt_token_ids": p} for p in token_prompts], params, use_tqdm=False)
        wall = time.perf_counter() - start
        ttft = [1e3 * o.metrics.first_token_latency for o in outputs]
        prefilled = [len(p) - (o.num_cached_tokens or 0) for p, o in zip(token_prompts, outputs)]
        rows.append({"model": name, "turn": turn, "prompt": statistics.mean(map(len, token_prompts)),
                     "prefilled": statistics.mean(prefilled), "ttft_ms": statistics.median(ttft),
                     "ttft_p90_ms": _p90(ttft), "tok_s": conversations * ANSWER_TOKENS / wall})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
        history = [p + list(o.outputs[0].token_ids) for p, o in zip(token_prompts, outputs)]
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--arguments", required=True, help="serving.py's parsed arguments, as JSON")
    parser.add_argument("--vocab", type=int, required=True)
    args = parser.parse_args(argv)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the capacity is read from the engine's config
    from vllm import LLM

    serving = argparse.Namespace(**json.loads(args.arguments))
    conversations, turns = serving.chat_conversations, serving.chat_turns
    llm = LLM(model=str(args.folder), dtype="float32", max_model_len=chat_context(turns) + 16,
              max_num_seqs=conversations, max_num_batched_tokens=serving.chunk, enforce_eager=serving.eager,
              skip_tokenizer_init=True, disable_log_stats=False, seed=0, enable_prefix_caching=True,
              kv_cache_memory_bytes=serving.budget_mib << 20)  # fmt: skip
    cache = llm.llm_engine.vllm_config.cache_config
    fit, block = int(cache.kv_cache_max_concurrency), cache.mamba_block_size or cache.block_size
    rows = run_turns(llm, conversations, turns, args.vocab, args.name)
    print(json.dumps({"model": args.name, "fit": fit, "block": block, "turns": len(rows)}), flush=True)


def chat_rows(names: list[str], folders: dict[str, Path], args, vocab: int) -> list[dict]:
    """Each model's conversation rows (one per turn, then its capacity), each engine in a process of its own; a
    model whose engine fails keeps the turns it finished and says so."""
    arguments = json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()})
    rows = []
    for name in names:
        command = [sys.executable, __file__, "--folder", str(folders[name]), "--name", name,
                   "--arguments", arguments, "--vocab", str(vocab)]  # fmt: skip
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
        rows += [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode:
            print(f"{name}: the conversation run failed (exit {done.returncode})", flush=True)
            rows.append({"model": name, "failed": done.returncode})
    return rows


def chat_table(rows: list[dict]) -> list[str]:
    """Per model and turn: TTFT median (p90), tokens prefilled of the prompt, output tokens/s."""
    turns = sorted({r["turn"] for r in rows if "turn" in r})
    lines = ["| model | fits at the last turn | " + " | ".join(f"turn {t}" for t in turns) + " |",
             "|---" * (len(turns) + 2) + "|"]  # fmt: skip
    for model in dict.fromkeys(r["model"] for r in rows):
        by_turn = {r["turn"]: r for r in rows if r["model"] == model and "turn" in r}
        fit = next((r["fit"] for r in rows if r["model"] == model and "fit" in r), "–")
        failed = next((f" (failed, exit {r['failed']})" for r in rows if r["model"] == model and "failed" in r), "")
        cells = [f"{by_turn[t]['ttft_ms']:.0f} ({by_turn[t]['ttft_p90_ms']:.0f}) ms, {by_turn[t]['prefilled']:.0f} "
                 f"of {by_turn[t]['prompt']:.0f}, {by_turn[t]['tok_s']:.0f} tok/s" if t in by_turn else "–"
                 for t in turns]  # fmt: skip
        lines.append(f"| {model}{failed} | {fit} | " + " | ".join(cells) + " |")
    return lines


def chat_targets(rows: list[dict]) -> list[str]:
    """Issue 72's: TTFT below GPT-2's from turn 2 and flat (the last turn ≤ 1.5× turn 2); ≥ 8× GPT-2's conversations
    at the last turn; tokens prefilled ≤ the new message plus one block (the model's block size: its checkpoints'
    spacing)."""
    gpt2 = {r["turn"]: r for r in rows if r["model"] == "gpt2" and "turn" in r}
    gpt2_fit = next((r["fit"] for r in rows if r["model"] == "gpt2" and "fit" in r), None)
    lines = []
    for model in [m for m in dict.fromkeys(r["model"] for r in rows) if m != "gpt2"]:
        by_turn = {r["turn"]: r for r in rows if r["model"] == model and "turn" in r}
        later = [t for t in by_turn if t >= 2]
        if not later:
            continue
        below = all(t in gpt2 and by_turn[t]["ttft_ms"] < gpt2[t]["ttft_ms"] for t in later)
        flat = by_turn[max(later)]["ttft_ms"] / by_turn[2]["ttft_ms"]
        worst = max(by_turn[t]["prefilled"] - MESSAGE_TOKENS for t in later)  # means over the conversations
        fit, block = next(((r["fit"], r["block"]) for r in rows if r["model"] == model and "fit" in r), (None, 0))
        lines.append(f"- {model}: TTFT below GPT-2's at every turn from 2: {_check(below)}; flat (turn "
                     f"{max(later)} ÷ turn 2 ≤ 1.5×): {_check(flat <= 1.5)} ({flat:.2f}×); prefilled ≤ the new "
                     f"{MESSAGE_TOKENS} + a block of {block}: {_check(worst <= block)} ({worst:.0f} more)")  # fmt: skip
        if fit and gpt2_fit:
            lines.append(f"- {model}: ≥ 8× GPT-2's conversations at the last turn: {_check(fit >= 8 * gpt2_fit)} "
                         f"({fit} against {gpt2_fit})")  # fmt: skip
    return lines


def chat_section_and_targets(names: list[str], folders: dict[str, Path], args, vocab: int):
    """The report's section and target lines for ``--chat-turns`` (nothing when it is 0)."""
    if not args.chat_turns:
        return [], []
    rows = chat_rows(names, folders, args, vocab)
    head = (f"## Conversations with prefix caching, {args.chat_conversations} at once, {MESSAGE_TOKENS} new tokens and "
            f"{ANSWER_TOKENS} out per turn, in a {args.budget_mib} MiB cache budget: time to first token median (p90), "
            "tokens prefilled of the prompt (means), output tok/s")  # fmt: skip
    return [head + "\n\n" + "\n".join(chat_table(rows))], chat_targets(rows)


def _check(met: bool) -> str:
    return "**met**" if met else "**missed**"


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
