"""Plain greedy vs prompt-lookup vs assisted decoding of a trained ssmhub model: tokens/s, acceptance, same tokens.

What is measured (issue 27 §2)
------------------------------
A causal LM trained by ``ssmhub-train`` (by default the PG-19 models of ``benchmarks/pg19_context.py``, ≈ 5M
parameters: what trains on this 2-core CPU in minutes) decodes ``--new-tokens`` tokens greedily, batch 1, from a
copy-heavy prompt: ``--document-tokens`` tokens of a PG-19 test book followed by the first ``--cue-tokens``
tokens of a passage from earlier in that document (a reader asked to continue a quotation). Three ways, taking
turns in each of ``--repeats`` rounds (medians reported):

- ``greedy``: ``model.generate(ids, do_sample=False)``, one token per forward through the recurrent cache;
- ``prompt lookup``: ``generate(..., prompt_lookup_num_tokens=n)``: candidates copied from the prompt after the
  last matching n-gram, verified in one forward, the cache rolled back to the accepted prefix
  (:meth:`ssmhub.RecurrentCache.crop`);
- ``assisted``: ``generate(..., assistant_model=draft)`` with a 2-layer draft of the same family and tokenizer
  (trained here by ``ssmhub-train`` if ``--draft`` does not exist).

Reported: decoding tokens/s (``generate`` continuing from a cache that absorbed the prompt, so the prefill, the
same work for every method, is not timed, as tokens/s of generation usually counts) and the ratio to greedy; the
same for the whole ``generate`` call, prefill included; verifier forwards per generated token; the acceptance rate
(accepted candidates ÷ proposed, from the forwards' lengths); and whether every method produced greedy's tokens,
both ways (they must). No method stops at an end-of-text token (:func:`without_eos`).

Run: ``python benchmarks/speculative.py`` after ``benchmarks/pg19_context.py`` has trained its models.

``--mamba-peer`` measures instead ssmhub's rollback against transformers' own (5.25) on one transformers Mamba
folder, each library decoding it greedily and with prompt lookup (:mod:`_speculative_mamba`; no trained model
needed): ``python benchmarks/speculative.py --mamba-peer --name speculative_mamba_peer``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ssmhub.data import iter_pg19_books
from ssmhub.models.cache_argument import CACHE_FIELD
from ssmhub.tokenization import encode_document

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import markdown_table, median, report, write_report
from _speculative_mamba import mamba_peer_sections

SCRIPT_NAME = "speculative"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--model", default="runs/pg19_context/dlr-windowed", help="a trained causal LM folder")
    p.add_argument("--draft", default=None, help="the assistant's folder (default: runs/speculative/<model>-draft)")
    p.add_argument("--draft-steps", type=int, default=400, help="training steps of a draft trained here")
    p.add_argument("--data-dir", default=os.environ.get("SSMHUB_DATA_DIR"), help="default $SSMHUB_DATA_DIR")
    p.add_argument("--document-tokens", type=int, default=1024)
    p.add_argument("--cue-tokens", type=int, default=16, help="the repeated passage's first tokens, ending the prompt")
    p.add_argument("--cue-at", type=float, default=0.25, help="where in the document the passage starts (fraction)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--lookup", type=int, nargs="+", default=[3, 10], help="prompt_lookup_num_tokens values")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--name", default=SCRIPT_NAME, help="results/<name>.md")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--mamba-peer", action="store_true", help="ssmhub's rollback against transformers' Mamba's")
    p.add_argument("--peer-width", type=int, default=256, help="--mamba-peer: the Mamba's hidden_size")
    p.add_argument("--peer-layers", type=int, default=4, help="--mamba-peer: its layers")
    p.add_argument("--peer-vocab", type=int, default=1024, help="--mamba-peer: its vocabulary")
    p.add_argument("--peer-prompt", type=int, default=128, help="--mamba-peer: |P|, prompt P + greedy(P)[:T/2] + P")
    return p.parse_args(argv)


class ForwardCounter:
    """Counts a model's forwards and the new tokens each one fed, from a forward pre-hook. (Wrapping
    ``model.forward`` instead would hide its signature, and with it ``logits_to_keep``, from ``generate``, which
    then computes every position's logits and records every token of a forward for rollback.)"""

    def __init__(self, model):
        self.lengths: list[int] = []
        model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.lengths.append(0 if ids is None else ids.shape[1])


