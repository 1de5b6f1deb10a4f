"""Step e of ``gpu_suite.py`` (issue 52 §1, §4): training at users' shapes against a compiled GPT-2 small.

Every model of ``_gpu_models.py`` (~125M parameters) trains in bf16 autocast (recurrences and FFTs stay float32
inside the layers) with AdamW (torch's defaults), at L 2048 × batch 8 and L 8192 × batch 2, eager and compiled
(``torch.compile(fullgraph=True, dynamic=False)`` of each block: identical blocks share one graph, so a 12-layer
model compiles about as fast as one block; the last rows time GPT-2 and DLR compiled whole, ``fullgraph=False``,
for the comparison).
One step = forward with labels, backward, ``optimizer.step()``. Rows run in the order of their importance (the
compiled GPT-2, each family compiled at 2048, then at 8192, then eager rows), each under its own time cap and
never past the run's deadline; a failed or stopped cell reads "failed: reason" and the table goes on. Then the
targets (``_gpu_targets.py``), the arithmetic (``_gpu_arithmetic.py``) and a profile of one step per family.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import torch
from _gpu_arithmetic import write_arithmetic
from _gpu_common import Context, Section, StepTimeout, failure, free_memory, run_with_alarm
from _gpu_models import MODELS, blocks, build_model, describe, num_params, shape_for
from _gpu_profile import count_aten_ops, profile_step, top_ops
from _gpu_targets import write_targets
from _report import median


@dataclass(frozen=True)
class Row:
    name: str
    length: int
    batch: int
    mode: str  # "eager", "compiled" (per block) or "compiled whole"


def plan_rows(lengths: list[tuple[int, int]]) -> list[Row]:
    """Compiled rows at each length (GPT-2 first), then eager rows, then the whole-model compilations."""
    rows = [Row(name, length, batch, "compiled") for length, batch in lengths for name in MODELS]
    rows += [Row(name, length, batch, "eager") for length, batch in lengths for name in MODELS]
    length, batch = lengths[0]
    return rows + [Row(name, length, batch, "compiled whole") for name in ("gpt2", "dlr")]


def shape_of(ctx: Context):
    return shape_for(ctx.plan["train_user_shape"])


def compile_model(ctx: Context, model: torch.nn.Module, mode: str):
    """The callable a compiled row trains: each block compiled in place, or the whole model wrapped."""
    options = {"fullgraph": True, "dynamic": False, "backend": ctx.args.compile_backend}
    if mode == "compiled whole":  # as users compile a transformers model: graph breaks allowed (GPT-2 has some)
        return torch.compile(model, **{**options, "fullgraph": False})
    for block in blocks(model):
        block.compile(**options)
    return model


def make_step(model, forward, ids: torch.Tensor):
    """One training step of ``model`` through ``forward`` (the model or its compiled wrapper): bf16 autocast on the
    ids' device, loss on the ids themselves, AdamW with torch's defaults."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(ids.device.type, dtype=torch.bfloat16):
            loss = forward(ids, labels=ids).loss
        loss.backward()
        optimizer.step()

    return step


def time_step(ctx: Context, step, steps: int) -> tuple[float, list[float]]:
    """Seconds of the first call (compilation included), then ``steps`` timed calls (ms) after a second warm-up."""
    start = time.perf_counter()
    step()
    ctx.sync()
    first = time.perf_counter() - start
    step()
    times = []
    for _ in range(steps):
        ctx.sync()
        start = time.perf_counter()
        step()
        ctx.sync()
        times.append(1e3 * (time.perf_counter() - start))
    return first, times


def inductor_kernels() -> int | None:
    try:
        from torch._inductor import metrics

        return metrics.generated_kernel_count
    except (ImportError, AttributeError):
        return None


