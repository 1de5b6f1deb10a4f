"""Step b of ``gpu_suite.py``: forward + backward of the selective scan (Triton, pure torch, transformers' slow path)
and of the block scan (Triton sequential and chunked, torch's parallel scan, the loop), median ms and ratios."""

from __future__ import annotations

import functools
import importlib.util

import torch
from _gpu_common import Context, Section, Table, failure, free_memory, measure, optional, ratio
from _gpu_kernels import BLOCK_TRITON, SELECTIVE_TRITON
from _scan_methods import block_inputs, method_fn, selective_inputs, to_layout

from ssmhub.ops import block_scan, block_scan_ref

BLOCK_TRITON_CHUNKED = ("ssmhub.ops.triton.block_scan", "block_scan_triton_chunked")  # CHUNK_SIZE steps a program


def transformers_label() -> str:
    kernel = importlib.util.find_spec("mamba_ssm") is not None
    return "mamba_ssm's kernel (installed)" if kernel else "its pure-PyTorch loop (no mamba_ssm)"


def train_call(fn, leaves: list[torch.Tensor], g: torch.Tensor):
    """One forward + backward of ``(fn(*leaves) · g).sum()``, gradients cleared first."""

    def call():
        for t in leaves:
            t.grad = None
        (fn(*leaves) * g).sum().backward()

    return call


def timed_cell(ctx: Context, fn, inputs, results: dict, key: str, predicted_s: float = 0.0) -> str:
    """Median ms of forward + backward on ``inputs()`` (leaves, weights) into ``results[key]``, or the reason it was
    not run or failed; the inputs are made on the device only for a run."""
    if fn is None:
        return "not available"
    if predicted_s > ctx.plan["slow_call_s"]:
        return f"not run: predicted ≈ {predicted_s:.0f} s a call (backward O(T²))"
    try:
        ms, n = measure(ctx, train_call(fn, *inputs()))
    except Exception as error:
        return failure(error)
    finally:
        free_memory(ctx.device)
    results[key] = ms
    return f"{ms:.1f}" + ("" if n == ctx.args.repeats else f" (n={n})")


def on_device(ctx: Context, layout: str, tensors: list[torch.Tensor], g: torch.Tensor):
    """The 7 selective-scan inputs in ``layout`` on the device as leaves that require grad, and the weights."""
    laid, laid_g = to_layout(layout, tensors, g)
    return [t.to(ctx.device).requires_grad_() for t in laid], laid_g.to(ctx.device)


def selective_methods():
    """(name, fn on the 7 leaves in its layout, layout name) for Triton, torch and transformers."""
    triton_scan, _ = optional(*SELECTIVE_TRITON)
    triton = None if triton_scan is None else (lambda *a: triton_scan(*a)[0])
    try:
        hf = method_fn("transformers", None)
    except ImportError:
        hf = None
    torch_scan = method_fn("fast", None)
    return [("triton", triton, "fast"), ("torch", torch_scan, "fast"), ("transformers", hf, "transformers")]


def selective_table(ctx: Context, section: Section) -> None:
    batch, channels, state = ctx.plan["selective_speed"]
    _, why = optional(*SELECTIVE_TRITON)
    section.text(
        f"Selective scan, B {batch}, d_inner {channels}, N {state}, D skip and silu(z) gate, float32, all 7 inputs "
        f"leaves; forward + backward of (y·g).sum(), median of {ctx.args.repeats} after a warm-up. transformers: "
        f"`mamba_selective_scan` (MambaMixer's scan) in its own layout, {transformers_label()}."
        + (f" Triton {why}." if why else "")
    )
    speed_ups = ["Triton speed-up over torch", "over transformers"]
    table = section.table(["T", "Triton ms", "torch ms", "transformers ms", *speed_ups])
    previous = None  # (T, transformers seconds) for the O(T²) prediction
    for length in ctx.plan["scan_lengths"]:
        tensors, g = selective_inputs(batch, length, channels, state, seed=0)
        results, cells = {}, []
        for name, fn, layout in selective_methods():
            predicted = 0.0 if name != "transformers" or previous is None else previous[1] * (length / previous[0]) ** 2
            inputs = functools.partial(on_device, ctx, layout, tensors, g)
            cells.append(timed_cell(ctx, fn, inputs, results, name, predicted))
        if isinstance(results.get("transformers"), float):
            previous = (length, results["transformers"] / 1e3)
        t = results.get("triton")
        table.add(length, *cells, ratio(results.get("torch"), t), ratio(results.get("transformers"), t))


def block_table(ctx: Context, section: Section) -> None:
    batch, heads, block = ctx.plan["block_speed"]
    triton_scan, why = optional(*BLOCK_TRITON)
    chunked_scan, _ = optional(*BLOCK_TRITON_CHUNKED)
    chunk, _ = optional(BLOCK_TRITON_CHUNKED[0], "CHUNK_SIZE")
    section.text(
        f"Block scan x_k = A_k x_(k-1) + v_k, B {batch}, h {heads} blocks of b {block} (a BDLRNN layer of width "
        f"{heads * block}), x_0 given, float32 leaves, forward + backward of (states·g).sum(); the loop is "
        f"`block_scan_ref` (one einsum per token); Triton: the sequential kernel, chunked: `block_scan_triton_chunked` "
        f"({chunk} steps a program)." + (f" Triton {why}." if why else "")
    )
    times = ["Triton ms", "chunked ms", "torch parallel ms", "loop ms"]
    table = section.table(["T", *times, "Triton speed-up over torch", "chunked over torch", "Triton over loop"])
    methods = (("triton", triton_scan), ("chunked", chunked_scan), ("torch", block_scan), ("loop", block_scan_ref))
    for length in ctx.plan["block_lengths"]:
        A, v, x0, g = (t.to(ctx.device) for t in block_inputs(batch, length, heads, block, seed=0))
        inputs = lambda A=A, v=v, x0=x0, g=g: ([t.requires_grad_() for t in (A, v, x0)], g)  # noqa: E731
        results = {}
        cells = [timed_cell(ctx, fn, inputs, results, name) for name, fn in methods]
        torch_ms = results.get("torch")
        speed_ups = [ratio(torch_ms, results.get("triton")), ratio(torch_ms, results.get("chunked"))]
        table.add(length, *cells, *speed_ups, ratio(results.get("loop"), results.get("triton")))
        del A, v, x0, g, inputs


def step_scan_speed(ctx: Context, section: Section) -> None:
    """Both scan tables; a failed measurement fails the step after every row is written."""
    selective_table(ctx, section)
    block_table(ctx, section)
    tables = [part for part in section.parts if isinstance(part, Table)]
    failed = [row for table in tables for row in table.rows if any(cell.startswith("failed:") for cell in row)]
    if failed:
        raise RuntimeError(f"{len(failed)} row(s) with a failed measurement (above)")