def draft_model_config(model_folder: Path, run: dict) -> dict:
    """The ``--model_config`` of the target's 2-layer draft: the target's own (its run's, or, for a run that went on
    from ``--model_name_or_path``, the fields of its saved config) with 2 layers; a hybrid's draft keeps one
    attention layer, its last."""
    model_config = dict(run["model_config"])
    if run.get("model_name_or_path"):
        from transformers import AutoConfig

        from ssmhub.preflight import config_fields

        config = AutoConfig.from_pretrained(model_folder)
        fields = config_fields(type(config)) - {"architectures", "dtype", "model_type", "transformers_version"}
        model_config = {key: value for key, value in config.to_diff_dict().items() if key in fields}
    model_config["n_layer" if run["model_type"] == "gpt2" else "num_hidden_layers"] = 2
    if model_config.get("attention_layers"):
        model_config["attention_layers"] = [1]
    return model_config


def train_draft(args, model_folder: Path, draft_folder: Path) -> None:
    """A 2-layer model of the target's family, width and tokenizer, trained by ``ssmhub-train`` on the target's
    data with its optimisation settings (``--draft-steps`` steps)."""
    run = json.loads((model_folder / "train_config.json").read_text())
    model_config = draft_model_config(model_folder, run)
    options = {
        "dataset": run["dataset"], "data_dir": args.data_dir, "tokenizer": str(model_folder),
        "model_type": run["model_type"], "model_config": json.dumps(model_config), "seq_len": run["seq_len"],
        "per_device_train_batch_size": run["per_device_train_batch_size"], "learning_rate": run["learning_rate"],
        "max_steps": args.draft_steps, "warmup_steps": max(1, args.draft_steps // 10), "eval_steps": 0,
        "save_steps": 0, "logging_steps": 50, "output_dir": str(draft_folder),
        "repeat_passage_probability": run.get("repeat_passage_probability", 0.0),
    }  # fmt: skip
    command = [sys.executable, "-m", "ssmhub.training.cli", "--cpu", "--overwrite_output_dir"]
    for name, value in options.items():
        command += [f"--{name}", str(value)]
    draft_folder.mkdir(parents=True, exist_ok=True)
    with open(draft_folder.parent / f"{draft_folder.name}.log", "w") as log:
        subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=True)


def copy_heavy_prompt(args, tokenizer) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(1, P) prompt ids: a test book's first ``document_tokens`` tokens, then a passage's first ``cue_tokens``;
    the (new_tokens,) true continuation of that passage in the document; the book's id."""
    book = next(iter(iter_pg19_books("test", data_dir=args.data_dir, max_books=1)))
    ids = torch.tensor(encode_document(tokenizer, book.text)[: args.document_tokens])
    at = int(args.cue_at * len(ids))
    cue = ids[at : at + args.cue_tokens]
    truth = ids[at + args.cue_tokens : at + args.cue_tokens + args.new_tokens]
    return torch.cat([ids, cue])[None], truth, book.book_id


def methods(args, draft) -> dict[str, dict]:
    """name -> generate() keywords beside greedy's."""
    out = {"greedy": {}}
    for n in args.lookup:
        out[f"prompt lookup, n = {n}"] = {"prompt_lookup_num_tokens": n}
    out["assisted, 2-layer draft"] = {"assistant_model": draft}
    return out


