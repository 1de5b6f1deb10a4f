"""Training cost of the FFT long convolution: ``fft_conv``'s hand-written backward vs autograd through ``torch.fft``.

What is measured
----------------
One forward + backward of ``y = fft_conv(u, kernel)`` (causal, ``u`` (B, H, L), ``kernel`` (H, L), both
requiring gradients, float32, CPU), loss ``(y · w).sum()``. ``fft_conv`` runs
``ssmhub.ops.fftconv._CirculantConv`` at the smallest 5-smooth FFT size ``>= 2L − 1``
(``smooth_fft_size``): its backward is two batch-sized real FFTs plus one (H, n) inverse FFT for the
kernel gradient, summed over the batch before the transform.

The peer is the same forward written as three ``torch.fft`` calls, ``irfft(rfft(u, n) · rfft(c, n))[..., :L]``
at the power-of-two size ``n >= 2L``, differentiated by autograd (what ``fft_conv`` did before): autograd's
``rfft`` backward runs a complex FFT of the full length over a zero-filled spectrum. Before timing, the
script checks that the gradients of both agree (max relative difference reported).

Timing: one untimed warm-up of each, then ``--repeats`` alternating rounds; medians of the per-call wall
times. The shapes are the training calls of the benchmarks: the DLR paper's Table 1 layer (batch 64, H 128,
L 512 and Select-Fixed's 576), an H3 language-model layer (batch 8, H 768, L 2048), Table 2's Shift layer
(batch 4, H 32, L 16384).

Run: ``python experiments/fftconv_backward.py --threads 1`` (about a minute).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from ssmhub.ops.fftconv import conv_circulant, fft_conv, fft_size, smooth_fft_size

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _experiments  # noqa: F401  (benchmarks/'s helpers, results into experiments/results/)
from _report import markdown_table, median, write_report

SCRIPT_NAME = "fftconv_backward"
SHAPES = ((64, 128, 512), (64, 128, 576), (8, 768, 2048), (4, 32, 16384))  # (B, H, L)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--shapes", nargs="+", default=[",".join(map(str, s)) for s in SHAPES], help="B,H,L ...")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-write", action="store_true", help="print only; do not write the results file")
    return p.parse_args(argv)


def autograd_fft_conv(u: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """The peer: the same causal convolution as three torch.fft calls, differentiated by autograd."""
    seq_len = u.shape[-1]
    n = fft_size(2 * seq_len)
    circulant = conv_circulant(kernel[:, :seq_len], None, n)  # (H, n)
    return torch.fft.irfft(torch.fft.rfft(u, n=n) * torch.fft.rfft(circulant, n=n), n=n)[..., :seq_len]


def train_call(conv, u, kernel, weight) -> tuple[float, tuple[torch.Tensor, torch.Tensor]]:
    start = time.perf_counter()
    grads = torch.autograd.grad((conv(u, kernel) * weight).sum(), (u, kernel))
    return time.perf_counter() - start, grads


def measure(shape: tuple[int, int, int], repeats: int, seed: int) -> dict:
    batch, heads, seq_len = shape
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(batch, heads, seq_len, generator=gen).requires_grad_()
    kernel = (torch.randn(heads, seq_len, generator=gen) / seq_len**0.5).requires_grad_()
    weight = torch.randn(batch, heads, seq_len, generator=gen)
    _, ours = train_call(fft_conv, u, kernel, weight)
    _, peer = train_call(autograd_fft_conv, u, kernel, weight)
    difference = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(ours, peer))
    times = {"ours": [], "peer": []}
    for _ in range(repeats):
        times["ours"].append(train_call(fft_conv, u, kernel, weight)[0])
        times["peer"].append(train_call(autograd_fft_conv, u, kernel, weight)[0])
    ours_ms, peer_ms = median(times["ours"]) * 1e3, median(times["peer"]) * 1e3
    return {"shape": shape, "ours_ms": ours_ms, "peer_ms": peer_ms, "difference": difference}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for text in args.shapes:
        shape = tuple(int(v) for v in text.split(","))
        result = measure(shape, args.repeats, args.seed)
        print(
            f"B,H,L = {shape}: fft_conv {result['ours_ms']:.1f} ms, autograd torch.fft {result['peer_ms']:.1f} ms, "
            f"x{result['peer_ms'] / result['ours_ms']:.2f}, max rel grad difference {result['difference']:.1e}",
            flush=True,
        )
        batch, heads, seq_len = shape
        rows.append(
            [
                f"{batch} × {heads} × {seq_len}",
                f"{smooth_fft_size(2 * seq_len - 1)} / {fft_size(2 * seq_len)}",
                f"{result['ours_ms']:.1f}",
                f"{result['peer_ms']:.1f}",
                f"{result['peer_ms'] / result['ours_ms']:.2f}×",
                f"{result['difference']:.1e}",
            ]
        )
    headers = [
        "B × H × L",
        "FFT size (ours / peer)",
        "fft_conv fwd+bwd ms",
        "autograd torch.fft ms",
        "speed-up",
        "max rel. grad difference",
    ]
    section = (
        "## Forward + backward of one causal long convolution, float32\n\n"
        + markdown_table(headers, rows)
        + f"\n\nMedians of {args.repeats} alternating calls each; torch threads: {torch.get_num_threads()}."
    )
    if not args.no_write:
        print(write_report(SCRIPT_NAME, "fft_conv backward vs autograd through torch.fft", [section]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
