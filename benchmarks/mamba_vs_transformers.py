"""ssmhub's Mamba vs transformers' pure-PyTorch ``MambaForCausalLM``, same weights: training step, prefill, decode.

The issue's "Done means"
------------------------
    Scan speed: a training step (forward+backward, batch 4) of ssmhub's Mamba against transformers'
    ``MambaForCausalLM`` pure-PyTorch path on the same weights. That path's backward grows quadratically
    with length on the CPU (measured here at width 256, 4 layers: 25 tokens/s at L = 256, over a minute
    per step at L = 512), so compare at L = 64, 128 and 256 (target ≥ 20× at 256, equal outputs), and
    show ssmhub's own throughput staying flat from 256 to 4096, at least GPT-2's throughput at the same
    length and width. Prefill: the same comparison for a 4K-token prompt. Decode per-token time flat
    with context.

What is measured
----------------
Models (defaults; see the flags). float32, CPU, ``torch.set_num_threads(--threads)`` (default 1):

- **transformers Mamba**: ``MambaForCausalLM(MambaConfig(hidden_size=256, num_hidden_layers=4, state_size=16,
  expand=2, vocab_size=8192, use_mambapy=False))``, random initialization under ``torch.manual_seed(--seed)``.
  Without ``mamba_ssm`` / ``causal_conv1d`` installed (they are not, on this CPU machine) every kernel falls
  back to transformers' reference PyTorch code: a Python loop over the sequence for the scan.
- **ssmhub Mamba**: ``ssmhub.convert_mamba_checkpoint(that model)``, a ``SerpentForCausalLM`` with
  ``resampling_rates=[]``, i.e. the same function with the same weights (chunked parallel selective scan).
- **GPT-2** (section 2 only): transformers' ``GPT2LMHeadModel``, n_embd 256, 4 layers, 4 heads, MLP 1024
  (GPT-2's 4×), n_positions = the longest length, all dropouts 0 (so SDPA can use its fused causal kernel),
  the same vocabulary.
- **SeRpEnt** (section 4 only): ``SerpentForCausalLM`` with ``resampling_rates=[0.5, 0.1]`` and hidden
  255 = 3 × 85 (three branches of 85), otherwise the same shape, random initialization.

1. *Training step, same weights.* Both Mambas in ``train()`` mode. For each L in ``--train-lens`` (64, 128,
   256): a batch of ``--batch`` (4) random ids; one step = ``zero_grad(set_to_none=True)``, forward with
   ``labels=ids`` (the loss), ``loss.backward()``; wall time of forward + backward. The first step on each
   length is an untimed warm-up, run by both models on the same batch and used for the "equal outputs"
   check: |Δ loss|, max |Δ logits| and, for the gradients, max |g_ssmhub − g_transformers| / max
   |g_transformers| per parameter (parameter names mapped with the converter's
   ``mamba_state_dict_to_serpent``). Then ``--repeats`` timed steps, interleaved (ssmhub, transformers,
   ssmhub, ...); the median is reported. Before each length, transformers' step time is predicted from
   the previous length as t × (L / L_prev)² (its backward is quadratic); if that exceeds ``--step-limit``
   (120 s) it is not run at that length. The prediction is optimistic (measured: 2.5 s at L = 128, 52 s at
   L = 256, predicted 10 s), so it only keeps runs like L = 512 (predicted ≥ 200 s) from starting.
2. *Throughput vs length.* ssmhub's Mamba and GPT-2 in ``train()`` mode, forward (loss) + backward at
   each L in ``--throughput-lens`` (256, 1K, 4K) with batch = max(1, ``--tokens-per-step`` // L) (1024:
   batch 4 / 1 / 1), one warm-up step each, then ``--repeats`` interleaved timed steps; tokens/s =
   batch × L / median step time.
3. *Prefill.* Both Mambas in ``eval()`` mode under ``torch.no_grad()``: a ``--prefill-len`` (4096) random
   prompt, batch 1, ``use_cache=True, logits_to_keep=1``. One untimed run of each on the same prompt
   checks the final logits (max |Δ|), then ``--repeats`` interleaved timed runs (ssmhub through
   ``decode_vs_context.recurrent_prefill``, transformers through the same call with its own cache).
4. *Decode.* For each context in ``--decode-contexts`` (128, 1K, 4K), batch 1, ``torch.no_grad()``: each
   model prefills its context (the two Mambas the same ids), then greedy next-token steps through its cache
   (ssmhub's ``RecurrentCache`` via ``decode_vs_context.recurrent_decode``; transformers' Mamba via
   ``cache_params``). The first step feeds the same token to both Mambas and compares their logits; then
   ``--decode-warmup`` untimed steps each, then ``--decode-repeats`` interleaved blocks of
   ``--decode-steps`` (32) steps; ms/token = median over blocks of block time / steps. Cache memory:
   ``RecurrentCache.memory_bytes()`` (ssmhub) and the bytes of the conv and SSM state tensors of
   transformers' cache, after decoding.

The machine is shared with other jobs, so timings are noisy; every time reported is a median.

Run: ``python benchmarks/mamba_vs_transformers.py`` (about 5 minutes on 2 shared CPU cores, over half of it
transformers' training steps at L = 256) or ``--quick`` (tiny sizes, well under a minute; prints only and
does not write the results file).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, MambaConfig, MambaForCausalLM
from transformers.utils import logging as hf_logging

import ssmhub
from ssmhub.models.cache_argument import CACHE_FIELD
from ssmhub.models.serpent.convert_mamba import mamba_state_dict_to_serpent

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import markdown_table, median, write_report
from decode_vs_context import check_line, handover_check, num_params, recurrent_decode, recurrent_prefill, timed

SCRIPT_NAME = "mamba_vs_transformers"
MB = 1e6

FULL = dict(
    hidden=256,
    layers=4,
    state_size=16,
    vocab_size=8192,
    heads=4,
    batch=4,
    train_lens=[64, 128, 256],
    throughput_lens=[256, 1024, 4096],
    tokens_per_step=1024,
    prefill_len=4096,
    decode_contexts=[128, 1024, 4096],
    decode_steps=32,
    decode_repeats=3,
    decode_warmup=2,
    repeats=3,
)
QUICK = dict(
    hidden=32,
    layers=2,
    state_size=8,
    vocab_size=256,
    heads=4,
    batch=2,
    train_lens=[16, 32],
    throughput_lens=[32, 128],
    tokens_per_step=128,
    prefill_len=256,
    decode_contexts=[16, 64],
    decode_steps=4,
    decode_repeats=2,
    decode_warmup=1,
    repeats=1,
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, seconds-long smoke run; prints only")
    p.add_argument("--hidden", type=int, help="hidden_size = GPT-2 n_embd (256)")
    p.add_argument("--layers", type=int, help="num_hidden_layers = GPT-2 n_layer (4)")
    p.add_argument("--state-size", type=int, help="Mamba state size N (16)")
    p.add_argument("--vocab-size", type=int, help="vocabulary of every model (8192)")
    p.add_argument("--heads", type=int, help="GPT-2 n_head (4)")
    p.add_argument("--batch", type=int, help="batch of the section-1 training step (4)")
    p.add_argument("--train-lens", type=int, nargs="+", help="section 1 lengths (64 128 256)")
    p.add_argument("--throughput-lens", type=int, nargs="+", help="section 2 lengths (256 1024 4096)")
    p.add_argument("--tokens-per-step", type=int, help="section 2: batch = max(1, this // L) (1024)")
    p.add_argument("--prefill-len", type=int, help="section 3 prompt length (4096)")
    p.add_argument("--decode-contexts", type=int, nargs="+", help="section 4 contexts (128 1024 4096)")
    p.add_argument("--decode-steps", type=int, help="decode steps per timed block (32)")
    p.add_argument("--decode-repeats", type=int, help="timed decode blocks per model and context (3)")
    p.add_argument("--decode-warmup", type=int, help="untimed decode steps per model and context (2)")
    p.add_argument("--repeats", type=int, help="timed steps / prefills per model and length, sections 1-3 (3)")
    p.add_argument("--step-limit", type=float, default=120.0, help="skip transformers' step if predicted over (s)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-write", action="store_true", help="print only; do not write the results file")
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.quick:
        args.no_write = True
    return args


# --------------------------------------------------------------------------------------------- models
def build_mambas(args) -> tuple[MambaForCausalLM, ssmhub.SerpentForCausalLM]:
    """transformers' Mamba (pure-PyTorch path) and ssmhub's conversion of it (same weights)."""
    torch.manual_seed(args.seed)
    config = MambaConfig(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        state_size=args.state_size,
        expand=2,
        vocab_size=args.vocab_size,
        use_mambapy=False,
    )
    hf = MambaForCausalLM(config)
    return hf, ssmhub.convert_mamba_checkpoint(hf)


def build_serpent(args) -> ssmhub.SerpentForCausalLM:
    """A SeRpEnt with resampling branches κ = 0.5, 0.1 (hidden rounded down to a multiple of 3 branches)."""
    torch.manual_seed(args.seed + 1)
    config = ssmhub.SerpentConfig(
        vocab_size=args.vocab_size,
        hidden_size=(args.hidden // 3) * 3,
        num_hidden_layers=args.layers,
        state_size=args.state_size,
        expand=2,
        resampling_rates=[0.5, 0.1],
    )
    return ssmhub.SerpentForCausalLM(config)


def build_gpt2(args, n_positions: int) -> GPT2LMHeadModel:
    config = GPT2Config(
        n_embd=args.hidden,
        n_layer=args.layers,
        n_head=args.heads,
        n_positions=n_positions,
        vocab_size=args.vocab_size,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="sdpa",
    )
    return GPT2LMHeadModel(config)


# --------------------------------------------------------------------------------------------- steps
def train_step(model, ids: torch.Tensor):
    """One forward (loss) + backward; returns (seconds, output)."""
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    out = model(ids, labels=ids)
    out.loss.backward()
    return time.perf_counter() - start, out


def grad_differences(hf, ours) -> dict[str, float]:
    """max |g_ours − g_hf| / max |g_hf| per parameter, under the converter's name mapping."""
    hf_grads = {name: p.grad for name, p in hf.named_parameters() if p.grad is not None}
    ours_params = dict(ours.named_parameters())
    diffs = {}
    for hf_name, (name, grad) in zip(hf_grads, mamba_state_dict_to_serpent(hf_grads).items(), strict=True):
        if name not in ours_params or ours_params[name].grad is None:
            raise RuntimeError(f"no ssmhub gradient for {hf_name} (mapped to {name})")
        scale = grad.abs().max().clamp_min(1e-30)
        diffs[hf_name] = ((ours_params[name].grad - grad).abs().max() / scale).item()
    return diffs


