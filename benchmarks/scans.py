"""The scans against their references, forward + backward, CPU, fp32: Mamba's selective scan and the block scan.

Both time one forward plus the backward of ``(out * g).sum()`` per call, each (method, length) in a fresh worker
process (``--worker``), and report medians, the extra peak memory of the first call (peak RSS over it minus the RSS
just before, the peak mark reset through ``/proc/self/clear_refs``: ``_memory.peak_rss_above_baseline``) and the
agreement of the methods. The inputs and the methods are in ``_scan_methods.py`` (the GPU suite times them too).

Selective scan (``--kind selective``, writes ``results/selective_scan.md``)
-------------------------------------------------------------------------
All three compute the selective SSM of Mamba (Gu & Dao 2023, §3.2; SeRpEnt Eqs. 2 and 8) with a D skip
and a silu(z) gate, float32, shapes x, Δ, z (Bt, T, E), A (E, N), B, C (Bt, T, N), D (E,), every input a
leaf that requires grad. One call = forward, then ``backward`` of ``(y * g).sum()`` for a fixed random g,
so the time covers the gradients w.r.t. x, Δ, A, B, C, D and z (what a training step pays).

- fast: :func:`ssmhub.ops.selective_scan` (chunked, its own backward; default chunk size).
- ref: :func:`ssmhub.ops.selective_scan_ref`, the loop over time differentiated by autograd.
- transformers: ``mamba_selective_scan`` from ``transformers.models.mamba.modeling_mamba`` (the path a
  CPU ``MambaMixer`` takes without ``mamba_ssm``), called in its own (Bt, E, T) / (Bt, N, T) layout with
  Δ already positive (``delta_softplus=False``); the transposes are made before timing.

Inputs are Mamba-like: A = −(1..N) per channel (S4D-real init), Δ = exp(U[log 1e-3, log 0.1]) (the dt
init range), x, B, C, z standard normal, D = 1. Each (method, T) runs in its own subprocess; its "extra
peak" memory is the peak RSS over its first (warm-up) call minus the RSS just before it (peak mark reset
through /proc/self/clear_refs). The peers are timed in rounds alternating with selective_scan in the same
process, and their ratio column is the median of the per-round ratios, so a busy spell on a shared machine
slows both sides of a ratio alike. A loop peer is not run at T when the previous T's single call, scaled by
(T / T_prev)² (transformers' backward writes a full-size gradient per step, O(T²)), predicts more than
``--slow-seconds``.

Two more sections choose and justify the algorithm: a chunk-size sweep of selective_scan (round-robin
repeats in one process), and a time-parallel alternative — the chunked cumulative-log-decay ("cumsum")
scan, ``h_t = exp(S_t − m)·cumsum_s(exp(m − S_s)·B̄_s x_s)`` per chunk with the re-centring m = S_end / 2
and a recurrence across chunks (its cumulative sums as lower-triangular matmuls), written with autograd
in ``_scan_methods.py`` for timing only — including whether it stays finite under extreme decay (Σ Δ·A ≈ −1000
inside a chunk), which it cannot (exp(m − S) overflows).

Run: ``OMP_NUM_THREADS=1 python benchmarks/scans.py --kind selective`` (about 5 minutes on a 2-core CPU).

Block scan (``--kind block``, writes ``results/block_scan.md``)
--------------------------------------------------------------
Both compute all states of the block-diagonal recurrence ``x_k = A_k x_{k-1} + v_k`` (paper 002, Eq. 5)
with ``A`` (B, T, h, b, b), ``v`` (B, T, h, b) and a shared initial state (1, h, b), all float32 leaves
that require grad. One call = forward, then ``backward`` of ``(states * g).sum()`` for a fixed random
``g``, so the time covers the gradients w.r.t. A, v and x_0 (what a training step pays).

- scan: :func:`ssmhub.ops.block_scan`, the work-efficient log-depth scan (T − 1 b×b matmuls, ~2T matvecs).
- loop: :func:`ssmhub.ops.block_scan_ref` in float32, one ``einsum('bhij,bhj->bhi')`` per token
  (T matvecs: b times less arithmetic than the scan, but T dependent steps).

The blocks are column-normalised with p = 1 (Eq. 6, ``v / max(1, ‖v‖₁)`` per column), so nothing grows.

Each (length, method) runs in its own subprocess; its "extra peak" memory is measured as the selective scan's is
(above). Within a worker: one untimed warm-up call, then ``--repeats`` timed calls; if the warm-up takes longer
than ``--slow-seconds``, only ``--slow-repeats`` timed calls are run (the table gives n). Medians are
reported. Before timing, the parent checks that scan and loop agree at a small batch.

Run: ``python benchmarks/scans.py --kind block`` (a few minutes on 2 CPU cores with the defaults).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from ssmhub.ops import block_scan, block_scan_ref, selective_scan, selective_scan_ref
from ssmhub.ops.selective_scan import DEFAULT_CHUNK_SIZE

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _memory import peak_rss_above_baseline
from _report import markdown_table, median, parse_args_with_defaults, report
from _scan_methods import BLOCK_METHODS, block_inputs, cumsum_scan, method_fn, selective_inputs, to_layout

PEERS = ("ref", "transformers")  # the selective scan's loop peers
# per kind: the defaults of the flags whose default depends on it
KIND_DEFAULTS = {
    "selective": {"lengths": [256, 1024, 4096], "batch": 4, "name": "selective_scan"},
    "block": {"lengths": [40, 512, 4096], "batch": 128, "name": "block_scan"},
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--kind", choices=sorted(KIND_DEFAULTS), default="selective", help="which scan")
    p.add_argument(
        "--lengths", type=int, nargs="+", default=None, help="T (selective 256 1024 4096, block 40 512 4096)"
    )
    p.add_argument("--batch", type=int, default=None, help="selective 4, block 128")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per row (selective: of selective_scan)")
    p.add_argument(
        "--slow-seconds",
        type=float,
        default=60.0,
        help="selective: skip a loop peer predicted slower than this; a warm-up slower gets --slow-repeats calls",
    )
    p.add_argument("--slow-repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: leave torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default=None, help="results/<name>.md (selective_scan, block_scan)")
    p.add_argument("--no-write", action="store_true", help="print only; do not write the results file")
    p.add_argument("--channels", type=int, default=512, help="selective: E, the inner width (2 × model width)")
    p.add_argument("--state", type=int, default=16, help="selective: N, the state size per channel")
    p.add_argument("--peer-repeats", type=int, default=3, help="selective: timed calls per row for the loop peers")
    p.add_argument("--sweep-chunks", type=int, nargs="+", default=[8, 16, 32, 64, 128], help="selective")
    p.add_argument("--sweep-lengths", type=int, nargs="+", default=[256, 1024, 4096], help="selective")
    p.add_argument("--alt-lengths", type=int, nargs="+", default=[256, 1024], help="selective")
    p.add_argument("--alt-chunks", type=int, nargs="+", default=[16, 64], help="selective: chunks of the cumsum scan")
    p.add_argument("--heads", type=int, default=8, help="block: h, the number of blocks")
    p.add_argument("--block", type=int, default=8, help="block: b, the block size")
    p.add_argument("--worker", nargs="+", metavar="ARG", help=argparse.SUPPRESS)
    args = parse_args_with_defaults(p, argv, "kind", KIND_DEFAULTS)
    return args


# --------------------------------------------------------------------------------------------- workers
def forward_backward(fn, leaves, g) -> tuple[float, float]:
    for t in leaves:
        t.grad = None
    start = time.perf_counter()
    y = fn(*leaves)
    forward_s = time.perf_counter() - start
    (y * g).sum().backward()
    return forward_s, time.perf_counter() - start


def worker_inputs(args, method: str, seq_len: int):
    """The method's leaves (requiring grad) and g in its own layout, and for a selective peer, selective_scan's own
    copy of the same inputs to alternate with (None otherwise)."""
    if args.kind == "block":
        A, v, x0, g = block_inputs(args.batch, seq_len, args.heads, args.block, args.seed)
        return [t.requires_grad_() for t in (A, v, x0)], g, None
    tensors, g = selective_inputs(args.batch, seq_len, args.channels, args.state, args.seed)
    leaves, g_method = to_layout(method, tensors, g)
    paired = None if method == "fast" else ([t.clone().requires_grad_() for t in tensors], g)
    return [t.clone().requires_grad_() for t in leaves], g_method, paired


def worker(args) -> int:
    """``--worker METHOD T [CHUNK]``: time one method at one length; print a JSON line.

    The extra peak memory is taken over the method's warm-up call alone. A selective peer (any method but
    ``fast``) is then timed in rounds alternating with selective_scan on its own copy of the same inputs, so that
    its ratio to selective_scan compares calls made moments apart.
    """
    method, seq_len = args.worker[0], int(args.worker[1])
    chunk = int(args.worker[2]) if len(args.worker) > 2 else None
    leaves, g, paired = worker_inputs(args, method, seq_len)
    fn = BLOCK_METHODS[method] if args.kind == "block" else method_fn(method, chunk)
    fast_fn = method_fn("fast", None)
    warm = {}

    def warm_up(_):
        warm["s"] = forward_backward(fn, leaves, g)[1]

    extra_bytes, _ = peak_rss_above_baseline(lambda: None, warm_up)
    if paired:
        forward_backward(fast_fn, *paired)
    n = args.peer_repeats if method in PEERS else args.repeats
    if warm["s"] > args.slow_seconds:
        n = min(n, args.slow_repeats)
    forward_ms, total_ms, fast_ms = [], [], []
    for _ in range(n):
        f, t = forward_backward(fn, leaves, g)
        forward_ms.append(1e3 * f)
        total_ms.append(1e3 * t)
        if paired:
            fast_ms.append(1e3 * forward_backward(fast_fn, *paired)[1])
    result = {"forward_ms": forward_ms, "total_ms": total_ms, "fast_ms": fast_ms, "warm_s": warm["s"]}
    result["extra_mib"] = extra_bytes / 2**20
    print(json.dumps(result), flush=True)
    return 0


def run_worker(args, method: str, seq_len: int, chunk: int | None = None) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--kind", args.kind, "--worker", method, str(seq_len)]
    if chunk is not None:
        cmd.append(str(chunk))
    cmd += ["--batch", str(args.batch), "--channels", str(args.channels), "--state", str(args.state)]
    cmd += ["--heads", str(args.heads), "--block", str(args.block), "--seed", str(args.seed)]
    cmd += ["--repeats", str(args.repeats), "--peer-repeats", str(args.peer_repeats)]
    cmd += ["--slow-seconds", str(args.slow_seconds), "--slow-repeats", str(args.slow_repeats)]
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------- selective scan
def sweep_worker(args, seq_len: int) -> dict[int, list[float]]:
    """Chunk sizes in round-robin order in this process (so slow phases of a shared machine hit all alike)."""
    tensors, g = selective_inputs(args.batch, seq_len, args.channels, args.state, args.seed)
    leaves = [t.requires_grad_() for t in tensors]
    fns = {c: method_fn("fast", c) for c in args.sweep_chunks}
    times: dict[int, list[float]] = {c: [] for c in args.sweep_chunks}
    for fn in fns.values():  # warm-up
        forward_backward(fn, leaves, g)
    for _ in range(args.repeats):
        for c, fn in fns.items():
            times[c].append(1e3 * forward_backward(fn, leaves, g)[1])
    return times


def agreement(args, seq_len: int) -> tuple[float, float, float]:
    """Forward at batch 1: max |fast − ref|, max |transformers − ref| and max |ref| (float32)."""
    tensors, _ = selective_inputs(1, seq_len, args.channels, args.state, args.seed)
    hf_inputs, _ = to_layout("transformers", tensors, tensors[0])
    with torch.no_grad():
        ref, _ = selective_scan_ref(*tensors)
        fast, _ = selective_scan(*tensors)
        hf = method_fn("transformers", None)(*hf_inputs).transpose(1, 2)
    return (fast - ref).abs().max().item(), (hf - ref).abs().max().item(), ref.abs().max().item()


def extreme_decay_check(args) -> dict[str, str]:
    """Whether each method's output is finite, and its max error vs the loop, when Σ Δ·A ≈ −1000 per chunk."""
    tensors, _ = selective_inputs(1, 128, 8, args.state, args.seed)
    tensors[1] = torch.full_like(tensors[1], 4.0)  # Δ·A = −4 … −64 per step: −256 … −4096 over 64 steps
    tensors[1][:, 64:80] = 0.0  # and a Δ = 0 padding run
    with torch.no_grad():
        ref, _ = selective_scan_ref(*tensors)
        out = {"fast": selective_scan(*tensors)[0]}
        out |= {f"cumsum (chunk {c})": cumsum_scan(*tensors, chunk=c) for c in args.alt_chunks}
    result = {}
    for name, y in out.items():
        finite = bool(torch.isfinite(y).all())
        err = (y - ref).abs().max().item() if finite else float("nan")
        result[name] = f"finite, max err vs loop {err:.1e}" if finite else "non-finite (inf/NaN)"
    return result


