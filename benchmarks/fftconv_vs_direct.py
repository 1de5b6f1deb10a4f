"""The FFT long convolution (``ssmhub.ops.fft_conv``) vs a direct depthwise ``conv1d``, forward only, CPU, fp32.

What is measured
----------------
``fft_conv(u, kernel)`` with ``u`` (B, H, L) float32 and ``kernel`` (H, L) float32 computes the causal
depthwise convolution ``y[b, h, k] = sum_{j <= k} kernel[h, k - j] * u[b, h, j]`` in O(L log L) via
rFFTs of size 2^ceil(log2(2L)); the kernel's FFT is recomputed on every call, as in a model's forward.

The peer computes the same thing directly, in O(L^2): ``torch.nn.functional.conv1d`` with ``groups=H``
(depthwise), the input left-padded by L - 1 zeros and the kernel flipped along time (conv1d computes a
cross-correlation). Before timing, the script checks that both agree (max abs difference reported) and,
unless ``--no-fp64``, measures each one's error against a float64 reference (an FFT convolution computed
entirely in float64, whose own error is ~1e-15; a float64 conv1d is too slow on CPU at these lengths).

Timing: one untimed warm-up call of each, then ``--repeats`` rounds; each round times one conv1d call and
``ceil(--fft-repeats / --repeats)`` fft_conv calls (fft_conv is cheap and, on a shared machine, its few-ms
calls are the most exposed to scheduling noise, so it gets more samples). Medians of the per-call wall
times are reported. If the direct warm-up call takes longer than ``--slow-seconds``, only ``--slow-repeats``
rounds are run for that length (the table says how many calls each median is over).

Run: ``python benchmarks/fftconv_vs_direct.py`` (about a minute on 2 CPU cores with the defaults).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

from ssmhub.ops import fft_conv

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import markdown_table, median, write_report

SCRIPT_NAME = "fftconv_vs_direct"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--channels", type=int, default=64, help="H, the number of depthwise channels")
    p.add_argument("--repeats", type=int, default=5, help="timed direct conv1d calls (rounds) per length")
    p.add_argument("--fft-repeats", type=int, default=25, help="timed fft_conv calls per length (at least --repeats)")
    p.add_argument("--slow-seconds", type=float, default=10.0, help="direct call slower than this gets fewer repeats")
    p.add_argument("--slow-repeats", type=int, default=3)
    p.add_argument("--no-fp64", action="store_true", help="skip the float64 accuracy reference")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: leave torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-write", action="store_true", help="print only; do not write the results file")
    return p.parse_args(argv)


def direct_conv(u: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Causal depthwise convolution by ``conv1d``: left-pad by L - 1, flip the kernel (conv1d correlates)."""
    length = u.shape[-1]
    weight = kernel[:, :length].flip(-1).unsqueeze(1)  # (H, 1, L)
    return F.conv1d(F.pad(u, (length - 1, 0)), weight, groups=u.shape[-2])