# transformers' Mamba took and returned its cache as `cache_params` before 5.24 renamed it `cache`
MAMBA_CACHE_FIELD = "cache" if CACHE_FIELD == "cache" else "cache_params"


def mamba_prefill(model, ctx: int, generator: torch.Generator):
    """transformers' Mamba counterpart of ``recurrent_prefill``: its cache and the next token."""
    ids = torch.randint(0, model.config.vocab_size, (1, ctx), generator=generator)
    out = model(ids, use_cache=True, logits_to_keep=1)
    return getattr(out, MAMBA_CACHE_FIELD), out.logits[:, -1].argmax(-1, keepdim=True)


def mamba_decode(model, cache, token: torch.Tensor, steps: int) -> torch.Tensor:
    """transformers' Mamba counterpart of ``recurrent_decode``."""
    for _ in range(steps):
        out = model(token, use_cache=True, **{MAMBA_CACHE_FIELD: cache})
        token = out.logits[:, -1].argmax(-1, keepdim=True)
    return token


def mamba_cache_bytes(cache) -> int:
    """Bytes of the conv and SSM state tensors of transformers' Mamba cache."""
    total = 0
    for layer in getattr(cache, "layers", []):
        for states in (getattr(layer, "conv_states", {}), getattr(layer, "recurrent_states", {})):
            for t in states.values():
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
    return total