def fmt_ms(res: dict | None) -> str:
    if res is None:
        return "not run"
    return f"{median(res['total_ms']):.1f} (n={len(res['total_ms'])})"


def paired_ratio(res: dict | None) -> str:
    """The median of a peer's per-round time ratios to the selective_scan calls alternating with it."""
    if res is None:
        return "–"
    return f"{median([m / f for m, f in zip(res['total_ms'], res['fast_ms'])]):.1f}×"


def extra_peak(res: dict | None) -> str:
    return "not run" if res is None else f"{res['extra_mib']:.0f}"


# --------------------------------------------------------------------------------------------- kernel choices
def decay_case(args, gen) -> tuple[tuple, str]:
    """``Ā = exp(Δ·A)`` on one chunk buffer (C, Bt, N, E): ``torch.exp`` vs ``torch.exp2`` of Δ·A·log₂e, and
    both ones' max relative error against float64 exp."""
    shape = (DEFAULT_CHUNK_SIZE, args.batch, args.state, args.channels)
    log_decay = -torch.rand(shape, generator=gen) * 4  # Δ·A in [−4, 0]
    log2_decay = log_decay * math.log2(math.e)
    out = torch.empty(shape)
    exact = torch.exp(log_decay.double())
    rel_exp = ((torch.exp(log_decay).double() - exact).abs() / exact).max().item()
    rel_exp2 = ((torch.exp2(log2_decay).double() - exact).abs() / exact).max().item()
    sides = (lambda: torch.exp(log_decay, out=out), lambda: torch.exp2(log2_decay, out=out))
    return sides, f"max rel. error vs float64 exp: exp {rel_exp:.1e}, exp2 {rel_exp2:.1e}"