@torch.inference_mode()
def decode(model, prompt: torch.Tensor, new_tokens: int, extra: dict, prefilled=None) -> tuple[torch.Tensor, float]:
    """``new_tokens`` greedy tokens after ``prompt`` (end of text does not stop them: see :func:`without_eos`), and
    the seconds ``generate`` took. With ``prefilled`` (a cache that absorbed all of ``prompt`` but its last token),
    generate continues from a fork of it (made before the clock starts): decoding alone, without the prefill."""
    if prefilled is not None:
        extra = {**extra, CACHE_FIELD: prefilled.fork()}
    start = time.perf_counter()
    out = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, **extra)
    seconds = time.perf_counter() - start
    if out.shape[1] - prompt.shape[1] != new_tokens:
        raise RuntimeError(f"generate stopped after {out.shape[1] - prompt.shape[1]} of {new_tokens} tokens")
    return out[0, prompt.shape[1] :], seconds


def without_eos(model):
    """``model`` with no end-of-text token in its generation config, so every method decodes exactly
    ``--new-tokens`` tokens. (``min_new_tokens`` would do it too, but through a logits processor that runs on
    every verified position and would be timed as part of the method.)"""
    model.generation_config.eos_token_id = None
    return model


def method_rows(runs, seconds, tokens, stats, same, new_tokens: int) -> list[list[str]]:
    """One table row per method: decoding tokens/s (prompt prefilled) and its ratio to greedy, the same with the
    prefill timed too, forwards, acceptance, whether both ways gave greedy's tokens, and every run's decoding rate."""
    rate = {key: new_tokens / median(times) for key, times in seconds.items()}
    rows = []
    for name in runs:
        forwards, accepted = stats[name]
        rows.append([
            name, f"{rate[name, 'prefilled']:.1f}", f"{rate[name, 'prefilled'] / rate['greedy', 'prefilled']:.2f}×",
            f"{rate[name, None]:.1f}", f"{rate[name, None] / rate['greedy', None]:.2f}×", f"{forwards}",
            f"{accepted:.0%}" if name != "greedy" else "-",
            "yes" if torch.equal(tokens[name], tokens["greedy"]) and same[name] else "NO",
            ", ".join(f"{new_tokens / s:.1f}" for s in seconds[name, "prefilled"]),
        ])  # fmt: skip
    return rows


def acceptance(lengths: list[int], new_tokens: int) -> tuple[int, float]:
    """Verifier forwards after the prefill, and accepted ÷ proposed candidates: a verification forward of c + 1
    tokens (the last accepted one and c candidates) proposes c; greedy needs ``new_tokens`` forwards in all, so
    each forward saved is an accepted candidate."""
    forwards = lengths[1:]  # the first forward is the prefill of the prompt
    proposed = sum(max(0, n - 1) for n in forwards)
    accepted = (new_tokens - 1) - len(forwards)  # the prefill gives the first token
    return len(forwards), (accepted / proposed if proposed else float("nan"))