def fmt_list(values, spec: str = ".3g") -> str:
    return ", ".join(format(v, spec) for v in values)


# --------------------------------------------------------------------------------------------- 1. training step
def train_compare(hf, ours, ids: torch.Tensor) -> dict:
    """The untimed warm-up step of both Mambas on ``ids``, their outputs compared: |Δ loss|, max |Δ logits|,
    per-parameter gradient differences, and transformers' warm-up seconds."""
    _, out_ours = train_step(ours, ids)
    hf_warm, out_hf = train_step(hf, ids)
    return {
        "dloss": abs(out_ours.loss.item() - out_hf.loss.item()),
        "dlogits": (out_ours.logits - out_hf.logits).abs().max().item(),
        "grads": grad_differences(hf, ours),
        "hf_warm": hf_warm,
    }


def train_length(args, hf, ours, ids: torch.Tensor, predicted: float | None) -> tuple[dict, list, list]:
    """One length: the warm-up (and comparison, where transformers runs), then ``--repeats`` interleaved timed
    steps; transformers is left out where its predicted or warm-up step is over ``--step-limit``."""
    run_hf = predicted is None or predicted <= args.step_limit
    r = {"predicted": predicted, "run_hf": run_hf, **(train_compare(hf, ours, ids) if run_hf else {})}
    if not run_hf:
        train_step(ours, ids)
    ours_s, hf_s = [], []
    hf_repeats = args.repeats if run_hf and r["hf_warm"] <= args.step_limit else 0
    for i in range(args.repeats):
        ours_s.append(train_step(ours, ids)[0])
        if i < hf_repeats:
            hf_s.append(train_step(hf, ids)[0])
    if run_hf and not hf_s:  # the warm-up step alone was over the limit: report it as the only run
        hf_s = [r["hf_warm"]]
    r["ours_s"], r["hf_s"] = median(ours_s), (median(hf_s) if hf_s else None)
    return r, ours_s, hf_s