def conv_case(args, gen) -> tuple:
    """The mixer's causal depthwise conv (k = 4) + SiLU, forward + backward at (Bt, T = 256, E): ``F.conv1d`` in
    the (Bt, E, T) layout vs :func:`ssmhub.ops.short_conv.causal_depthwise_conv` in (Bt, T, E)."""
    from ssmhub.ops.short_conv import causal_depthwise_conv

    seq_len, taps = 256, 4
    xz = torch.randn(args.batch, seq_len, 2 * args.channels, generator=gen)  # an in_proj output
    weight = torch.randn(args.channels, taps, generator=gen, requires_grad=True)
    bias = torch.randn(args.channels, generator=gen, requires_grad=True)
    other = torch.randn(args.batch, seq_len, args.channels, generator=gen)

    def conv1d_path():
        u = xz[..., : args.channels].detach().requires_grad_()
        stream = F.pad(u.transpose(1, 2), (taps - 1, 0))  # (Bt, E, k − 1 + T)
        y = F.silu(F.conv1d(stream, weight.unsqueeze(1), bias, groups=args.channels)).transpose(1, 2)
        (y * other).sum().backward()

    def short_conv_path():
        u = xz[..., : args.channels].detach().requires_grad_()
        y = F.silu(causal_depthwise_conv(u, weight, bias))
        (y * other).sum().backward()

    return conv1d_path, short_conv_path