def fft_conv_fp64(u: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Float64 reference: the causal convolution by a zero-padded FFT of size >= 2L, all in float64."""
    length = u.shape[-1]
    n = 2 * length
    y = torch.fft.irfft(torch.fft.rfft(u.double(), n=n) * torch.fft.rfft(kernel[:, :length].double(), n=n), n=n)
    return y[..., :length]


def timed(fn, *args) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(args.seed)
    rows, accuracy_rows, spread_rows = [], [], []
    with torch.inference_mode():
        for length in args.lengths:
            u = torch.randn(args.batch, args.channels, length, generator=gen)
            # a decaying random kernel, like the long kernels of SSM layers, normalised so outputs are O(1)
            decay = torch.exp(-torch.arange(length) / (length / 4))
            kernel = torch.randn(args.channels, length, generator=gen) * decay
            kernel = kernel / kernel.norm(dim=-1, keepdim=True)

            _, y_fft = timed(fft_conv, u, kernel)  # warm-up and agreement check
            direct_warm_s, y_direct = timed(direct_conv, u, kernel)
            if y_fft.shape != y_direct.shape:
                raise RuntimeError(f"shapes differ: fft_conv {tuple(y_fft.shape)} vs conv1d {tuple(y_direct.shape)}")
            max_diff = (y_fft - y_direct).abs().max().item()
            scale = y_direct.abs().max().item()

            rounds = args.repeats if direct_warm_s <= args.slow_seconds else args.slow_repeats
            fft_per_round = -(-max(args.fft_repeats, args.repeats) // args.repeats)
            fft_ms, direct_ms = [], []
            for _ in range(rounds):
                for _ in range(fft_per_round):
                    seconds, _ = timed(fft_conv, u, kernel)
                    fft_ms.append(1e3 * seconds)
                seconds, _ = timed(direct_conv, u, kernel)
                direct_ms.append(1e3 * seconds)
            t_fft, t_direct = median(fft_ms), median(direct_ms)
            row = [
                length,
                f"{t_fft:.2f} (n={len(fft_ms)})",
                f"{t_direct:.2f} (n={len(direct_ms)})",
                f"{t_direct / t_fft:.1f}×",
                f"{max_diff:.2e}",
            ]
            rows.append(row)
            print("  " + " | ".join(str(c) for c in row) + f"   (max |y| = {scale:.2f})", flush=True)
            spread_rows.append(
                [
                    length,
                    f"{min(fft_ms):.2f} / {max(fft_ms):.2f}",
                    f"{min(direct_ms):.2f} / {max(direct_ms):.2f}",
                    f"{1e3 * direct_warm_s:.2f}",
                ]
            )

            if not args.no_fp64:
                y_ref = fft_conv_fp64(u, kernel)
                accuracy_rows.append(
                    [
                        length,
                        f"{(y_fft.double() - y_ref).abs().max().item():.2e}",
                        f"{(y_direct.double() - y_ref).abs().max().item():.2e}",
                        f"{y_ref.abs().max().item():.2f}",
                    ]
                )

    table = markdown_table(["L", "fft_conv ms", "direct conv1d ms", "speedup", "max abs diff"], rows)
    notes = [
        f"- Shapes: u (B={args.batch}, H={args.channels}, L) float32, kernel (H, L) float32 (decaying random taps, "
        "unit L2 norm per channel, so |y| is O(1)); forward only, `torch.inference_mode()`.",
        "- Times are medians of n timed calls (n in the table) after one warm-up call of each; fft_conv and conv1d "
        f"calls are interleaved in {args.repeats} rounds ({args.slow_repeats} where one conv1d call takes over "
        f"{args.slow_seconds:g} s). The machine is shared with other jobs, so min/max are listed below.",
        "- max abs diff: max |fft_conv(u, k) - conv1d(pad(u, (L-1, 0)), flip(k), groups=H)| in float32.",
        "- speedup = direct conv1d ms ÷ fft_conv ms.",
    ]
    spread = markdown_table(["L", "fft_conv min / max ms", "conv1d min / max ms", "conv1d warm-up ms"], spread_rows)
    sections = [
        "## Results (medians)\n\n" + table,
        "## Notes\n\n" + "\n".join(notes),
        "## Spread of the timed calls\n\n" + spread,
    ]
    print()
    print(table)
    print()
    print("\n".join(notes))
    print()
    print(spread)
    if accuracy_rows:
        accuracy = markdown_table(
            ["L", "fft_conv max abs err vs fp64 FFT", "conv1d max abs err vs fp64 FFT", "max |y|"], accuracy_rows
        )
        sections.append("## Accuracy against a float64 FFT convolution\n\n" + accuracy)
        print()
        print(accuracy)
    if not args.no_write:
        path = write_report(SCRIPT_NAME, "FFT long convolution vs direct depthwise conv1d", sections)
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