def training_row(args, L: int, r: dict) -> list:
    """The training table's row of length ``L``."""
    tokens = args.batch * L
    ours_tps = tokens / r["ours_s"]
    if r["hf_s"] is None:
        why = f"not run (predicted {r['predicted']:.0f} s/step > {args.step_limit:.0f} s)"
        return [L, f"{r['ours_s']:.3g}", why, f"{ours_tps:,.0f}", "-", "-", "-", "-", "-"]
    hf_tps, grads = tokens / r["hf_s"], r["grads"]
    return [
        L,
        f"{r['ours_s']:.3g}",
        f"{r['hf_s']:.3g}",
        f"{ours_tps:,.0f}",
        f"{hf_tps:,.1f}",
        f"**{ours_tps / hf_tps:.1f}×**",
        f"{r['dloss']:.1e}",
        f"{r['dlogits']:.1e}",
        f"{max(grads.values()):.1e}",
    ]


TRAINING_HEADERS = [
    "L",
    "ssmhub s/step",
    "transformers s/step",
    "ssmhub tok/s",
    "transformers tok/s",
    "speed-up (ssmhub ÷ transformers)",
    "|Δ loss|",
    "max |Δ logits|",
    "max grad rel. diff (all params)",
]


def gradient_table(args, results: dict) -> str:
    """Per-parameter gradient agreement of the embedding and the first and last layers' mixers, per length run."""
    layers = sorted({0, args.layers - 1})
    picks = ["backbone.embeddings.weight"] + [
        f"backbone.layers.{i}.mixer.{p}" for i in layers for p in ("in_proj.weight", "A_log", "dt_proj.weight", "D")
    ]
    ran = [L for L, r in results.items() if "grads" in r]
    if not ran:
        return ""
    rows = [[f"`{name}`", *(f"{results[L]['grads'][name]:.1e}" for L in ran)] for name in picks]
    return markdown_table(["transformers parameter", *(f"L={L}" for L in ran)], rows)


def section_training(args, hf, ours, gen):
    """Section 1: a training step of both Mambas on the same weights, per ``--train-lens``."""
    hf.train()
    ours.train()
    rows, detail, results = [], [], {}
    prev = None  # (L, transformers step seconds) of the last length transformers ran at
    for L in sorted(set(args.train_lens)):
        ids = torch.randint(0, args.vocab_size, (args.batch, L), generator=gen)
        predicted = None if prev is None else prev[1] * (L / prev[0]) ** 2
        results[L], ours_s, hf_s = train_length(args, hf, ours, ids, predicted)
        if hf_s:
            prev = (L, results[L]["hf_s"])
        rows.append(training_row(args, L, results[L]))
        predicted_text = f"{predicted:.1f}" if predicted is not None else "-"
        detail.append([L, fmt_list(ours_s), fmt_list(hf_s) if hf_s else "-", predicted_text])
        print("  train | " + " | ".join(str(c) for c in rows[-1]), flush=True)
    detail_table = markdown_table(
        ["L", "ssmhub s/step per repeat", "transformers s/step per repeat", "transformers predicted s/step"], detail
    )
    return results, markdown_table(TRAINING_HEADERS, rows), gradient_table(args, results), detail_table