def alternating_times(cases: dict, repeats: int) -> dict[str, tuple[list[float], list[float]]]:
    """Seconds of each case's (peer, ours) calls, ``repeats`` rounds alternating between every side."""
    times = {name: ([], []) for name in cases}
    for _ in range(repeats):
        for name, sides in cases.items():
            for fn, bucket in zip(sides, times[name]):
                start = time.perf_counter()
                fn()
                bucket.append(time.perf_counter() - start)
    return times


def kernel_choices(args, repeats: int = 21) -> str:
    """Two elementwise choices behind the scan and the mixer, each against the PyTorch op it replaces.

    1. ``Ā = exp(Δ·A)`` on one chunk buffer (C, Bt, N, E): ``torch.exp`` vs ``torch.exp2`` of Δ·A·log₂e.
    2. The mixer's causal depthwise conv (k = 4) + SiLU, forward + backward at (Bt, T = 256, E):
       ``F.conv1d`` in the (Bt, E, T) layout (transpose, prepend k − 1 zeros, conv, SiLU, transpose back,
       as transformers' MambaMixer and ssmhub before) vs :func:`ssmhub.ops.short_conv.causal_depthwise_conv`
       in (Bt, T, E); both feed a downstream product with a (Bt, T, E) tensor, as the scan does.
    Medians of ``repeats`` calls alternating between the two sides.
    """
    gen = torch.Generator().manual_seed(args.seed)
    decay_sides, decay_accuracy = decay_case(args, gen)
    cases = {"exp": decay_sides, "conv": conv_case(args, gen)}
    times = alternating_times(cases, repeats)
    labels = {
        "exp": ("torch.exp(Δ·A)", "torch.exp2(Δ·A·log₂e)", decay_accuracy),
        "conv": (
            "F.conv1d in (Bt, E, T) + transposes",
            "causal_depthwise_conv in (Bt, T, E)",
            "equal to conv1d in tests/ops/test_short_conv.py (1e-12, float64)",
        ),
    }
    rows = []
    for name, (label_peer, label_ours, accuracy) in labels.items():
        peer_ms, ours_ms = 1e3 * median(times[name][0]), 1e3 * median(times[name][1])
        rows.append([label_peer, f"{peer_ms:.3f}", label_ours, f"{ours_ms:.3f}", f"{peer_ms / ours_ms:.1f}×", accuracy])
    return markdown_table(["PyTorch op", "ms", "ssmhub's choice", "ms", "speed-up", "accuracy"], rows)


