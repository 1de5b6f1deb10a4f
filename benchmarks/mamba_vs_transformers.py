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
from decode_vs_context import handover_check, recurrent_decode, recurrent_prefill

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


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights counted once


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


def timed(fn, *args) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def fmt_list(values, spec: str = ".3g") -> str:
    return ", ".join(format(v, spec) for v in values)


# --------------------------------------------------------------------------------------------- sections
def section_training(args, hf, ours, gen):
    hf.train()
    ours.train()
    rows, detail, results = [], [], {}
    prev = None  # (L, transformers step seconds) of the last length transformers ran at
    for L in sorted(set(args.train_lens)):
        ids = torch.randint(0, args.vocab_size, (args.batch, L), generator=gen)
        tokens = args.batch * L
        predicted = None if prev is None else prev[1] * (L / prev[0]) ** 2
        run_hf = predicted is None or predicted <= args.step_limit
        r = {"predicted": predicted, "run_hf": run_hf}
        if run_hf:
            _, out_ours = train_step(ours, ids)
            hf_warm, out_hf = train_step(hf, ids)
            r["dloss"] = abs(out_ours.loss.item() - out_hf.loss.item())
            r["dlogits"] = (out_ours.logits - out_hf.logits).abs().max().item()
            r["grads"] = grad_differences(hf, ours)
            del out_ours, out_hf
        else:
            train_step(ours, ids)
        ours_s, hf_s = [], []
        hf_repeats = args.repeats if run_hf and hf_warm <= args.step_limit else 0
        for i in range(args.repeats):
            ours_s.append(train_step(ours, ids)[0])
            if i < hf_repeats:
                hf_s.append(train_step(hf, ids)[0])
        if run_hf and not hf_s:  # the warm-up step alone was over the limit: report it as the only run
            hf_s = [hf_warm]
        r["ours_s"], r["hf_s"] = median(ours_s), (median(hf_s) if hf_s else None)
        results[L] = r
        if hf_s:
            prev = (L, r["hf_s"])
        ours_tps = tokens / r["ours_s"]
        if hf_s:
            hf_tps = tokens / r["hf_s"]
            grads = r["grads"]
            worst = max(grads, key=grads.get)
            row = [
                L,
                f"{r['ours_s']:.3g}",
                f"{r['hf_s']:.3g}",
                f"{ours_tps:,.0f}",
                f"{hf_tps:,.1f}",
                f"**{ours_tps / hf_tps:.1f}×**",
                f"{r['dloss']:.1e}",
                f"{r['dlogits']:.1e}",
                f"{grads[worst]:.1e}",
            ]
        else:
            why = f"not run (predicted {predicted:.0f} s/step > {args.step_limit:.0f} s)"
            row = [L, f"{r['ours_s']:.3g}", why, f"{ours_tps:,.0f}", "-", "-", "-", "-", "-"]
        rows.append(row)
        detail.append(
            [L, fmt_list(ours_s), fmt_list(hf_s) if hf_s else "-", f"{predicted:.1f}" if predicted is not None else "-"]
        )
        print("  train | " + " | ".join(str(c) for c in row), flush=True)
    headers = [
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
    grad_rows = []
    layers = sorted({0, args.layers - 1})
    picks = ["backbone.embeddings.weight"] + [
        f"backbone.layers.{i}.mixer.{p}" for i in layers for p in ("in_proj.weight", "A_log", "dt_proj.weight", "D")
    ]
    ran = [L for L, r in results.items() if "grads" in r]
    for name in picks:
        grad_rows.append([f"`{name}`", *(f"{results[L]['grads'][name]:.1e}" for L in ran)])
    grad_table = markdown_table(["transformers parameter", *(f"L={L}" for L in ran)], grad_rows) if ran else ""
    detail_table = markdown_table(
        ["L", "ssmhub s/step per repeat", "transformers s/step per repeat", "transformers predicted s/step"], detail
    )
    return results, markdown_table(headers, rows), grad_table, detail_table


def section_throughput(args, ours, gen):
    lens = sorted(set(args.throughput_lens))
    gpt2 = build_gpt2(args, max(lens)).train()
    if gpt2.config._attn_implementation != "sdpa":
        raise RuntimeError(f"GPT-2 runs with {gpt2.config._attn_implementation!r} attention, not sdpa")
    ours.train()
    rows, detail, results = [], [], {}
    for L in lens:
        batch = max(1, args.tokens_per_step // L)
        ids = torch.randint(0, args.vocab_size, (batch, L), generator=gen)
        train_step(ours, ids)
        train_step(gpt2, ids)
        ours_s, gpt2_s = [], []
        for _ in range(args.repeats):
            ours_s.append(train_step(ours, ids)[0])
            gpt2_s.append(train_step(gpt2, ids)[0])
        ours_tps, gpt2_tps = batch * L / median(ours_s), batch * L / median(gpt2_s)
        results[L] = {"ours_tps": ours_tps, "gpt2_tps": gpt2_tps, "batch": batch}
        detail.append([L, batch, fmt_list(ours_s), fmt_list(gpt2_s)])
    base = results[lens[0]]["ours_tps"]
    for L in lens:
        r = results[L]
        r["flat"] = r["ours_tps"] / base
        rows.append(
            [
                L,
                r["batch"],
                f"{r['ours_tps']:,.0f}",
                f"{r['gpt2_tps']:,.0f}",
                f"**{r['ours_tps'] / r['gpt2_tps']:.2f}×**",
                f"{r['flat']:.2f}",
            ]
        )
        print("  throughput | " + " | ".join(str(c) for c in rows[-1]), flush=True)
    headers = [
        "L",
        "batch",
        "ssmhub Mamba tok/s",
        "GPT-2 tok/s",
        "ssmhub ÷ GPT-2",
        f"ssmhub tok/s ÷ its L={lens[0]} value",
    ]
    detail_table = markdown_table(["L", "batch", "ssmhub s/step per repeat", "GPT-2 s/step per repeat"], detail)
    params = num_params(gpt2)
    del gpt2
    return results, markdown_table(headers, rows), detail_table, params


def section_prefill(args, hf, ours, seed: int):
    hf.eval()
    ours.eval()
    n = args.prefill_len
    with torch.no_grad():
        ids = torch.randint(0, args.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed))
        out_ours = ours(ids, use_cache=True, logits_to_keep=1)
        out_hf = hf(ids, use_cache=True, logits_to_keep=1)
        dlogits = (out_ours.logits[:, -1] - out_hf.logits[:, -1]).abs().max().item()
        same_token = bool((out_ours.logits[:, -1].argmax(-1) == out_hf.logits[:, -1].argmax(-1)).all())
        del out_ours, out_hf
        ours_s, hf_s = [], []
        for i in range(args.repeats):  # the same prompt every time: a fresh generator per run
            ours_s.append(timed(recurrent_prefill, ours, n, torch.Generator().manual_seed(seed + i))[0])
            hf_s.append(timed(mamba_prefill, hf, n, torch.Generator().manual_seed(seed + i))[0])
    r = {"ours_s": median(ours_s), "hf_s": median(hf_s), "dlogits": dlogits, "same_token": same_token}
    row = [
        n,
        f"{r['ours_s']:.3g}",
        f"{r['hf_s']:.3g}",
        f"{n / r['ours_s']:,.0f}",
        f"{n / r['hf_s']:,.0f}",
        f"**{r['hf_s'] / r['ours_s']:.1f}×**",
        f"{dlogits:.1e}",
        "yes" if same_token else "NO",
    ]
    print("  prefill | " + " | ".join(str(c) for c in row), flush=True)
    headers = [
        "prompt",
        "ssmhub s",
        "transformers s",
        "ssmhub tok/s",
        "transformers tok/s",
        "speed-up (ssmhub ÷ transformers)",
        "final logits max |Δ|",
        "same next token",
    ]
    detail = f"Per repeat (s): ssmhub {fmt_list(ours_s)}; transformers {fmt_list(hf_s)}."
    return r, markdown_table(headers, [row]), detail


def section_decode(args, hf, ours, serpent, seed: int):
    for m in (hf, ours, serpent):
        m.eval()
    rows, detail, results = [], [], {}
    steps = args.decode_steps
    with torch.no_grad():
        for ctx in sorted(set(args.decode_contexts)):
            prefill_s = {}
            prefill_s["ours"], (ours_cache, ours_tok) = timed(
                recurrent_prefill, ours, ctx, torch.Generator().manual_seed(seed + ctx)
            )
            prefill_s["hf"], (hf_cache, hf_tok) = timed(
                mamba_prefill, hf, ctx, torch.Generator().manual_seed(seed + ctx)
            )
            prefill_s["serpent"], (serpent_cache, serpent_tok) = timed(
                recurrent_prefill, serpent, ctx, torch.Generator().manual_seed(seed + ctx)
            )
            same_prefill_token = bool((ours_tok == hf_tok).all())
            mem_after_prefill = {"ours": ours_cache.memory_bytes(), "serpent": serpent_cache.memory_bytes()}
            # first decode step: the same token into both Mambas, logits compared
            a = ours(ours_tok, cache=ours_cache, use_cache=True).logits[:, -1]
            b = hf(ours_tok, use_cache=True, **{MAMBA_CACHE_FIELD: hf_cache}).logits[:, -1]
            dlogits = (a - b).abs().max().item()
            ours_tok, hf_tok = a.argmax(-1, keepdim=True), b.argmax(-1, keepdim=True)
            ours_tok = recurrent_decode(ours, ours_cache, ours_tok, args.decode_warmup)
            hf_tok = mamba_decode(hf, hf_cache, hf_tok, args.decode_warmup)
            serpent_tok = recurrent_decode(serpent, serpent_cache, serpent_tok, args.decode_warmup)
            ms = {"ours": [], "hf": [], "serpent": []}
            for _ in range(args.decode_repeats):
                seconds, ours_tok = timed(recurrent_decode, ours, ours_cache, ours_tok, steps)
                ms["ours"].append(1e3 * seconds / steps)
                seconds, hf_tok = timed(mamba_decode, hf, hf_cache, hf_tok, steps)
                ms["hf"].append(1e3 * seconds / steps)
                seconds, serpent_tok = timed(recurrent_decode, serpent, serpent_cache, serpent_tok, steps)
                ms["serpent"].append(1e3 * seconds / steps)
            r = {k: median(v) for k, v in ms.items()}
            r["mem_ours"], r["mem_serpent"] = ours_cache.memory_bytes(), serpent_cache.memory_bytes()
            r["mem_hf"] = mamba_cache_bytes(hf_cache)
            r["mem_changed"] = mem_after_prefill != {"ours": r["mem_ours"], "serpent": r["mem_serpent"]}
            r["dlogits"], r["same_prefill_token"] = dlogits, same_prefill_token
            results[ctx] = r
            row = [
                ctx,
                f"{r['ours']:.2f}",
                f"{r['hf']:.2f}",
                f"{r['serpent']:.2f}",
                f"{r['hf'] / r['ours']:.1f}×",
                f"{r['mem_ours'] / MB:.3f}",
                f"{r['mem_hf'] / MB:.3f}",
                f"{r['mem_serpent'] / MB:.3f}",
                f"{dlogits:.1e}",
            ]
            rows.append(row)
            detail.append(
                [
                    ctx,
                    f"{prefill_s['ours']:.3g} / {prefill_s['hf']:.3g} / {prefill_s['serpent']:.3g}",
                    fmt_list(ms["ours"]),
                    fmt_list(ms["hf"]),
                    fmt_list(ms["serpent"]),
                ]
            )
            print("  decode | " + " | ".join(str(c) for c in row), flush=True)
            del ours_cache, hf_cache, serpent_cache
    headers = [
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
    detail_table = markdown_table(
        [
            "context",
            "prefill s, 1 run (ssmhub / transformers / SeRpEnt)",
            "ssmhub ms/token per repeat",
            "transformers ms/token per repeat",
            "SeRpEnt ms/token per repeat",
        ],
        detail,
    )
    return results, markdown_table(headers, rows), detail_table


# --------------------------------------------------------------------------------------------- main
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

    t0 = time.perf_counter()
    train, train_table, grad_table, train_detail = section_training(args, hf, ours, gen)
    t_train = time.perf_counter() - t0
    t0 = time.perf_counter()
    tput, tput_table, tput_detail, gpt2_params = section_throughput(args, ours, gen)
    t_tput = time.perf_counter() - t0
    t0 = time.perf_counter()
    prefill, prefill_table, prefill_detail = section_prefill(args, hf, ours, args.seed + 1)
    t_prefill = time.perf_counter() - t0
    with torch.no_grad():
        handover = {"ssmhub Mamba": handover_check(ours.eval(), gen), "SeRpEnt": handover_check(serpent.eval(), gen)}
    t0 = time.perf_counter()
    decode, decode_table, decode_detail = section_decode(args, hf, ours, serpent, args.seed + 2)
    t_decode = time.perf_counter() - t0
    wall = time.perf_counter() - script_start

    # ----------------------------------------------------------------------------------------- checks
    checks = []

    def check(name: str, ok: bool, measured: str) -> None:
        checks.append(f"- [{'PASS' if ok else 'FAIL'}] {name}: {measured}")

    ran = [L for L, r in train.items() if r["hf_s"] is not None]
    target_L = 256 if 256 in ran else (max(ran) if ran else None)
    if target_L is not None:
        r = train[target_L]
        speedup = r["hf_s"] / r["ours_s"]
        check(
            f"training step at L={target_L}: ssmhub ≥ 20× transformers' pure-PyTorch Mamba",
            speedup >= 20,
            f"{r['ours_s']:.3g} s vs {r['hf_s']:.3g} s per step = {speedup:.1f}×",
        )
        checked = [L for L in ran if "grads" in train[L]]
        dloss = max(train[L]["dloss"] for L in checked)
        dlogits = max(train[L]["dlogits"] for L in checked)
        dgrad = max(max(train[L]["grads"].values()) for L in checked)
        check(
            "equal outputs in training (|Δ loss| ≤ 1e-4, max |Δ logits| ≤ 1e-3, every gradient's max relative "
            f"difference ≤ 1e-3; L = {', '.join(map(str, checked))})",
            dloss <= 1e-4 and dlogits <= 1e-3 and dgrad <= 1e-3,
            f"{dloss:.1e}, {dlogits:.1e}, {dgrad:.1e}",
        )
    lens = sorted(tput)
    lo, hi = lens[0], lens[-1]
    flat = [tput[L]["flat"] for L in lens]
    check(
        f"ssmhub's training throughput flat from L={lo} to {hi} (every length within 0.8-1.25× of L={lo})",
        all(0.8 <= f <= 1.25 for f in flat),
        ", ".join(f"L={L}: {tput[L]['ours_tps']:,.0f} tok/s ({tput[L]['flat']:.2f}×)" for L in lens),
    )
    check(
        "ssmhub's training throughput ≥ GPT-2's at every length",
        all(tput[L]["ours_tps"] >= tput[L]["gpt2_tps"] for L in lens),
        ", ".join(f"L={L}: {tput[L]['ours_tps'] / tput[L]['gpt2_tps']:.2f}×" for L in lens),
    )
    check(
        f"prefill of {args.prefill_len} tokens: ssmhub faster than transformers, final logits equal (≤ 1e-3)",
        prefill["ours_s"] < prefill["hf_s"] and prefill["dlogits"] <= 1e-3,
        f"{prefill['hf_s'] / prefill['ours_s']:.1f}× faster, max |Δ| {prefill['dlogits']:.1e}",
    )
    ctxs = sorted(decode)
    c_lo, c_hi = ctxs[0], ctxs[-1]
    for key, label in (("ours", "ssmhub Mamba"), ("hf", "transformers Mamba"), ("serpent", "SeRpEnt [0.5, 0.1]")):
        growth = decode[c_hi][key] / decode[c_lo][key]
        check(
            f"{label} decode ms/token flat with context (ctx {c_hi} within 1.2× of ctx {c_lo})",
            growth <= 1.2,
            f"{decode[c_hi][key]:.2f} vs {decode[c_lo][key]:.2f} ms = {growth:.2f}×",
        )
    for key, label in (("mem_ours", "ssmhub Mamba"), ("mem_serpent", "SeRpEnt")):
        sizes = sorted({decode[c][key] for c in ctxs})
        changed = any(decode[c]["mem_changed"] for c in ctxs)
        check(
            f"{label} cache memory identical at every context, after prefill and after decoding",
            len(sizes) == 1 and not changed,
            ", ".join(f"{s:,} B" for s in sizes),
        )
    worst_decode = max(decode[c]["dlogits"] for c in ctxs)
    check(
        "decode: same logits from the two Mambas' caches (first step after each prefill, ≤ 1e-3)",
        worst_decode <= 1e-3 and all(decode[c]["same_prefill_token"] for c in ctxs),
        f"max |Δ| {worst_decode:.1e}; same greedy token after prefill at every context: "
        f"{'yes' if all(decode[c]['same_prefill_token'] for c in ctxs) else 'NO'}",
    )

    mcfg, scfg = hf.config, serpent.config
    notes = [
        "- **The machine is shared with other jobs**: timings are noisy. Every time reported is a median "
        "(sections 1-3: over the timed steps/runs; section 4: over blocks of steps); the per-repeat numbers "
        "are at the end.",
        f"- Models: Mamba hidden {mcfg.hidden_size}, {mcfg.num_hidden_layers} layers, state {mcfg.state_size}, expand "
        f"{mcfg.expand} (inner {mcfg.intermediate_size}), Δ rank {mcfg.time_step_rank}, conv {mcfg.conv_kernel}, vocab "
        f"{mcfg.vocab_size}, tied LM head: {num_params(hf):,} parameters in both implementations. GPT-2: n_embd "
        f"{args.hidden}, {args.layers} layers, {args.heads} heads, MLP {4 * args.hidden}, n_positions "
        f"{max(args.throughput_lens)}, dropout 0, sdpa: {gpt2_params:,} parameters. SeRpEnt: hidden "
        f"{scfg.hidden_size} ({scfg.num_branches} branches of {scfg.branch_size}), resampling_rates "
        f"{list(scfg.resampling_rates)}, window {scfg.resampling_window}: {num_params(serpent):,} parameters. "
        "All randomly initialized (seeded).",
        "- transformers' Mamba runs its reference PyTorch path: `use_mambapy=False`, and neither `mamba_ssm` nor "
        "`causal_conv1d` is installed, so the scan is a Python loop over positions (backward quadratic in L).",
        f"- Throughput tokens per step: batch = max(1, {args.tokens_per_step} // L).",
        "- Prefill -> step-decoding handover (48-token prompt, 8 steps; max |logit diff| vs a full forward): "
        + ", ".join(f"{k} {v:.1e}" for k, v in handover.items())
        + ".",
        f"- Threads: `torch.set_num_threads({args.threads})`. Section wall times: training {t_train:.0f} s, "
        f"throughput {t_tput:.0f} s, prefill {t_prefill:.0f} s, decode {t_decode:.0f} s; whole script "
        f"{wall:.0f} s.",
    ]
    checks_text = "\n".join(checks)
    notes_text = "\n".join(notes)
    sections = [
        f"## 1. Training step (forward + backward, batch {args.batch}), same weights (medians)\n\n{train_table}",
        "### Gradient agreement per parameter (max |g_ssmhub − g_transformers| / max |g_transformers|)\n\n"
        + (grad_table or "transformers not run"),
        "## 2. Training throughput vs length: ssmhub Mamba vs GPT-2 of the same width and depth (medians)\n\n"
        + tput_table,
        f"## 3. Prefill of a {args.prefill_len}-token prompt, batch 1, no grad, use_cache (medians)\n\n"
        + prefill_table,
        "## 4. Decode: per-token time and cache memory vs context, batch 1 (medians)\n\n" + decode_table,
        "## Checks\n\n" + checks_text,
        "## Notes\n\n" + notes_text,
        "## Per-repeat detail\n\n"
        + "\n\n".join([train_detail, tput_detail, "Prefill. " + prefill_detail, decode_detail]),
    ]
    print()
    print("\n\n".join(sections))
    if not args.no_write:
        path = write_report(
            SCRIPT_NAME,
            "ssmhub Mamba vs transformers' MambaForCausalLM (pure PyTorch): training step, throughput, prefill, decode",
            sections,
        )
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