# --------------------------------------------------------------------------------------------- 2. throughput
def throughput_length(args, ours, gpt2, L: int, gen) -> tuple[dict, list]:
    """One length: a warm-up step each, then ``--repeats`` interleaved timed steps; tokens/s and the detail row."""
    batch = max(1, args.tokens_per_step // L)
    ids = torch.randint(0, args.vocab_size, (batch, L), generator=gen)
    train_step(ours, ids)
    train_step(gpt2, ids)
    ours_s, gpt2_s = [], []
    for _ in range(args.repeats):
        ours_s.append(train_step(ours, ids)[0])
        gpt2_s.append(train_step(gpt2, ids)[0])
    r = {"ours_tps": batch * L / median(ours_s), "gpt2_tps": batch * L / median(gpt2_s), "batch": batch}
    return r, [L, batch, fmt_list(ours_s), fmt_list(gpt2_s)]


def throughput_rows(results: dict, lens: list[int]) -> list[list]:
    """The throughput table, each length's tokens/s also relative to the shortest length's (``flat``, set here)."""
    rows = []
    for L in lens:
        r = results[L]
        r["flat"] = r["ours_tps"] / results[lens[0]]["ours_tps"]
        ratio = r["ours_tps"] / r["gpt2_tps"]
        rows.append([L, r["batch"], f"{r['ours_tps']:,.0f}", f"{r['gpt2_tps']:,.0f}", f"**{ratio:.2f}×**"])
        rows[-1].append(f"{r['flat']:.2f}")
        print("  throughput | " + " | ".join(str(c) for c in rows[-1]), flush=True)
    return rows


def section_throughput(args, ours, gen):
    """Section 2: training tokens/s of ssmhub's Mamba and GPT-2 of the same width and depth, per length."""
    lens = sorted(set(args.throughput_lens))
    gpt2 = build_gpt2(args, max(lens)).train()
    if gpt2.config._attn_implementation != "sdpa":
        raise RuntimeError(f"GPT-2 runs with {gpt2.config._attn_implementation!r} attention, not sdpa")
    ours.train()
    results, detail = {}, []
    for L in lens:
        results[L], detail_row = throughput_length(args, ours, gpt2, L, gen)
        detail.append(detail_row)
    rows = throughput_rows(results, lens)
    headers = [
        "L",
        "batch",
        "ssmhub Mamba tok/s",
        "GPT-2 tok/s",
        "ssmhub ÷ GPT-2",
        f"ssmhub tok/s ÷ its L={lens[0]} value",
    ]
    detail_table = markdown_table(["L", "batch", "ssmhub s/step per repeat", "GPT-2 s/step per repeat"], detail)
    return results, markdown_table(headers, rows), detail_table, num_params(gpt2)


# --------------------------------------------------------------------------------------------- 3. prefill
PREFILL_HEADERS = [
    "prompt",
    "ssmhub s",
    "transformers s",
    "ssmhub tok/s",
    "transformers tok/s",
    "speed-up (ssmhub ÷ transformers)",
    "final logits max |Δ|",
    "same next token",
]


def prefill_agreement(hf, ours, ids: torch.Tensor) -> tuple[float, bool]:
    """Max |Δ| of the two Mambas' final logits after prefilling ``ids``, and whether their next tokens agree."""
    last_ours = ours(ids, use_cache=True, logits_to_keep=1).logits[:, -1]
    last_hf = hf(ids, use_cache=True, logits_to_keep=1).logits[:, -1]
    return (last_ours - last_hf).abs().max().item(), bool((last_ours.argmax(-1) == last_hf.argmax(-1)).all())


def section_prefill(args, hf, ours, seed: int):
    """Section 3: prefill of one ``--prefill-len`` prompt by both Mambas (no grad, use_cache)."""
    hf.eval()
    ours.eval()
    n = args.prefill_len
    with torch.no_grad():
        ids = torch.randint(0, args.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed))
        dlogits, same_token = prefill_agreement(hf, ours, ids)
        ours_s, hf_s = [], []
        for i in range(args.repeats):  # the same prompt every time: a fresh generator per run
            ours_s.append(timed(recurrent_prefill, ours, n, torch.Generator().manual_seed(seed + i))[0])
            hf_s.append(timed(mamba_prefill, hf, n, torch.Generator().manual_seed(seed + i))[0])
    r = {"ours_s": median(ours_s), "hf_s": median(hf_s), "dlogits": dlogits, "same_token": same_token}
    row = [n, f"{r['ours_s']:.3g}", f"{r['hf_s']:.3g}", f"{n / r['ours_s']:,.0f}", f"{n / r['hf_s']:,.0f}"]
    row += [f"**{r['hf_s'] / r['ours_s']:.1f}×**", f"{dlogits:.1e}", "yes" if same_token else "NO"]
    print("  prefill | " + " | ".join(str(c) for c in row), flush=True)
    detail = f"Per repeat (s): ssmhub {fmt_list(ours_s)}; transformers {fmt_list(hf_s)}."
    return r, markdown_table(PREFILL_HEADERS, [row]), detail


# --------------------------------------------------------------------------------------------- 4. decode
DECODE_HEADERS = [
    "context",
    "ssmhub Mamba ms/token",
    "transformers Mamba ms/token",
    "SeRpEnt [0.5, 0.1] ms/token",
    "transformers ÷ ssmhub",
    "ssmhub Mamba cache MB",
    "transformers cache MB",
    "SeRpEnt cache MB",
    "first step max |Δ logits| (Mambas)",
]
DECODE_DETAIL_HEADERS = [
    "context",
    "prefill s, 1 run (ssmhub / transformers / SeRpEnt)",
    "ssmhub ms/token per repeat",
    "transformers ms/token per repeat",
    "SeRpEnt ms/token per repeat",
]


def prefill_all(models: dict, ctx: int, seed: int) -> tuple[dict, dict]:
    """Each model (``ours``, ``hf``, ``serpent``) prefills the same ``ctx`` random tokens, timed once: seconds,
    and (cache, next token) per model."""
    prefills = {"ours": recurrent_prefill, "hf": mamba_prefill, "serpent": recurrent_prefill}
    seconds, states = {}, {}
    for key, prefill in prefills.items():
        seconds[key], states[key] = timed(prefill, models[key], ctx, torch.Generator().manual_seed(seed + ctx))
    return seconds, states


