"""Step e of ``gpu_suite.py``: training tokens/s of every family against transformers' GPT-2 (SDPA attention) of the
same width and depth: forward (loss) + backward + AdamW step, float32, median step time."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from _gpu_common import Context, Section, failure, free_memory, measure, ratio
from _gpu_decode import FAMILIES, VOCAB, build


def train_step(model, optimizer, ids: torch.Tensor):
    def step():
        optimizer.zero_grad(set_to_none=True)
        model(ids, labels=ids).loss.backward()
        optimizer.step()

    return step


def build_model(ctx: Context, name: str) -> torch.nn.Module:
    width, layers = ctx.plan["model_width"]
    if name != "gpt2":
        return build(name, width, layers, ctx.device)
    from mamba_vs_transformers import build_gpt2  # here: a change there fails this row, not the suite's import

    torch.manual_seed(0)
    shape = SimpleNamespace(hidden=width, layers=layers, heads=max(1, width // 64), vocab_size=VOCAB)
    return build_gpt2(shape, n_positions=ctx.plan["train_length"]).to(ctx.device)


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights counted once


def train_row(ctx: Context, name: str, baseline: dict) -> list[str]:
    """One row: the model's step time and tokens/s (GPT-2's recorded in ``baseline`` for the ratio)."""
    batch, length = ctx.plan["train_batch"], ctx.plan["train_length"]
    try:
        model = build_model(ctx, name).train()
        label, params = f"{name} ({model.config.hidden_size}×{ctx.plan['model_width'][1]})", num_params(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(2)).to(ctx.device)
        ms, n = measure(ctx, train_step(model, optimizer, ids), repeats=ctx.plan["train_steps"])
    except Exception as error:
        return [name, "–", failure(error), "–", "–"]
    finally:
        free_memory(ctx.device)
    tokens_per_s = batch * length / (ms / 1e3)
    baseline.setdefault(name, tokens_per_s)
    cells = [f"{params / 1e6:.2f}", f"{ms:.1f} (n={n})", f"{tokens_per_s:,.0f}"]
    return [label, *cells, ratio(tokens_per_s, baseline.get("gpt2"))]


def step_training(ctx: Context, section: Section) -> None:
    """GPT-2 first (the ratio's denominator), then each family; a failed row fails the step after the table."""
    batch, length = ctx.plan["train_batch"], ctx.plan["train_length"]
    section.text(
        f"Batch {batch} × L {length}, vocabulary {VOCAB}, float32, train mode; one step = forward with labels, "
        f"backward, AdamW step; median step time over {ctx.plan['train_steps']} steps after a warm-up. GPT-2: "
        "`GPT2LMHeadModel`, `attn_implementation='sdpa'`, 64-wide heads, MLP 4×, dropouts 0."
    )
    table = section.table(["model (width × layers)", "params (M)", "step ms", "tokens/s", "vs GPT-2"])
    baseline = {}
    for name in ("gpt2", *FAMILIES):
        table.add(*train_row(ctx, name, baseline))
    if any("failed" in row[2] for row in table.rows):
        raise RuntimeError("a model failed to train (rows above)")