# --------------------------------------------------------------------------------------------- selective: tables
SELECTIVE_HEADERS = [
    "T",
    "selective_scan ms",
    "selective_scan_ref ms",
    "transformers ms",
    "ref / fast (paired)",
    "transformers / fast (paired)",
    "fast fwd ms",
    "fast µs per step",
]
MEMORY_HEADERS = [
    "T",
    "one (Bt, T, E, N) fp32 tensor MiB",
    "fast extra peak MiB",
    "ref extra peak MiB",
    "transformers extra peak MiB",
]
AGREEMENT_HEADERS = ["T", "max abs diff fast vs ref", "max abs diff transformers vs ref", "max abs ref"]
ALTERNATIVE_HEADERS = [
    "T",
    "cumsum chunk",
    "cumsum ms",
    f"cumsum / selective_scan (chunk {DEFAULT_CHUNK_SIZE}), paired",
    "cumsum extra peak MiB",
    "selective_scan extra peak MiB",
]


def run_length(args, results: dict, predicted: dict, seq_len: int) -> None:
    """selective_scan at ``seq_len``, then each loop peer unless the previous length's call, scaled by
    (T / T_prev)², predicts more than ``--slow-seconds`` (then its result is None)."""
    results[("fast", seq_len)] = run_worker(args, "fast", seq_len)
    for peer in PEERS:
        prev = [(t, results[(peer, t)]) for t in args.lengths if t < seq_len and results.get((peer, t))]
        if prev:
            t_prev, r_prev = prev[-1]
            predicted[(peer, seq_len)] = r_prev["warm_s"] * (seq_len / t_prev) ** 2
        too_slow = predicted.get((peer, seq_len), 0.0) > args.slow_seconds
        results[(peer, seq_len)] = None if too_slow else run_worker(args, peer, seq_len)