def first_step_difference(models: dict, states: dict) -> float:
    """Feeds ssmhub Mamba's prefill token to both Mambas' caches; max |Δ| of their logits. Each Mamba's state
    entry moves on to its own greedy token."""
    (ours_cache, ours_tok), (hf_cache, _) = states["ours"], states["hf"]
    a = models["ours"](ours_tok, cache=ours_cache, use_cache=True).logits[:, -1]
    b = models["hf"](ours_tok, use_cache=True, **{MAMBA_CACHE_FIELD: hf_cache}).logits[:, -1]
    states["ours"], states["hf"] = (ours_cache, a.argmax(-1, keepdim=True)), (hf_cache, b.argmax(-1, keepdim=True))
    return (a - b).abs().max().item()


def decode_blocks(args, models: dict, states: dict) -> dict[str, list[float]]:
    """``--decode-warmup`` untimed steps, then ``--decode-repeats`` timed blocks of ``--decode-steps`` per model,
    interleaved; ms/token per block and model."""
    decoders = {"ours": recurrent_decode, "hf": mamba_decode, "serpent": recurrent_decode}
    tokens = {
        key: decoders[key](models[key], cache, token, args.decode_warmup) for key, (cache, token) in states.items()
    }
    ms = {key: [] for key in decoders}
    for _ in range(args.decode_repeats):
        for key, decode in decoders.items():
            seconds, tokens[key] = timed(decode, models[key], states[key][0], tokens[key], args.decode_steps)
            ms[key].append(1e3 * seconds / args.decode_steps)
    return ms


def decode_context(args, models: dict, ctx: int, seed: int) -> tuple[dict, list, list]:
    """One context: prefill, the first step compared, the timed decode; its results, row and detail row."""
    prefill_s, states = prefill_all(models, ctx, seed)
    same_prefill_token = bool((states["ours"][1] == states["hf"][1]).all())
    after_prefill = {"ours": states["ours"][0].memory_bytes(), "serpent": states["serpent"][0].memory_bytes()}
    dlogits = first_step_difference(models, states)
    ms = decode_blocks(args, models, states)
    r = {key: median(values) for key, values in ms.items()}
    r["mem_ours"], r["mem_serpent"] = states["ours"][0].memory_bytes(), states["serpent"][0].memory_bytes()
    r["mem_hf"] = mamba_cache_bytes(states["hf"][0])
    r["mem_changed"] = after_prefill != {"ours": r["mem_ours"], "serpent": r["mem_serpent"]}
    r["dlogits"], r["same_prefill_token"] = dlogits, same_prefill_token
    row = [ctx, f"{r['ours']:.2f}", f"{r['hf']:.2f}", f"{r['serpent']:.2f}", f"{r['hf'] / r['ours']:.1f}×"]
    row += [f"{r[key] / MB:.3f}" for key in ("mem_ours", "mem_hf", "mem_serpent")] + [f"{dlogits:.1e}"]
    prefill_text = f"{prefill_s['ours']:.3g} / {prefill_s['hf']:.3g} / {prefill_s['serpent']:.3g}"
    return r, row, [ctx, prefill_text, *(fmt_list(ms[key]) for key in ("ours", "hf", "serpent"))]


def section_decode(args, hf, ours, serpent, seed: int):
    """Section 4: per-token decode time and cache memory of both Mambas and SeRpEnt, per ``--decode-contexts``."""
    models = {"ours": ours.eval(), "hf": hf.eval(), "serpent": serpent.eval()}
    rows, detail, results = [], [], {}
    with torch.no_grad():
        for ctx in sorted(set(args.decode_contexts)):
            results[ctx], row, detail_row = decode_context(args, models, ctx, seed)
            rows.append(row)
            detail.append(detail_row)
            print("  decode | " + " | ".join(str(c) for c in row), flush=True)
    return results, markdown_table(DECODE_HEADERS, rows), markdown_table(DECODE_DETAIL_HEADERS, detail)


# --------------------------------------------------------------------------------------------- checks
def training_checks(train: dict) -> list[str]:
    """The training-step speed-up (target ≥ 20× at L 256, or the longest length transformers ran) and equal
    outputs."""
    ran = [L for L, r in train.items() if r["hf_s"] is not None]
    if not ran:
        return []
    target_L = 256 if 256 in ran else max(ran)
    r = train[target_L]
    speedup = r["hf_s"] / r["ours_s"]
    checked = [L for L in ran if "grads" in train[L]]
    dloss = max(train[L]["dloss"] for L in checked)
    dlogits = max(train[L]["dlogits"] for L in checked)
    dgrad = max(max(train[L]["grads"].values()) for L in checked)
    return [
        check_line(
            f"training step at L={target_L}: ssmhub ≥ 20× transformers' pure-PyTorch Mamba",
            speedup >= 20,
            f"{r['ours_s']:.3g} s vs {r['hf_s']:.3g} s per step = {speedup:.1f}×",
        ),
        check_line(
            "equal outputs in training (|Δ loss| ≤ 1e-4, max |Δ logits| ≤ 1e-3, every gradient's max relative "
            f"difference ≤ 1e-3; L = {', '.join(map(str, checked))})",
            dloss <= 1e-4 and dlogits <= 1e-3 and dgrad <= 1e-3,
            f"{dloss:.1e}, {dlogits:.1e}, {dgrad:.1e}",
        ),
    ]