@torch.inference_mode()
def verification_costs(model, prompt: torch.Tensor, sizes: list[int], repeats: int) -> dict[int, float]:
    """Median seconds of one forward of ``n`` new tokens through a prefilled cache (n = 1: a greedy step; n = c + 1:
    verifying c candidates), each from a fresh fork of the prompt's cache, for every n in ``sizes``."""
    cache = model(prompt, use_cache=True).cache
    seconds = {n: [] for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            fork, ids = cache.fork(), prompt[:, -n:]
            start = time.perf_counter()
            model(ids, cache=fork, use_cache=True, logits_to_keep=n)
            seconds[n].append(time.perf_counter() - start)
    return {n: median(values) for n, values in seconds.items()}


def cost_rows(costs: dict[int, float]) -> list[list[str]]:
    """Per candidate count c: a verification forward (c + 1 tokens) against c + 1 greedy steps, and the speed-up
    when every candidate is accepted (the ceiling; a partial acceptance adds the replay of the kept tokens)."""
    step = costs[1]
    return [
        [f"{n - 1}", f"{costs[n] * 1e3:.1f}", f"{n * step * 1e3:.1f}", f"{n * step / costs[n]:.2f}×"]
        for n in sorted(costs)
        if n > 1
    ]


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.mamba_peer:
        report(args, "Speculative decoding: ssmhub's rollback against transformers' Mamba's", mamba_peer_sections(args))
        return
    model_folder = Path(args.model)
    draft_folder = Path(args.draft or f"runs/speculative/{model_folder.name}-draft")
    if not (draft_folder / "model.safetensors").exists():
        train_draft(args, model_folder, draft_folder)
    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    model = without_eos(AutoModelForCausalLM.from_pretrained(model_folder).eval())
    draft = without_eos(AutoModelForCausalLM.from_pretrained(draft_folder).eval())
    counter = ForwardCounter(model)
    prompt, truth, book_id = copy_heavy_prompt(args, tokenizer)
    runs = methods(args, draft)
    with torch.inference_mode():
        prefilled = getattr(model(prompt[:, :-1], use_cache=True), CACHE_FIELD)
    tokens, stats, same = {}, {}, {}
    for name, extra in runs.items():  # warm-up, and the tokens and forwards of each method
        counter.lengths.clear()
        tokens[name], _ = decode(model, prompt, args.new_tokens, extra)
        stats[name] = acceptance(counter.lengths, args.new_tokens)
        same[name] = torch.equal(decode(model, prompt, args.new_tokens, extra, prefilled)[0], tokens["greedy"])
    seconds = {(name, mode): [] for name in runs for mode in (None, "prefilled")}
    for _ in range(args.repeats):
        for name, extra in runs.items():
            seconds[name, None].append(decode(model, prompt, args.new_tokens, extra)[1])
            seconds[name, "prefilled"].append(decode(model, prompt, args.new_tokens, extra, prefilled)[1])
    rows = method_rows(runs, seconds, tokens, stats, same, args.new_tokens)
    copied = (tokens["greedy"][: len(truth)] == truth).float().mean().item()
    params = sum(p.numel() for p in model.parameters())
    setup = (
        f"Model: `{model_folder}` ({model.config.model_type}, {params / 1e6:.2f}M parameters), draft `{draft_folder}` "
        f"({sum(p.numel() for p in draft.parameters()) / 1e6:.2f}M, 2 layers). Prompt: {args.document_tokens} tokens "
        f"of PG-19 test book {book_id}, then "
        f"the first {args.cue_tokens} tokens of its passage at {args.cue_at:.0%}; {args.new_tokens} new tokens, "
        f"batch 1, float32, median of {args.repeats}. Decoding tokens/s: generate continuing from a cache that "
        "absorbed the prompt (but its last token), the prefill not timed, as tokens/s usually counts generated "
        "tokens; with the prefill: the whole generate call. Greedy's tokens repeat the passage's true continuation at "
        f"{copied:.0%} of positions (how much there is to copy)."
    )
    headers = ["method", "decoding tokens/s", "vs greedy", "with the prefill: tokens/s", "vs greedy"]
    headers += ["verifier forwards", "accepted", "greedy's tokens", "decoding tokens/s per run"]
    table = markdown_table(headers, rows)
    target = max((r for r in rows if r[0].startswith("prompt lookup")), key=lambda r: float(r[1]))
    check = (
        f"- target: prompt lookup ≥ 2× greedy tokens/s with identical tokens: best {target[0]} {target[2]} "
        + ("[PASS]" if float(target[2][:-1]) >= 2 and target[7] == "yes" else "[FAIL]")
        + f" (with the {prompt.shape[1]}-token prefill in the time: {target[4]})"
    )
    costs = verification_costs(model, prompt, [1, *(n + 1 for n in args.lookup)], 5 * args.repeats)
    cost_table = markdown_table(
        ["candidates c", "verify forward (c + 1 tokens) ms", "c + 1 greedy steps ms", "speed-up if all accepted"],
        cost_rows(costs),
    )
    sections = [
        setup,
        table,
        check,
        "## What a round costs\n\nOne forward of c + 1 new tokens through the prefilled cache against c + 1 "
        f"one-token forwards (greedy: {costs[1] * 1e3:.1f} ms per token), median of {5 * args.repeats}:\n\n"
        + cost_table,
    ]
    print("\n\n".join(sections))
    if not args.no_write:
        write_report(args.name, "Speculative decoding: prompt lookup and assisted vs greedy", sections)


if __name__ == "__main__":
    main()
