"""Training cost of the DLR kernel: ``dlr_kernel``'s hand-written backward vs autograd through the Vandermonde.

What is measured
----------------
One forward + backward of ``K = dlr_kernel(logΛ_re, logΛ_im, W, L)`` (seed paper §2.3: ``K_k = Re<w, Λ^k>``,
or ``Re·Im`` for DLR-prod; N modes shared by H channels; float32 parameters, CPU), loss ``(K · G).sum()``.
``dlr_kernel`` builds ``Λ^k`` as products of two exactly formed powers (``ops.dlr._powers_complex128``) and
differentiates through ``ops.dlr._VandermondeKernel``: two matmuls per chunk of taps with the recomputed
``[Re P; Im P]``.

The peer is the direct construction ``P_nk = exp(k·logΛ)`` with float64 exponents and phases reduced modulo
2π, ``K = Re(W P)``, in chunks of taps recomputed in the backward by ``torch.utils.checkpoint``,
differentiated by autograd: what ``dlr_kernel`` did before, and what a reader would write from the paper.
Before timing, the script checks that the gradients of both agree (max difference relative to each
gradient's largest entry).

Timing: one untimed warm-up of each, then ``--repeats`` alternating rounds; medians of the per-call wall
times. The shapes are the training calls of the synthetic benchmarks: the DLR paper's Table 1 layer
(N 4096, H 128, L 512, and 1024 for Reverse and Sort, whose inputs are 2L long) and Table 2's Shift layer
(N 4096, H 32, L 16384), plain and prod kernels.

Run: ``python experiments/dlr_kernel.py --threads 1`` (about a minute).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
from torch.utils.checkpoint import checkpoint

from ssmhub.ops import dlr as dlr_ops
from ssmhub.ops.dlr import dlr_init, dlr_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _experiments  # noqa: F401  (benchmarks/'s helpers, results into experiments/results/)
from _report import markdown_table, median, write_report

SCRIPT_NAME = "dlr_kernel"
SHAPES = ((4096, 128, 512, "real"), (4096, 128, 1024, "real"), (4096, 32, 16384, "real"), (4096, 32, 16384, "prod"))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--shapes", nargs="+", default=[",".join(map(str, s)) for s in SHAPES], help="N,H,L,kernel_type ...")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-write", action="store_true", help="print only; do not write the results file")
    return p.parse_args(argv)


def _direct_chunk(log_modulus, phase, w_re, w_im, start: int, size: int, product: bool) -> torch.Tensor:
    k = torch.arange(start, start + size, dtype=torch.float64)
    magnitude = torch.exp(log_modulus.double().unsqueeze(-1) * k)  # (N, C)
    angle = torch.remainder(phase.double().unsqueeze(-1) * k, 2 * math.pi)  # (N, C)
    p_re, p_im = (magnitude * torch.cos(angle)).float(), (magnitude * torch.sin(angle)).float()
    k_re = w_re @ p_re - w_im @ p_im  # (H, C)
    return k_re * (w_re @ p_im + w_im @ p_re) if product else k_re


def autograd_dlr_kernel(log_re, log_im, weight, length: int, kernel_type: str) -> torch.Tensor:
    """The peer: the direct float64 Vandermonde in chunks, recomputed in the backward, through autograd."""
    log_modulus, w_re, w_im = -(log_re**2), weight[..., 0], weight[..., 1]
    step = max(1, dlr_ops._CHUNK_ELEMENTS // log_re.shape[-1])
    parts = [
        checkpoint(
            _direct_chunk,
            log_modulus,
            log_im,
            w_re,
            w_im,
            s,
            min(step, length - s),
            kernel_type == "prod",
            use_reentrant=False,
        )
        for s in range(0, length, step)
    ]
    return torch.cat(parts, dim=-1)  # (H, L)


def train_call(kernel_fn, params, length, kernel_type, upstream):
    start = time.perf_counter()
    grads = torch.autograd.grad((kernel_fn(*params, length, kernel_type) * upstream).sum(), params)
    return time.perf_counter() - start, grads


def measure(shape, repeats: int, seed: int) -> dict:
    modes, channels, length, kernel_type = shape
    gen = torch.Generator().manual_seed(seed)
    init = dlr_init(modes, channels, 1e-5, 1e-1, generator=gen)  # the paper's Table 1 layer uses dt 1e-5
    params = [
        init["log_lambda_re"][0].requires_grad_(),
        init["log_lambda_im"][0].requires_grad_(),
        init["weight"].requires_grad_(),
    ]
    upstream = torch.randn(channels, length, generator=gen)
    _, ours = train_call(dlr_kernel, params, length, kernel_type, upstream)
    _, peer = train_call(autograd_dlr_kernel, params, length, kernel_type, upstream)
    difference = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(ours, peer))
    times = {"ours": [], "peer": []}
    for _ in range(repeats):
        times["ours"].append(train_call(dlr_kernel, params, length, kernel_type, upstream)[0])
        times["peer"].append(train_call(autograd_dlr_kernel, params, length, kernel_type, upstream)[0])
    return {"ours_ms": median(times["ours"]) * 1e3, "peer_ms": median(times["peer"]) * 1e3, "difference": difference}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for text in args.shapes:
        modes, channels, length, kernel_type = text.split(",")
        shape = (int(modes), int(channels), int(length), kernel_type)
        result = measure(shape, args.repeats, args.seed)
        ratio = result["peer_ms"] / result["ours_ms"]
        print(
            f"N,H,L,kernel = {shape}: dlr_kernel {result['ours_ms']:.1f} ms, autograd {result['peer_ms']:.1f} ms, "
            f"x{ratio:.2f}, max rel grad difference {result['difference']:.1e}",
            flush=True,
        )
        rows.append(
            [
                f"{shape[0]} × {shape[1]} × {shape[2]}",
                kernel_type,
                f"{result['ours_ms']:.1f}",
                f"{result['peer_ms']:.1f}",
                f"{ratio:.2f}×",
                f"{result['difference']:.1e}",
            ]
        )
    headers = [
        "N × H × L",
        "kernel",
        "dlr_kernel fwd+bwd ms",
        "autograd Vandermonde ms",
        "speed-up",
        "max rel. grad difference",
    ]
    section = (
        "## Forward + backward of one DLR kernel, float32 parameters\n\n"
        + markdown_table(headers, rows)
        + f"\n\nMedians of {args.repeats} alternating calls each; torch threads: {torch.get_num_threads()}; "
        f"chunks of {dlr_ops._CHUNK_ELEMENTS} Vandermonde entries on both sides."
    )
    if not args.no_write:
        print(write_report(SCRIPT_NAME, "dlr_kernel backward vs autograd through the Vandermonde", [section]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