def throughput_checks(tput: dict) -> list[str]:
    """ssmhub's training throughput flat with length and at least GPT-2's."""
    lens = sorted(tput)
    lo, hi = lens[0], lens[-1]
    return [
        check_line(
            f"ssmhub's training throughput flat from L={lo} to {hi} (every length within 0.8-1.25× of L={lo})",
            all(0.8 <= tput[L]["flat"] <= 1.25 for L in lens),
            ", ".join(f"L={L}: {tput[L]['ours_tps']:,.0f} tok/s ({tput[L]['flat']:.2f}×)" for L in lens),
        ),
        check_line(
            "ssmhub's training throughput ≥ GPT-2's at every length",
            all(tput[L]["ours_tps"] >= tput[L]["gpt2_tps"] for L in lens),
            ", ".join(f"L={L}: {tput[L]['ours_tps'] / tput[L]['gpt2_tps']:.2f}×" for L in lens),
        ),
    ]


def prefill_check(args, prefill: dict) -> list[str]:
    """ssmhub's prefill faster than transformers' with equal final logits."""
    return [
        check_line(
            f"prefill of {args.prefill_len} tokens: ssmhub faster than transformers, final logits equal (≤ 1e-3)",
            prefill["ours_s"] < prefill["hf_s"] and prefill["dlogits"] <= 1e-3,
            f"{prefill['hf_s'] / prefill['ours_s']:.1f}× faster, max |Δ| {prefill['dlogits']:.1e}",
        )
    ]


def decode_checks(decode: dict) -> list[str]:
    """Decode time flat with context, cache memory constant, and the two Mambas' first-step logits equal."""
    ctxs = sorted(decode)
    c_lo, c_hi = ctxs[0], ctxs[-1]
    lines = []
    for key, label in (("ours", "ssmhub Mamba"), ("hf", "transformers Mamba"), ("serpent", "SeRpEnt [0.5, 0.1]")):
        growth = decode[c_hi][key] / decode[c_lo][key]
        name = f"{label} decode ms/token flat with context (ctx {c_hi} within 1.2× of ctx {c_lo})"
        lines.append(
            check_line(name, growth <= 1.2, f"{decode[c_hi][key]:.2f} vs {decode[c_lo][key]:.2f} ms = {growth:.2f}×")
        )
    for key, label in (("mem_ours", "ssmhub Mamba"), ("mem_serpent", "SeRpEnt")):
        sizes = sorted({decode[c][key] for c in ctxs})
        changed = any(decode[c]["mem_changed"] for c in ctxs)
        name = f"{label} cache memory identical at every context, after prefill and after decoding"
        lines.append(check_line(name, len(sizes) == 1 and not changed, ", ".join(f"{s:,} B" for s in sizes)))
    worst = max(decode[c]["dlogits"] for c in ctxs)
    same = all(decode[c]["same_prefill_token"] for c in ctxs)
    lines.append(
        check_line(
            "decode: same logits from the two Mambas' caches (first step after each prefill, ≤ 1e-3)",
            worst <= 1e-3 and same,
            f"max |Δ| {worst:.1e}; same greedy token after prefill at every context: {'yes' if same else 'NO'}",
        )
    )
    return lines


# --------------------------------------------------------------------------------------------- report
def model_notes(args, hf, serpent, gpt2_params: int) -> str:
    """The note on the three models' shapes and parameter counts."""
    mcfg, scfg = hf.config, serpent.config
    return (
        f"- Models: Mamba hidden {mcfg.hidden_size}, {mcfg.num_hidden_layers} layers, state {mcfg.state_size}, expand "
        f"{mcfg.expand} (inner {mcfg.intermediate_size}), Δ rank {mcfg.time_step_rank}, conv {mcfg.conv_kernel}, vocab "
        f"{mcfg.vocab_size}, tied LM head: {num_params(hf):,} parameters in both implementations. GPT-2: n_embd "
        f"{args.hidden}, {args.layers} layers, {args.heads} heads, MLP {4 * args.hidden}, n_positions "
        f"{max(args.throughput_lens)}, dropout 0, sdpa: {gpt2_params:,} parameters. SeRpEnt: hidden "
        f"{scfg.hidden_size} ({scfg.num_branches} branches of {scfg.branch_size}), resampling_rates "
        f"{list(scfg.resampling_rates)}, window {scfg.resampling_window}: {num_params(serpent):,} parameters. "
        "All randomly initialized (seeded)."
    )