def length_rows(args, results: dict, seq_len: int) -> tuple[list, list, list]:
    """The results, memory and agreement rows of one length."""
    fast, ref, hf = (results[(m, seq_len)] for m in ("fast", *PEERS))
    t_fast = median(fast["total_ms"])
    row = [seq_len, fmt_ms(fast), fmt_ms(ref), fmt_ms(hf), paired_ratio(ref), paired_ratio(hf)]
    row += [f"{median(fast['forward_ms']):.1f}", f"{1e3 * t_fast / seq_len:.0f}"]
    print("  " + " | ".join(str(c) for c in row), flush=True)
    state_mib = args.batch * seq_len * args.channels * args.state * 4 / 2**20
    memory_row = [seq_len, f"{state_mib:.0f}", extra_peak(fast), extra_peak(ref), extra_peak(hf)]
    diff_fast, diff_hf, scale = agreement(args, seq_len)
    return row, memory_row, [seq_len, f"{diff_fast:.2e}", f"{diff_hf:.2e}", f"{scale:.2f}"]


def speed_tables(args) -> tuple[dict, dict, str, str, str]:
    """The measurement against the loop peers at every ``--lengths``: results and predictions per (method, T), and
    the results, memory and agreement tables."""
    results: dict[tuple[str, int], dict | None] = {}
    predicted: dict[tuple[str, int], float] = {}
    rows, memory_rows, agree_rows = [], [], []
    for seq_len in args.lengths:
        run_length(args, results, predicted, seq_len)
        row, memory_row, agree_row = length_rows(args, results, seq_len)
        rows.append(row)
        memory_rows.append(memory_row)
        agree_rows.append(agree_row)
    tables = (markdown_table(h, r) for h, r in ((SELECTIVE_HEADERS, rows), (MEMORY_HEADERS, memory_rows)))
    return results, predicted, *tables, markdown_table(AGREEMENT_HEADERS, agree_rows)


def sweep_table(args) -> str:
    """selective_scan's time per chunk size at every ``--sweep-lengths``, the best marked."""
    rows = []
    for seq_len in args.sweep_lengths:
        times = sweep_worker(args, seq_len)
        best = min(median(v) for v in times.values())
        cells = [f"{median(times[c]):.1f}" + (" (best)" if median(times[c]) == best else "") for c in args.sweep_chunks]
        rows.append([seq_len, *cells])
        print("  sweep " + " | ".join(str(c) for c in rows[-1]), flush=True)
    return markdown_table(["T", *[f"chunk {c} ms" for c in args.sweep_chunks]], rows)


def alternative_table(args, results: dict) -> str:
    """The cumsum scan per ``--alt-chunks`` at every ``--alt-lengths``, against selective_scan."""
    rows = []
    for seq_len in args.alt_lengths:
        fast = results.get(("fast", seq_len)) or run_worker(args, "fast", seq_len)
        for chunk in args.alt_chunks:
            alt = run_worker(args, "cumsum", seq_len, chunk)
            rows.append([seq_len, chunk, fmt_ms(alt), paired_ratio(alt)])
            rows[-1] += [f"{alt['extra_mib']:.0f}", f"{fast['extra_mib']:.0f}"]
            print("  alt " + " | ".join(str(c) for c in rows[-1]), flush=True)
    return markdown_table(ALTERNATIVE_HEADERS, rows)