def measure_row(ctx: Context, row: Row) -> dict:
    """Build, (compile,) time and count one row; what the table and the targets read."""
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    model = build_model(row.name, shape_of(ctx), ctx.device).train()
    forward = model if row.mode == "eager" else compile_model(ctx, model, row.mode)
    ids = torch.randint(0, model.config.vocab_size, (row.batch, row.length), generator=torch.Generator().manual_seed(2))
    step = make_step(model, forward, ids.to(ctx.device))
    kernels_before = inductor_kernels()
    first_s, times = time_step(ctx, step, ctx.plan["train_steps"])
    kernels = None if kernels_before is None else inductor_kernels() - kernels_before
    ops = count_aten_ops(step)
    launches = str(ops) if row.mode == "eager" or not kernels else f"{ops} + {kernels} Inductor kernels"
    peak = torch.cuda.max_memory_allocated(ctx.device) / 2**30 if ctx.device.type == "cuda" else None
    return {"params": num_params(model), "first_s": first_s, "ms": median(times), "n": len(times), "peak": peak,
            "launches": launches}  # fmt: skip


def row_cap(ctx: Context, row: Row) -> float:
    """The row's time cap in seconds: ``train_caps`` by mode ("eager" or "compiled")."""
    return ctx.plan["train_caps"][row.mode.split()[0]]


def run_row(ctx: Context, row: Row) -> dict:
    """``measure_row`` under the row's cap and before the step's reserve; a failure is a dict with ``error``."""
    left = ctx.left() - ctx.plan["train_reserve_s"]
    try:
        if left < 5:
            raise RuntimeError(f"not run: {ctx.left():.0f} s left before the deadline")
        return run_with_alarm(min(row_cap(ctx, row), left), measure_row, ctx, row)
    except (Exception, StepTimeout) as error:
        return {"error": failure(error) if isinstance(error, Exception) else f"stopped: {error}"}
    finally:
        torch._dynamo.reset()  # the next row compiles afresh: no recompile limit shared across models
        gc.collect()
        free_memory(ctx.device)


HEADERS = ["model", "L × batch", "mode", "params (M)", "first step s", "step ms", "tokens/s", "vs compiled GPT-2",
           "peak GiB", "launches/step"]  # fmt: skip


def row_cells(row: Row, result: dict, results: dict) -> list[str]:
    """A table row; the ratio is tokens/s over the compiled (per block) GPT-2's at the same L."""
    head = [row.name, f"{row.length} × {row.batch}", row.mode]
    if "error" in result:
        return [*head, "–", "–", result["error"], *["–"] * 4]
    gpt2 = results.get(("gpt2", row.length, "compiled"), {})
    ratio = f"{gpt2['ms'] / result['ms']:.2f}×" if "ms" in gpt2 else "–"
    tokens = row.length * row.batch / (result["ms"] / 1e3)
    peak = "–" if result["peak"] is None else f"{result['peak']:.1f}"
    timing = [f"{result['first_s']:.1f}", f"{result['ms']:.1f} (n={result['n']})", f"{tokens:,.0f}", ratio]
    return [*head, f"{result['params'] / 1e6:.1f}", *timing, peak, result["launches"]]


def describe_run(ctx: Context, section: Section) -> None:
    lengths = ", ".join(f"L {length} × batch {batch}" for length, batch in ctx.plan["train_lengths"])
    section.text(
        f"{lengths}; bf16 autocast (`torch.autocast('{ctx.device.type}', torch.bfloat16)`), float32 master "
        "weights, AdamW (torch's defaults, lr 1e-4), train mode; one step = forward with labels, backward, "
        f"optimizer step; step ms = median of {ctx.plan['train_steps']} steps after two warm-up steps (the first, "
        "compilation included, is 'first step s'). compiled = each block `compile(fullgraph=True, dynamic=False, "
        f"backend='{ctx.args.compile_backend}')`; compiled whole = `torch.compile(model, ...)` with "
        "`fullgraph=False` (as users compile a transformers model: GPT-2's forward has graph breaks). Peak: "
        "`torch.cuda.max_memory_allocated`, reset per row (weights, gradients, AdamW state and "
        "activations). launches/step: the leaf ATen ops one step dispatches (eager; on a GPU about one kernel "
        "each; the number `benchmarks/launch_count.py` measures on a CPU), compiled: those left plus the "
        "kernels Inductor generated for the row. Caps per row (s): "
        + ", ".join(f"{mode} {cap}" for mode, cap in ctx.plan["train_caps"].items())
        + "; rows run in the table's order."
    )


