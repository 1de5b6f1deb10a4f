"""Per-token decode time and decode-state memory vs context length: H3 exact, distilled and mixed vs GPT-2.

What is measured
----------------
Batch 1, float32, eval mode, ``torch.inference_mode()``, CPU. Three decoders at each context length:

- **H3, exact**: ``ssmhub.H3ForCausalLM`` whose long convolutions keep their last L_max inputs in the
  cache and decode each token with an O(L_max) dot product per channel (equal to the full forward).
- **H3, distilled**: the same weights after ``model.distill_for_decoding(num_modes)``: each long kernel is
  a sum of N complex exponentials, decoded with an O(N) state per channel whatever the context.
- **H3, mixed** (``--tolerance``, issue 30): the same weights after ``distill_for_decoding(num_modes, tolerance)``:
  each head gets the smallest order that meets the tolerance and a head no order within the budget fits
  stays exact, so a layer decodes some heads with the O(N) modal state and the rest with their window of
  L_max − 1 inputs (error-aware distillation as in LaughingHyena, arXiv 2310.18780 §3.2). The tolerance here
  only sets how many heads stay exact; the fit's quality is measured in ``h3_distillation.py``.
- **GPT-2**: transformers' ``GPT2LMHeadModel`` of the same width, depth and heads (sdpa attention), its
  KV cache (``DynamicCache``) filled with random keys/values of the context's length, exactly as in
  ``benchmarks/decode_vs_context.py`` (the cost of a decode step depends only on the cache's shape).

The H3 contexts are prefilled for real (one parallel forward, ``logits_to_keep=1``), which hands a
``RecurrentCache`` to the step-by-step decoder. For each context every model is warmed up, then
``--repeats`` interleaved rounds (exact, distilled, mixed, GPT-2) each decode ``--steps`` tokens greedily; the
median over rounds of (block time / steps) is reported. After each GPT-2 block its cache is cropped back.

Memory: the decode state at that context, ``RecurrentCache.memory_bytes()`` for H3 (exact: L_max inputs
per channel plus the shift state; distilled: N complex64 per channel plus the shift state; mixed: both, each over
its own heads, one modal state per order the heads use) and the bytes
of all key/value tensors for GPT-2. That is the memory that can grow with context; the weights are
constant and the same for both H3 modes. Measured next to it, in a separate pass after the timing (Linux):
the peak resident memory above the weights while each model builds its state and decodes ``--steps``
tokens (``_memory.peak_rss_above_baseline``; the transient activations of the H3 prefill are excluded).

Models: by default random-init H3 in GPT-2-small's shape (hidden 768, 12 layers (``--num-layers``), MLP 3072,
every layer H3, L_max 2048, GPT-2 vocabulary 50257) and GPT-2-small. With ``--model PATH``, a trained H3 folder
(e.g. the WikiText-2 run of issue 5) and a random GPT-2 of its width, depth and vocabulary.

Sanity checks printed (and written): max |logit| difference between the full forward and prefill +
step-by-step decoding, for the exact and the distilled model.

Run: ``python benchmarks/h3_decode_vs_context.py`` (random 768×12; the two distillations fit every head's kernel,
the bulk of the run: ``--num-layers`` shrinks it, ``--tolerance 0`` drops the mixed model) or
``python benchmarks/h3_decode_vs_context.py --model runs/h3-wt2 --name h3_decode_vs_context_trained``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import ssmhub

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _memory import peak_rss_above_baseline, peak_rss_available
from _report import markdown_table, median, write_report
from decode_vs_context import gpt2_crop, gpt2_decode, gpt2_random_cache, handover_check
from decode_vs_context import recurrent_decode as decode
from decode_vs_context import recurrent_prefill as prefill

MB = 1e6


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--model", default=None, help="a trained H3ForCausalLM folder (default: random 768×12)")
    p.add_argument("--num-modes", type=int, default=64, help="modes per channel of the distilled model")
    p.add_argument(
        "--method",
        default="hankel",
        help="fit method (ops.modal.fit_modal_kernel); 'hankel' by default: the balanced fits' T×T eigenproblems "
        "per channel take hours at L_max 2048 and 12×768 channels, and the fit does not change the decode cost",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.3,
        help="the mixed model's relative-error tolerance (heads no order meets stay exact); 0: no mixed model",
    )
    p.add_argument("--max-kernel-length", type=int, default=2048, help="L_max of the random H3")
    p.add_argument("--num-layers", type=int, default=12, help="layers of the random H3")
    p.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 2048, 8192, 16384])
    p.add_argument("--steps", type=int, default=16, help="decode steps per timed block")
    p.add_argument("--repeats", type=int, default=5, help="timed blocks per model and context (median reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed decode steps per model and context")
    p.add_argument("--no-gpt2", action="store_true", help="time only the two H3 modes")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default="h3_decode_vs_context", help="results/<name>.md")
    p.add_argument("--no-write", action="store_true", help="print only; do not write the results file")
    return p.parse_args(argv)


def build_h3(args) -> ssmhub.H3ForCausalLM:
    if args.model:
        return ssmhub.H3ForCausalLM.from_pretrained(args.model).eval()
    config = ssmhub.H3Config(
        vocab_size=50257,
        hidden_size=768,
        num_hidden_layers=args.num_layers,
        intermediate_size=3072,
        max_kernel_length=args.max_kernel_length,
        attention_layers=[],
    )
    return ssmhub.H3ForCausalLM(config).eval()


def build_gpt2_like(h3_config, n_positions: int) -> GPT2LMHeadModel:
    heads = h3_config.num_attention_heads
    if not h3_config.attention_layers or h3_config.hidden_size % heads:
        heads = max(1, h3_config.hidden_size // 64)  # GPT-2's head size
    cfg = GPT2Config(
        bos_token_id=h3_config.bos_token_id,
        eos_token_id=h3_config.eos_token_id,
        n_embd=h3_config.hidden_size,
        n_layer=h3_config.num_hidden_layers,
        n_head=heads,
        n_inner=h3_config.intermediate_size,
        n_positions=n_positions,
        vocab_size=h3_config.vocab_size,
        attn_implementation="sdpa",
    )
    return GPT2LMHeadModel(cfg).eval()


def per_token_ms(fn, *args, steps: int) -> float:
    """Milliseconds per token of ``fn(*args, steps)``, a block of ``steps`` decode steps."""
    start = time.perf_counter()
    fn(*args, steps)
    return 1e3 * (time.perf_counter() - start) / steps


def decode_peak_mb(ctx: int, steps: int, generator, models: dict, gpt2) -> dict[str, float]:
    """Peak resident MB above the weights while each model decodes ``steps`` tokens at context ``ctx``.

    The decode state is built first (H3: a real prefill, whose transient activations are excluded;
    GPT-2: a random KV cache), so the peak counts the state the context leaves plus every transient
    allocation of decoding (GPT-2's ``DynamicCache`` copies a layer's keys and values on each step).
    Empty where the platform cannot measure it (see ``_memory.peak_rss_available``).
    """
    if not peak_rss_available():
        return {}
    peaks = {}
    with torch.inference_mode():
        for name, model in models.items():
            nbytes, _ = peak_rss_above_baseline(
                lambda model=model: prefill(model, ctx, generator),
                lambda state, model=model: decode(model, *state, steps),
            )
            peaks[name] = nbytes / MB
        if gpt2 is not None:
            token = torch.zeros(1, 1, dtype=torch.long)
            nbytes, _ = peak_rss_above_baseline(
                lambda: gpt2_random_cache(gpt2, ctx, generator)[0],
                lambda cache: gpt2_decode(gpt2, cache, token, steps),
            )
            peaks["gpt2"] = nbytes / MB
    return peaks


def distill(exact, args, tolerance: float | None):
    """A copy of ``exact`` distilled to ``args.num_modes`` (with ``tolerance``: the mixed model) and its summary."""
    model = build_h3(args)
    model.load_state_dict(exact.state_dict())
    start = time.perf_counter()
    reports = model.distill_for_decoding(args.num_modes, tolerance, args.method)
    seconds = time.perf_counter() - start
    errors = torch.cat([r.errors if tolerance else r.fit_errors for r in reports.values()])
    heads = sum(r.orders.numel() for r in reports.values())
    exact_heads = sum(len(r.exact_heads) for r in reports.values())
    mixers = [m for m in model.backbone.modules() if type(m).__name__ == "H3Mixer"]
    groups = [sum(name.startswith("kv_state") for name in m.state_layout(1)) for m in mixers]
    orders = torch.cat([r.orders[r.orders > 0] for r in reports.values()]).float()
    summary = (
        f"`distill_for_decoding({args.num_modes}, tolerance={tolerance}, method={args.method!r})` in {seconds:.0f} s: "
        f"relative L2 error of the kernels it computes with mean {errors.mean():.4f}, max {errors.max():.4f}; "
        f"{exact_heads} / {heads} heads left exact; distilled heads' order mean "
        f"{orders.mean() if orders.numel() else 0:.1f}; modal states (one per order used) per layer {groups}"
    )
    print(summary, flush=True)
    return model, summary


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    script_start = time.perf_counter()
    exact = build_h3(args)
    if exact.config.decode_num_modes is not None:
        raise SystemExit(f"{args.model} is already distilled; give the exact (undistilled) model")
    models, summaries = {"exact": exact}, {}
    models["distilled"], summaries["distilled"] = distill(exact, args, None)
    if args.tolerance:
        models["mixed"], summaries["mixed"] = distill(exact, args, args.tolerance)
    gpt2 = None if args.no_gpt2 else build_gpt2_like(exact.config, max(args.contexts) + args.warmup + args.steps)
    generator = torch.Generator().manual_seed(args.seed)
    with torch.inference_mode():
        checks = {name: handover_check(model, generator) for name, model in models.items()}
    print("handover max |Δlogit|: " + ", ".join(f"{n} {c:.2e}" for n, c in checks.items()), flush=True)

    rows = []
    for ctx in args.contexts:
        with torch.inference_mode():
            state = {}
            for name, model in models.items():
                t0 = time.perf_counter()
                cache, token = prefill(model, ctx, generator)
                state[name] = (model, cache, token, time.perf_counter() - t0)
            kv = None
            if gpt2 is not None:
                kv, kv_bytes = gpt2_random_cache(gpt2, ctx, generator)
                gtoken = torch.zeros(1, 1, dtype=torch.long)
            # warm-up, then interleaved timed blocks; each H3 block continues from where it stopped, so its
            # context grows by `steps` per block (negligible next to ctx for the exact/distilled costs)
            for model, cache, token, _ in state.values():
                decode(model, cache, token, args.warmup)
            if gpt2 is not None:
                gpt2_decode(gpt2, kv, gtoken, args.warmup)
                gpt2_crop(kv, ctx)
            times = {name: [] for name in (*models, "gpt2")}
            for _ in range(args.repeats):
                for name, (model, cache, token, _) in state.items():
                    times[name].append(per_token_ms(decode, model, cache, token, steps=args.steps))
                if gpt2 is not None:
                    times["gpt2"].append(per_token_ms(gpt2_decode, gpt2, kv, gtoken, steps=args.steps))
                    gpt2_crop(kv, ctx)
        ms = {k: median(v) for k, v in times.items() if v}
        mem = {name: state[name][1].memory_bytes() / MB for name in state}
        prefill_s = {name: state[name][3] for name in state}
        del state, kv  # the peak-memory pass below starts from the weights alone
        peak = decode_peak_mb(ctx, args.steps, generator, models, gpt2)
        if gpt2 is not None:
            mem["gpt2"] = kv_bytes / MB
        row = [ctx]
        row += [f"{ms[name]:.2f}" if name in ms else "-" for name in (*models, "gpt2")]
        row += [f"{ms['exact'] / ms[name]:.2f}×" for name in models if name != "exact"]
        row += [f"{mem[name]:.3f}" if name in mem else "-" for name in (*models, "gpt2")]
        row += [
            " / ".join(f"{peak[name]:.1f}" if name in peak else "-" for name in (*models, "gpt2")),
            " / ".join(f"{prefill_s[name]:.1f}" for name in models),
        ]
        rows.append(row)
        print("  " + " | ".join(str(c) for c in row), flush=True)

    label = {"exact": "exact", "distilled": f"distilled (N={args.num_modes})", "mixed": f"mixed (tol {args.tolerance})"}
    label["gpt2"] = "GPT-2"
    names = " / ".join(label[n] for n in (*models, "gpt2"))
    headers = ["context"]
    headers += [f"{label[n]} ms/token" for n in (*models, "gpt2")]
    headers += [f"exact ÷ {label[n]}" for n in models if n != "exact"]
    headers += [f"{label[n]} state MB" if n != "gpt2" else "GPT-2 KV MB" for n in (*models, "gpt2")]
    headers += [f"decode peak MB ({names})", f"prefill s ({' / '.join(label[n] for n in models)})"]
    table = markdown_table(headers, rows)
    cfg = exact.config
    params = sum(p.numel() for p in exact.parameters())
    source = f"the trained model `{args.model}`" if args.model else "random initialization"
    notes = [
        f"- H3: {source}; hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, MLP {cfg.intermediate_size}, "
        f"L_max {cfg.max_kernel_length}, attention layers {list(cfg.attention_layers)}, vocab {cfg.vocab_size}, "
        f"{params / 1e6:.1f}M parameters.",
        *(f"- {label[name]}: {text}." for name, text in summaries.items()),
        "- Handover (full forward vs prefill + 8 decode steps, max |Δlogit|): "
        + ", ".join(f"{label[n]} {c:.2e}" for n, c in checks.items())
        + ".",
        "- GPT-2: "
        + (
            "not timed (`--no-gpt2`)."
            if gpt2 is None
            else f"n_embd {gpt2.config.n_embd}, {gpt2.config.n_layer} layers, {gpt2.config.n_head} heads, "
            f"n_positions {gpt2.config.n_positions}, random KV cache of the context's length."
        ),
        f"- Timing: batch 1, fp32, {args.warmup} warm-up steps, then {args.repeats} interleaved rounds of "
        f"{args.steps} greedy decode steps per model; medians over rounds. torch threads: {torch.get_num_threads()}.",
        "- State MB: `RecurrentCache.memory_bytes()` after the prefill (long and shift convolutions, all layers).",
        "- Decode peak MB: the process's resident high-water mark (Linux VmHWM) above the resident memory before "
        "the state was built, over the state and one block of decode steps; H3 prefill transients excluded.",
        f"- Whole script wall time: {time.perf_counter() - script_start:.0f} s.",
    ]
    notes_text = "\n".join(notes)
    print()
    print(table)
    print()
    print(notes_text)
    if not args.no_write:
        path = write_report(
            args.name,
            "Decode time and state memory vs context length: H3 exact vs distilled vs mixed",
            ["## Results (medians)\n\n" + table, "## Notes\n\n" + notes_text],
        )
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