# --------------------------------------------------------------------------------------------- selective: report
def selective_notes(args, results: dict, predicted: dict) -> str:
    """Shapes, threads, the peers left out, and why transformers' loop is slow."""
    skipped = [
        f"{peer} at T = {t} (predicted {predicted[(peer, t)]:.0f} s per call)"
        for (peer, t), res in results.items()
        if res is None and (peer, t) in predicted
    ]
    notes = [
        f"- Shapes: Bt = {args.batch}, E = {args.channels}, N = {args.state}; float32; every input requires grad. "
        "Times are one forward plus the backward of (y · g).sum(), medians of n timed calls after one untimed "
        "warm-up, each (method, T) in a fresh process. Ratios are medians of per-round ratios against "
        "selective_scan calls alternating with the peer's in its process; > 1 means selective_scan is faster.",
        f"- Threads: OMP_NUM_THREADS = {os.environ.get('OMP_NUM_THREADS', 'unset')} (torch.get_num_threads() = "
        f"{torch.get_num_threads()}). Another job was running on this 2-core machine at the same time, so "
        "absolute times are noisy; the chunk sweep interleaves its repeats to compare chunk sizes fairly.",
        "- Not run: " + ("; ".join(skipped) if skipped else "none") + ". A loop peer is skipped when the previous "
        f"length's call time × (T / T_prev)² exceeds {args.slow_seconds:g} s.",
        "- transformers' loop indexes a precomputed (Bt, E, T, N) tensor per step, whose backward writes a "
        "full-size zero gradient per step (O(T²) memory traffic); selective_scan_ref uses unbind, which avoids that.",
        f"- selective_scan default chunk size: {DEFAULT_CHUNK_SIZE} (see the sweep).",
    ]
    return "\n".join(notes)


def alternatives_section(alt_table: str, extreme: dict[str, str]) -> str:
    """The cumsum scan's section: its speed and memory, and whether it survives extreme decay."""
    return (
        "## Alternatives: time-parallel cumsum scan inside chunks\n\n"
        "The chunked cumulative-log-decay scan (`cumsum_scan` in this script), i.e. the 'matmul/cumsum "
        "within chunks' form: both within-chunk cumulative sums are (C, C) lower-triangular matmuls (3-4× "
        "faster than torch.cumsum here), a recurrence runs across chunks, and autograd differentiates it (a "
        "custom backward would save memory, not its extra passes and exps). Against selective_scan's "
        "stepped fused multiply-add:\n\n"
        + alt_table
        + "\n\nExtreme decay (Bt = 1, T = 128, E = 8, N = 16, Δ = 4 with A down to −16, so Σ Δ·A over a chunk "
        "reaches −64·C, i.e. −1024 at C = 16; plus a Δ = 0 run): "
        + "; ".join(f"{k}: {v}" for k, v in extreme.items())
        + "."
    )


def main_selective(args) -> int:
    """The selective scan's measurements in order: against the loop peers, the chunk sweep, the cumsum
    alternative, extreme decay, the kernel choices; then the report."""
    results, predicted, table, memory, agree = speed_tables(args)
    sweep = sweep_table(args)
    alternatives = alternatives_section(alternative_table(args, results), extreme_decay_check(args))
    kernels = kernel_choices(args)
    sections = [
        "## Results (forward + backward, medians)\n\n" + table,
        "## Notes\n\n" + selective_notes(args, results, predicted),
        "## Memory\n\nextra peak MiB: peak RSS over the method's first (warm-up) forward + backward minus the RSS "
        "just before it, in a fresh process (counts autograd buffers, gradients and temporaries).\n\n" + memory,
        "## Chunk-size sweep (selective_scan forward + backward ms, medians, round-robin)\n\n" + sweep,
        alternatives,
        "## Agreement (batch 1, forward, float32)\n\n" + agree,
        f"## Kernel choices (Bt = {args.batch}, E = {args.channels}, N = {args.state}; medians of 21 alternating calls)"
        "\n\nThe decay of one chunk buffer (C = "
        f"{DEFAULT_CHUNK_SIZE}, Bt, N, E) and the Mamba mixer's short convolution + SiLU (forward + backward, "
        "T = 256):\n\n" + kernels,
    ]
    report(args, "Selective scan (Mamba S6): chunked vs loop vs transformers", sections)
    return 0