def models_table(ctx: Context, section: Section) -> None:
    """Each model's parameter count (built on the meta device: no time, no memory) and its configuration."""
    table = section.table(["model", "params (M)", "vs GPT-2", "configuration"])
    counts = {}
    for name in MODELS:
        try:
            model = build_model(name, shape_of(ctx), "meta")
            counts[name] = num_params(model)
            share = f"{counts[name] / counts['gpt2']:.2f}×" if "gpt2" in counts else "–"
            table.add(name, f"{counts[name] / 1e6:.1f}", share, describe(name, model))
        except Exception as error:
            table.add(name, "–", "–", failure(error))


def train_table(ctx: Context, section: Section, rows: list[Row], results: dict | None = None) -> dict:
    """Measure ``rows`` in order, each added to the table as it ends, into ``results`` (by (name, L, mode); the
    ratios read the compiled GPT-2's row there), which it returns."""
    table, results = section.table(HEADERS), {} if results is None else results
    for row in rows:
        print(f"   {row} ({ctx.left():.0f} s left)", flush=True)
        results[(row.name, row.length, row.mode)] = result = run_row(ctx, row)
        table.add(*row_cells(row, result, results))
    return results


def profile_family(ctx: Context, section: Section, name: str) -> None:
    """One eager training step of ``name`` at the first length under torch.profiler: its top ops."""
    length, batch = ctx.plan["train_lengths"][0]
    model = build_model(name, shape_of(ctx), ctx.device).train()
    ids = torch.randint(0, model.config.vocab_size, (batch, length), generator=torch.Generator().manual_seed(2))
    step = make_step(model, model, ids.to(ctx.device))
    step()  # warm-up: allocator, autotuned kernels, AdamW state
    rows, summary = top_ops(profile_step(step, ctx.device), ctx.device, ctx.plan["profile_ops"])
    section.text(f"**{name}**, eager, L {length} × batch {batch}: {summary}.")
    table = section.table(["op", "calls", "self ms", "share of the step"])
    for cells in rows:
        table.add(*cells)


def profiles(ctx: Context, section: Section) -> None:
    section.text(
        "### Profiles: one eager step per model, top ops by self "
        + ("CUDA" if ctx.device.type == "cuda" else "CPU")
        + " time"
    )
    for name in MODELS:
        try:
            if ctx.left() < ctx.plan["train_reserve_s"] + 5:
                raise RuntimeError(f"not run: {ctx.left():.0f} s left before the deadline")
            run_with_alarm(min(ctx.plan["train_caps"]["profile"], ctx.left() - 5), profile_family, ctx, section, name)
        except (Exception, StepTimeout) as error:
            section.text(f"**{name}**: {failure(error) if isinstance(error, Exception) else f'stopped: {error}'}")
        finally:
            gc.collect()
            free_memory(ctx.device)


def broke(result: dict) -> bool:
    """Whether a row failed by itself (not stopped at its cap, nor left out at the deadline)."""
    return "error" in result and result["error"].startswith("failed:") and "not run:" not in result["error"]


def step_training(ctx: Context, section: Section) -> None:
    """The models, the table (compiled rows first), targets and arithmetic, then the profiles and the whole-model
    compilations. Fails (after writing everything) only when an eager row broke: a model that cannot train."""
    describe_run(ctx, section)
    models_table(ctx, section)
    rows = plan_rows(ctx.plan["train_lengths"])
    whole = [row for row in rows if row.mode == "compiled whole"]
    results = train_table(ctx, section, [row for row in rows if row not in whole])
    write_targets(ctx, section, results)
    write_arithmetic(ctx, section, results)
    profiles(ctx, section)
    section.text("### Whole-model compilation, against per-block (the first length)")
    train_table(ctx, section, whole, results)
    failed = [f"{name} {length}" for (name, length, mode), r in results.items() if mode == "eager" and broke(r)]
    if failed:
        raise RuntimeError(f"eager training failed for {', '.join(failed)} (rows above)")
