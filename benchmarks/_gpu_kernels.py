"""Steps a and c of ``gpu_suite.py``: every Triton kernel's error against a float64 reference, and the ``fft_conv``
backends' speed. The Triton scans (``ssmhub.ops.triton.selective_scan`` / ``.block_scan``) are optional: a row says
"not available: reason" until they land."""

from __future__ import annotations

import torch
from _gpu_common import Context, Section, failure, measure, optional, ratio
from _scan_methods import block_inputs, selective_inputs

from ssmhub.ops import block_scan, fft_conv, fft_conv_ref, selective_scan
from ssmhub.ops.triton import can_run

SELECTIVE_TRITON = ("ssmhub.ops.triton.selective_scan", "selective_scan_triton")
BLOCK_TRITON = ("ssmhub.ops.triton.block_scan", "block_scan_triton")
TOLERANCE = {"FlashButterfly": (1e-5, 1e-4), "scan": (1e-4, 1e-3)}  # (forward, gradients), relative


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got − ref| / max |ref|, in float64."""
    return ((got.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30)).item()


def outputs_and_grads(call, tensors: list[torch.Tensor], grad_of: int, weights: list[torch.Tensor]):
    """``call(*leaves)`` (a list of outputs) and the gradients of ``Σ output·weight`` w.r.t. the first ``grad_of``
    leaves (copies of ``tensors``)."""
    leaves = [t.detach().clone().requires_grad_(i < grad_of) for i, t in enumerate(tensors)]
    outputs = call(*leaves)
    loss = sum((out * w.to(out.dtype)).sum() for out, w in zip(outputs, weights))
    grads = torch.autograd.grad(loss, leaves[:grad_of], allow_unused=True)
    missing = [i for i, g in enumerate(grads) if g is None]
    if missing:
        raise RuntimeError(f"no gradient for inputs {missing}")
    return [o.detach() for o in outputs], grads


def errors_vs_float64(call, ref_call, tensors, grad_of, weights) -> tuple[float, float]:
    """(forward, gradient) relative errors of ``call`` on float32 inputs against ``ref_call`` on float64 copies."""
    out, grads = outputs_and_grads(call, tensors, grad_of, weights)
    wide = [t.double() if t.is_floating_point() else t for t in tensors]
    ref_out, ref_grads = outputs_and_grads(ref_call, wide, grad_of, [w.double() for w in weights])
    forward = max(rel_error(a, b) for a, b in zip(out, ref_out))
    return forward, max(rel_error(a, b) for a, b in zip(grads, ref_grads))


def error_row(table, kernel: str, case: str, shape: str, tolerance, compute) -> bool:
    """One row of the error table; False when the kernel ran and missed ``tolerance`` or failed."""
    try:
        forward, backward = compute()
    except Exception as error:
        table.add(kernel, case, shape, "–", "–", failure(error))
        return False
    good = forward < tolerance[0] and backward < tolerance[1]
    table.add(kernel, case, shape, f"{forward:.1e}", f"{backward:.1e}", "ok" if good else f"above {tolerance}")
    return good


def flashbutterfly_errors(ctx: Context, length: int) -> tuple[float, float]:
    gen = torch.Generator().manual_seed(length)
    signal, taps = torch.randn(2, 4, length, generator=gen), torch.randn(4, length, generator=gen) / length**0.5
    weights = [torch.randn(2, 4, length, generator=gen).to(ctx.device)]
    fast = lambda u, k: [fft_conv(u, k, backend="triton")]  # noqa: E731
    ref = lambda u, k: [fft_conv_ref(u, k)]  # noqa: E731
    return errors_vs_float64(fast, ref, [signal.to(ctx.device), taps.to(ctx.device)], 2, weights)


def _triton_fft_runs(ctx: Context, length: int) -> tuple[bool, str]:
    """Whether the fused FlashButterfly kernel is run at ``length``: where it can, and only up to the plan's
    ``triton_fft_max`` (its compilation for FFT size 4096 outlasted a 40 s step cap on an H100, 2026-11-28)."""
    if length > ctx.plan["triton_fft_max"]:
        return False, f"L > {ctx.plan['triton_fft_max']}: compiling the kernel there outlasts the step's cap"
    return can_run(ctx.device, 2 * length)


def flashbutterfly_rows(ctx: Context, table) -> bool:
    good, tolerance = True, TOLERANCE["FlashButterfly"]
    for length in ctx.plan["triton_lengths"]:
        runs, why = _triton_fft_runs(ctx, length)
        if not runs:
            table.add("FlashButterfly fft_conv", "causal", f"L {length}", "–", "–", f"not run: {why}")
            continue
        compute = lambda n=length: flashbutterfly_errors(ctx, n)  # noqa: E731
        good &= error_row(table, "FlashButterfly fft_conv", "causal", f"2×4×{length}", tolerance, compute)
    return good


def selective_case(ctx: Context, case: str):
    """Inputs (the 7 leaves x, Δ, A, B, C, D, z and the extra tensors), weights and keyword names of one case."""
    batch, length, channels, state = ctx.plan["error_selective"]
    tensors, g = selective_inputs(batch, length, channels, state, seed=0)
    extra, names, weights = [], [], [g]
    if case == "state, resets":
        gen = torch.Generator().manual_seed(1)
        extra = [torch.randn(batch, channels, state, generator=gen), torch.rand(batch, length, generator=gen) < 0.02]
        names, weights = ["initial_state", "resets"], [g, torch.randn(batch, channels, state, generator=gen)]
    move = lambda ts: [t.to(ctx.device) for t in ts]  # noqa: E731
    return move(tensors + extra), move(weights), names


def selective_call(scan, names: list[str]):
    """``scan`` as a call on the 7 leaves (x, Δ, A, B, C, D, z) plus the keyword tensors ``names``: [y(, final)]."""

    def call(*leaves):
        y, final = scan(*leaves[:7], **dict(zip(names, leaves[7:])), return_final_state=bool(names))
        return [y, final] if names else [y]

    return call


def selective_rows(ctx: Context, table) -> bool:
    triton_scan, why = optional(*SELECTIVE_TRITON)
    shape = "B×T×E×N " + "×".join(map(str, ctx.plan["error_selective"]))
    good = True
    for label, scan in (("Triton selective_scan", triton_scan), ("torch selective_scan (float32)", selective_scan)):
        if scan is None:
            table.add(label, "all", shape, "–", "–", why)
            continue
        for case in ("D, z", "state, resets"):
            tensors, weights, names = selective_case(ctx, case)
            call, ref = selective_call(scan, names), selective_call(selective_scan, names)
            compute = lambda c=call, r=ref, t=tensors, w=weights: errors_vs_float64(c, r, t, 7, w)  # noqa: E731
            good &= error_row(table, label, case, shape, TOLERANCE["scan"], compute)
    return good


def block_rows(ctx: Context, table) -> bool:
    triton_scan, why = optional(*BLOCK_TRITON)
    batch, length, heads, block = ctx.plan["error_block"]
    shape = f"B×T×h×b {batch}×{length}×{heads}×{block}"
    good = True
    for label, scan in (("Triton block_scan", triton_scan), ("torch block_scan (float32)", block_scan)):
        if scan is None:
            table.add(label, "all", shape, "–", "–", why)
            continue
        A, v, x0, g = (t.to(ctx.device) for t in block_inputs(batch, length, heads, block, seed=0))
        for case, tensors in (("x0 = 0", [A, v]), ("x0 given", [A, v, x0])):
            call = lambda *leaves, fn=scan: [fn(*leaves)]  # noqa: E731
            ref = lambda *leaves: [block_scan(*leaves)]  # noqa: E731
            compute = lambda c=call, r=ref, t=tensors, w=[g]: errors_vs_float64(c, r, t, len(t), w)  # noqa: E731
            good &= error_row(table, label, case, shape, TOLERANCE["scan"], compute)
    return good


def step_kernel_errors(ctx: Context, section: Section) -> None:
    """Each kernel on float32 inputs against the pure-torch path on float64 copies (FlashButterfly: the float64
    ``torch.fft`` convolution): max |error| / max |reference| of the outputs and of the gradients of a random
    weighting of them. The float32 torch scans are rows too, as the yardstick."""
    limits = "; ".join(f"{name} {fwd:.0e} / {grad:.0e}" for name, (fwd, grad) in TOLERANCE.items())
    section.text(f"Relative tolerances (forward / gradients): {limits}. Kernels run on float32 inputs.")
    table = section.table(["kernel", "case", "sizes", "forward rel. error", "gradient rel. error", "status"])
    # the scans first: compiling the fused FFT kernel is the slow part, and a cap reached there keeps their rows
    good = [rows(ctx, table) for rows in (selective_rows, block_rows, flashbutterfly_rows)]
    if not all(good):
        raise RuntimeError("a kernel failed or missed its tolerance (rows above)")


def step_fft_backends(ctx: Context, section: Section) -> None:
    """``fft_conv`` (causal, forward) per backend, median ms and the speed-up over torch.fft."""
    batch, heads = ctx.plan["fft_shape"]
    section.text(f"(batch, channels) = ({batch}, {heads}), float32, forward only; median of {ctx.args.repeats}.")
    table = section.table(["L", "torch.fft ms", "Butterfly ms (speed-up)", "Triton ms (speed-up)"])
    for length in ctx.plan["fft_lengths"]:
        u = torch.randn(batch, heads, length, device=ctx.device)
        kernel = torch.randn(heads, length, device=ctx.device) / length**0.5
        ms = {}
        for backend in ("torch", "butterfly", "triton"):
            runs, why = _triton_fft_runs(ctx, length) if backend == "triton" else (True, "")
            call = lambda b=backend, u=u, k=kernel: fft_conv(u, k, backend=b)  # noqa: E731
            try:
                ms[backend] = measure(ctx, call)[0] if runs else why
            except Exception as error:
                ms[backend] = failure(error)
        cells = [_fft_cell(ms[b], ms["torch"]) for b in ("butterfly", "triton")]
        table.add(length, _fft_cell(ms["torch"], None), *cells)


def _fft_cell(ms, torch_ms) -> str:
    if not isinstance(ms, float):
        return f"not run: {ms}" if not str(ms).startswith("failed") else ms
    return f"{ms:.3f}" + (f" ({ratio(torch_ms, ms)})" if torch_ms is not None else "")
