"""The parallel block scan (``ssmhub.ops.block_scan``) vs the sequential loop, forward + backward, CPU, fp32.

What is measured
----------------
Both compute all states of the block-diagonal recurrence ``x_k = A_k x_{k-1} + v_k`` (paper 002, Eq. 5)
with ``A`` (B, T, h, b, b), ``v`` (B, T, h, b) and a shared initial state (1, h, b), all float32 leaves
that require grad. One call = forward, then ``backward`` of ``(states * g).sum()`` for a fixed random
``g``, so the time covers the gradients w.r.t. A, v and x_0 (what a training step pays).

- scan: :func:`ssmhub.ops.block_scan`, the work-efficient log-depth scan (T − 1 b×b matmuls, ~2T matvecs).
- loop: :func:`ssmhub.ops.block_scan_ref` in float32, one ``einsum('bhij,bhj->bhi')`` per token
  (T matvecs: b times less arithmetic than the scan, but T dependent steps).

The blocks are column-normalised with p = 1 (Eq. 6, ``v / max(1, ‖v‖₁)`` per column), so nothing grows.

Each (length, method) runs in its own subprocess, so the peak resident memory (``ru_maxrss``) of each
row is its own; the table reports it minus the RSS after the inputs were allocated ("extra peak").
Within a worker: one untimed warm-up call, then ``--repeats`` timed calls; if the warm-up takes longer
than ``--slow-seconds``, only ``--slow-repeats`` timed calls are run (the table gives n). Medians are
reported. Before timing, the parent checks that scan and loop agree at a small batch.

Run: ``python benchmarks/block_scan_vs_loop.py`` (a few minutes on 2 CPU cores with the defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

from ssmhub.ops import block_scan, block_scan_ref

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import markdown_table, median, write_report

SCRIPT_NAME = "block_scan"
METHODS = {"scan": block_scan, "loop": block_scan_ref}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[40, 512, 4096])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--heads", type=int, default=8, help="h, the number of blocks")
    p.add_argument("--block", type=int, default=8, help="b, the block size")
    p.add_argument("--repeats", type=int, default=5, help="timed forward+backward calls per row")
    p.add_argument("--slow-seconds", type=float, default=60.0, help="warm-up slower than this gets fewer repeats")
    p.add_argument("--slow-repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: leave torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-write", action="store_true", help="print only; do not write the results file")
    p.add_argument("--worker", nargs=2, metavar=("METHOD", "T"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def make_inputs(batch, seq_len, heads, block, seed):
    gen = torch.Generator().manual_seed(seed)
    raw = 2 * torch.randn(batch, seq_len, heads, block, block, generator=gen)
    A = raw / torch.linalg.vector_norm(raw, ord=1, dim=-2, keepdim=True).clamp(min=1.0)  # Eq. 6, p = 1
    v = torch.randn(batch, seq_len, heads, block, generator=gen)
    x0 = torch.randn(1, heads, block, generator=gen)
    g = torch.randn(batch, seq_len, heads, block, generator=gen)
    return A, v, x0, g


def max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def forward_backward(fn, A, v, x0, g) -> tuple[float, float]:
    for t in (A, v, x0):
        t.grad = None
    start = time.perf_counter()
    states = fn(A, v, x0)
    forward_s = time.perf_counter() - start
    (states * g).sum().backward()
    return forward_s, time.perf_counter() - start


def worker(args) -> int:
    """Time one method at one length; print a JSON line with the times and peak RSS."""
    method, seq_len = args.worker[0], int(args.worker[1])
    A, v, x0, g = make_inputs(args.batch, seq_len, args.heads, args.block, args.seed)
    for t in (A, v, x0):
        t.requires_grad_()
    base_rss = max_rss_mib()
    fn = METHODS[method]
    _, warm_s = forward_backward(fn, A, v, x0, g)
    n = args.repeats if warm_s <= args.slow_seconds else args.slow_repeats
    forward_ms, total_ms = [], []
    for _ in range(n):
        f, t = forward_backward(fn, A, v, x0, g)
        forward_ms.append(1e3 * f)
        total_ms.append(1e3 * t)
    result = {"forward_ms": forward_ms, "total_ms": total_ms, "warm_s": warm_s, "base_rss": base_rss}
    result["peak_rss"] = max_rss_mib()
    print(json.dumps(result), flush=True)
    return 0


def run_worker(args, method: str, seq_len: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", method, str(seq_len)]
    cmd += ["--batch", str(args.batch), "--heads", str(args.heads), "--block", str(args.block)]
    cmd += ["--repeats", str(args.repeats), "--slow-seconds", str(args.slow_seconds)]
    cmd += ["--slow-repeats", str(args.slow_repeats), "--seed", str(args.seed)]
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def agreement(args, seq_len: int) -> tuple[float, float]:
    """Max |scan - loop| (float32) and max |loop| at a small batch, forward only."""
    A, v, x0, _ = make_inputs(min(args.batch, 4), seq_len, args.heads, args.block, args.seed)
    with torch.no_grad():
        scan, loop = block_scan(A, v, x0), block_scan_ref(A, v, x0)
    return (scan - loop).abs().max().item(), loop.abs().max().item()


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.worker:
        return worker(args)

    rows, memory_rows, agree_rows = [], [], []
    for seq_len in args.lengths:
        diff, scale = agreement(args, seq_len)
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
                f"{res['scan']['peak_rss'] - res['scan']['base_rss']:.0f}",
                f"{res['loop']['peak_rss'] - res['loop']['base_rss']:.0f}",
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
        "- extra peak MiB: peak RSS of the worker process minus its RSS once the inputs exist (each row is a "
        "fresh process), so it counts autograd buffers, gradients and temporaries.",
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
    print()
    print(table)
    print()
    print(memory)
    print()
    print(agree)
    if not args.no_write:
        path = write_report(SCRIPT_NAME, "Parallel block scan vs sequential loop (forward + backward)", sections)
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