# --------------------------------------------------------------------------------------------- block scan
def block_agreement(args, seq_len: int) -> tuple[float, float]:
    """Max |scan - loop| (float32) and max |loop| at a small batch, forward only."""
    A, v, x0, _ = block_inputs(min(args.batch, 4), seq_len, args.heads, args.block, args.seed)
    with torch.no_grad():
        scan, loop = block_scan(A, v, x0), block_scan_ref(A, v, x0)
    return (scan - loop).abs().max().item(), loop.abs().max().item()


def main_block(args) -> int:
    rows, memory_rows, agree_rows = [], [], []
    for seq_len in args.lengths:
        diff, scale = block_agreement(args, seq_len)
        agree_rows.append([seq_len, f"{diff:.2e}", f"{scale:.2f}"])
        res = {m: run_worker(args, m, seq_len) for m in ("scan", "loop")}
        t_scan, t_loop = median(res["scan"]["total_ms"]), median(res["loop"]["total_ms"])
        f_scan, f_loop = median(res["scan"]["forward_ms"]), median(res["loop"]["forward_ms"])
        row = [
            seq_len,
            f"{t_scan:.1f} (n={len(res['scan']['total_ms'])})",
            f"{t_loop:.1f} (n={len(res['loop']['total_ms'])})",
            f"{t_loop / t_scan:.2f}×",
            f"{f_scan:.1f}",
            f"{f_loop:.1f}",
            f"{f_loop / f_scan:.2f}×",
        ]
        rows.append(row)
        print("  " + " | ".join(str(c) for c in row), flush=True)
        a_mib = args.batch * seq_len * args.heads * args.block**2 * 4 / 2**20
        memory_rows.append(
            [
                seq_len,
                f"{a_mib:.0f}",
                f"{res['scan']['extra_mib']:.0f}",
                f"{res['loop']['extra_mib']:.0f}",
                f"{min(res['scan']['total_ms']):.1f} / {max(res['scan']['total_ms']):.1f}",
                f"{min(res['loop']['total_ms']):.1f} / {max(res['loop']['total_ms']):.1f}",
            ]
        )

    table = markdown_table(
        ["T", "scan fwd+bwd ms", "loop fwd+bwd ms", "loop / scan", "scan fwd ms", "loop fwd ms", "fwd loop / scan"],
        rows,
    )
    memory = markdown_table(
        ["T", "size of A MiB", "scan extra peak MiB", "loop extra peak MiB", "scan min / max ms", "loop min / max ms"],
        memory_rows,
    )
    agree = markdown_table(["T", "max abs diff scan vs loop (fp32)", "max |x|"], agree_rows)
    notes = [
        f"- Shapes: A (B={args.batch}, T, h={args.heads}, b={args.block}, b) float32, column-normalised with p = 1; "
        f"v (B, T, h, b); x_0 (1, h, b); all three require grad.",
        "- fwd+bwd: one forward call and the backward of (states · g).sum(); medians of n timed calls after one "
        f"untimed warm-up (n = {args.slow_repeats} where the warm-up took over {args.slow_seconds:g} s). "
        "loop / scan > 1 means the scan is faster.",
        "- extra peak MiB: peak RSS over the first (warm-up) forward + backward minus the RSS just before it (each "
        "row is a fresh process), so it counts autograd buffers, gradients and temporaries.",
        "- The scan does b× the arithmetic of the loop (b×b matmuls instead of matvecs, paper §3.4 / §4.5); on a "
        "2-core CPU there is little parallelism for its log depth to use, so expect it to lose here and to pay "
        "off on accelerators. The machine is shared with other jobs; min/max are listed.",
    ]
    sections = [
        "## Results (medians)\n\n" + table,
        "## Notes\n\n" + "\n".join(notes),
        "## Memory and spread\n\n" + memory,
        "## Agreement (batch ≤ 4, forward)\n\n" + agree,
    ]
    report(args, "Parallel block scan vs sequential loop (forward + backward)", sections)
    return 0


# --------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    return main_block(args) if args.kind == "block" else main_selective(args)


if __name__ == "__main__":
    sys.exit(main())