def notes_text(args, models: tuple, run: dict) -> str:
    """The notes: machine load, models, transformers' path, batch sizes, the handover check, threads and times."""
    seconds = run["seconds"]
    return "\n".join(
        [
            "- **The machine is shared with other jobs**: timings are noisy. Every time reported is a median "
            "(sections 1-3: over the timed steps/runs; section 4: over blocks of steps); the per-repeat numbers "
            "are at the end.",
            model_notes(args, models[0], models[2], run["gpt2_params"]),
            "- transformers' Mamba runs its reference PyTorch path: `use_mambapy=False`, and neither `mamba_ssm` nor "
            "`causal_conv1d` is installed, so the scan is a Python loop over positions (backward quadratic in L).",
            f"- Throughput tokens per step: batch = max(1, {args.tokens_per_step} // L).",
            "- Prefill -> step-decoding handover (48-token prompt, 8 steps; max |logit diff| vs a full forward): "
            + ", ".join(f"{k} {v:.1e}" for k, v in run["handover"].items())
            + ".",
            f"- Threads: `torch.set_num_threads({args.threads})`. Section wall times: training {seconds['train']:.0f} "
            f"s, throughput {seconds['tput']:.0f} s, prefill {seconds['prefill']:.0f} s, decode "
            f"{seconds['decode']:.0f} s; whole script {seconds['wall']:.0f} s.",
        ]
    )


def run_sections(args, hf, ours, serpent, gen, script_start: float) -> dict:
    """The four sections and the handover check; each section's wall time, and the script's, in ``seconds``."""
    run, seconds = {}, {}
    steps = {
        "train": lambda: section_training(args, hf, ours, gen),
        "tput": lambda: section_throughput(args, ours, gen),
        "prefill": lambda: section_prefill(args, hf, ours, args.seed + 1),
    }
    for key, step in steps.items():
        seconds[key], run[key] = timed(step)
    with torch.no_grad():
        run["handover"] = {
            "ssmhub Mamba": handover_check(ours.eval(), gen),
            "SeRpEnt": handover_check(serpent.eval(), gen),
        }
    seconds["decode"], run["decode"] = timed(section_decode, args, hf, ours, serpent, args.seed + 2)
    run["gpt2_params"] = run["tput"][3]
    run["seconds"] = {**seconds, "wall": time.perf_counter() - script_start}
    return run


def report_sections(args, run: dict, checks: list[str], notes: str) -> list[str]:
    """The results file's sections, in order."""
    _, train_table, grad_table, train_detail = run["train"]
    _, tput_table, tput_detail, _ = run["tput"]
    _, prefill_table, prefill_detail = run["prefill"]
    _, decode_table, decode_detail = run["decode"]
    return [
        f"## 1. Training step (forward + backward, batch {args.batch}), same weights (medians)\n\n{train_table}",
        "### Gradient agreement per parameter (max |g_ssmhub − g_transformers| / max |g_transformers|)\n\n"
        + (grad_table or "transformers not run"),
        "## 2. Training throughput vs length: ssmhub Mamba vs GPT-2 of the same width and depth (medians)\n\n"
        + tput_table,
        f"## 3. Prefill of a {args.prefill_len}-token prompt, batch 1, no grad, use_cache (medians)\n\n"
        + prefill_table,
        "## 4. Decode: per-token time and cache memory vs context, batch 1 (medians)\n\n" + decode_table,
        "## Checks\n\n" + "\n".join(checks),
        "## Notes\n\n" + notes,
        "## Per-repeat detail\n\n"
        + "\n\n".join([train_detail, tput_detail, "Prefill. " + prefill_detail, decode_detail]),
    ]


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()  # the "falling back to its reference PyTorch implementation" notices
    script_start = time.perf_counter()
    gen = torch.Generator().manual_seed(args.seed)
    hf, ours = build_mambas(args)
    serpent = build_serpent(args)
    print(
        f"Mamba params {num_params(hf) / 1e6:.2f}M (ssmhub {num_params(ours) / 1e6:.2f}M), "
        f"SeRpEnt params {num_params(serpent) / 1e6:.2f}M, threads {torch.get_num_threads()}",
        flush=True,
    )
    run = run_sections(args, hf, ours, serpent, gen, script_start)
    checks = training_checks(run["train"][0]) + throughput_checks(run["tput"][0])
    checks += prefill_check(args, run["prefill"][0]) + decode_checks(run["decode"][0])
    sections = report_sections(args, run, checks, notes_text(args, (hf, ours, serpent), run))
    print()
    print("\n\n".join(sections))
    if not args.no_write:
        title = (
            "ssmhub Mamba vs transformers' MambaForCausalLM (pure PyTorch): training step, throughput, prefill, decode"
        )
        path = write_report(SCRIPT_NAME, title, sections)
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
