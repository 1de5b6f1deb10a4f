"""The FFT long convolution ``ssmhub.ops.fft_conv`` against its peers, forward, CPU, fp32: other FFT backends
(``--kind backends``) and a direct depthwise ``conv1d`` (``--kind direct``). Both draw the same inputs
(:func:`make_inputs`: ``u`` standard normal, each channel's kernel decaying random taps of unit norm).

Backends (``--kind backends``, the default; writes ``results/fftconv.md``)
-------------------------------------------------------------------------
1. The long-conv paper's Table 3 layout (runtime, GFLOPs and achieved GFLOP/s per block size r), on this
   CPU, for each sequence length: ``fft_conv(u, kernel)`` (``torch.fft``, MKL on a CPU) and
   ``butterfly_conv(u, kernel, block_size=r)`` (:mod:`ssmhub.ops.butterfly`: the DFT as batched r×r complex
   matmuls plus twiddles, the real-input trick of App. C.2, the three-pass algorithm for FFT sizes above
   8192), ``u`` (B, H, L) and ``kernel`` (H, L) float32, causal, FFT size 2L; the kernel's transform is
   recomputed on every call, as in a model's forward. "GFLOP" counts the real floating-point operations of
   the Butterfly matmuls only (8·f per complex output of a size-f block, for the input's forward and inverse
   transforms and the kernel's forward transform); twiddles, the untangle and the pointwise product are
   not counted, as in the paper's table. "vs torch" is the Butterfly time ÷ the torch.fft time (> 1: slower).
   Each Butterfly result is checked against torch.fft's (max abs difference reported).
2. The learned Butterfly (§3.2.1, :class:`ssmhub.layers.longconv.LearnedButterflyConv`, learned input and
   output transforms, per-head blocks) at r = 16, 32, 256: its extra parameters and its runtime ratio to the
   fixed Butterfly at the same r and FFT size, forward (inference) and forward + backward (training, the
   kernel and, for the learned one, the blocks requiring grad). The paper's Table 12 reports training speed
   1×, 0.9× and 0.6× (speed, i.e. the inverse of our time ratio) on a GPU.
3. GPU rows (torch.fft/cuFFT, Butterfly r = 16, the fused Triton kernel): measured only when a CUDA device
   is present; otherwise marked "not measured (no GPU lent this session)".

Timing: one untimed warm-up call, then ``--repeats`` timed calls (``--slow-repeats`` where the warm-up took
longer than ``--slow-seconds``); medians are reported with the number of calls. The machine is shared with
other jobs, so the min / max of the timed calls are listed too.

Run: ``python benchmarks/fftconv.py`` (defaults: L = 1K, 4K, 16K, 64K, B = 4, H = 256, r = 2 … 256;
tens of minutes on 2 CPU cores, most of it at L = 64K; ``--lengths 1024 4096`` for a quick look).

Direct (``--kind direct``, writes ``results/fftconv_vs_direct.md``)
-------------------------------------------------------------------
``fft_conv(u, kernel)`` with ``u`` (B, H, L) float32 and ``kernel`` (H, L) float32 (``--heads`` H) computes the causal
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

Run: ``python benchmarks/fftconv.py --kind direct`` (about a minute on 2 CPU cores with the defaults).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

from ssmhub.layers.longconv import LearnedButterflyConv
from ssmhub.ops.butterfly import BLOCK_SIZES, DEFAULT_CHUNK_SIZE, butterfly_conv, butterfly_plan
from ssmhub.ops.fftconv import fft_conv, fft_size

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import markdown_table, median, parse_args_with_defaults, report

NOT_MEASURED = "not measured (no GPU lent this session)"


# per kind: the defaults of the flags whose default depends on it
KIND_DEFAULTS = {
    "backends": {"lengths": [1024, 4096, 16384, 65536], "batch": 4, "heads": 256, "repeats": 3, "slow_repeats": 1},
    "direct": {"lengths": [1024, 4096, 16384], "batch": 2, "heads": 64, "repeats": 5, "slow_repeats": 3},
}
NAMES = {"backends": "fftconv", "direct": "fftconv_vs_direct"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--kind", choices=sorted(KIND_DEFAULTS), default="backends", help="the peers of fft_conv")
    p.add_argument("--lengths", type=int, nargs="+", default=None, help="L (backends 1K-64K, direct 1K-16K)")
    p.add_argument("--batch", type=int, default=None, help="backends 4, direct 2")
    p.add_argument("--heads", "--channels", type=int, default=None, help="H, depthwise channels (256, direct 64)")
    p.add_argument("--repeats", type=int, default=None, help="timed calls per configuration (3; direct: 5 rounds)")
    p.add_argument("--slow-seconds", type=float, default=10.0, help="warm-up slower than this gets fewer repeats")
    p.add_argument("--slow-repeats", type=int, default=None, help="backends 1, direct 3")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: leave torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default=None, help="results/<name>.md (fftconv, fftconv_vs_direct)")
    p.add_argument("--no-write", action="store_true", help="print only; do not write the results file")
    p.add_argument("--block-sizes", type=int, nargs="+", default=list(BLOCK_SIZES), help="backends")
    p.add_argument("--learned-block-sizes", type=int, nargs="+", default=[16, 32, 256], help="backends")
    p.add_argument("--learned-length", type=int, default=4096, help="backends: L of the learned-Butterfly table")
    p.add_argument("--no-learned", action="store_true", help="backends: skip the learned-Butterfly table")
    p.add_argument("--fft-repeats", type=int, default=25, help="direct: timed fft_conv calls per length")
    p.add_argument("--no-fp64", action="store_true", help="direct: skip the float64 accuracy reference")
    args = parse_args_with_defaults(p, argv, "kind", KIND_DEFAULTS)
    args.name = args.name or NAMES[args.kind]
    return args


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn, args, device) -> tuple[list[float], object]:
    """Warm-up, then timed calls; returns per-call milliseconds and the warm-up's output."""
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    warm = time.perf_counter() - start
    count = args.repeats if warm <= args.slow_seconds else args.slow_repeats
    times = []
    for _ in range(count):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(1e3 * (time.perf_counter() - start))
    return times, out


def butterfly_gflop(rows: int, heads: int, n: int, block_size: int) -> float:
    """Real FLOPs of the block matmuls of one ``butterfly_conv`` call: the input's forward and inverse
    transforms (``rows`` signals) and the kernel's forward transform (``heads`` signals), size n/2 each."""
    plan = butterfly_plan(n // 2, block_size, DEFAULT_CHUNK_SIZE // 2)
    per_signal = sum(8 * f * plan.size for f in plan.factors)  # 8 real flops per complex MAC, f per output
    return (2 * rows + heads) * per_signal / 1e9


def make_inputs(batch, heads, length, gen, device):
    u = torch.randn(batch, heads, length, generator=gen)
    decay = torch.exp(-torch.arange(length) / (length / 4))  # a decaying kernel, unit norm: |y| is O(1)
    kernel = torch.randn(heads, length, generator=gen) * decay
    return u.to(device), (kernel / kernel.norm(dim=-1, keepdim=True)).to(device)


def backend_table(args, gen) -> tuple[list[list[object]], list[list[object]]]:
    rows, spread = [], []
    device = torch.device("cpu")
    with torch.inference_mode():
        for length in args.lengths:
            u, kernel = make_inputs(args.batch, args.heads, length, gen, device)
            n = fft_size(2 * length)
            torch_ms, y_torch = time_calls(lambda u=u, kernel=kernel: fft_conv(u, kernel), args, device)
            t_torch = median(torch_ms)
            passes = "single pass" if n <= DEFAULT_CHUNK_SIZE else f"three-pass, m = {n // DEFAULT_CHUNK_SIZE}"
            rows.append([length, "torch.fft", f"{t_torch:.1f} (n={len(torch_ms)})", "–", "–", "1.0×", "–"])
            spread.append([length, "torch.fft", f"{min(torch_ms):.1f} / {max(torch_ms):.1f}"])
            print("  " + " | ".join(str(c) for c in rows[-1]), flush=True)
            for r in args.block_sizes:
                fn = lambda u=u, kernel=kernel, r=r: butterfly_conv(u, kernel, block_size=r)  # noqa: E731
                ms, y = time_calls(fn, args, device)
                t = median(ms)
                gflop = butterfly_gflop(args.batch * args.heads, args.heads, n, r)
                diff = (y - y_torch).abs().max().item()
                rows.append(
                    [
                        length,
                        f"Butterfly r = {r} ({passes})",
                        f"{t:.1f} (n={len(ms)})",
                        f"{gflop:.1f}",
                        f"{gflop / (t / 1e3):.1f}",
                        f"{t / t_torch:.1f}×",
                        f"{diff:.1e}",
                    ]
                )
                spread.append([length, f"Butterfly r = {r}", f"{min(ms):.1f} / {max(ms):.1f}"])
                print("  " + " | ".join(str(c) for c in rows[-1]), flush=True)
            del u, kernel, y_torch
    return rows, spread


def learned_table(args, gen) -> list[list[object]]:
    rows = []
    device = torch.device("cpu")
    length = args.learned_length
    u, kernel = make_inputs(args.batch, args.heads, length, gen, device)
    for r in args.learned_block_sizes:
        learned = LearnedButterflyConv(args.heads, length, r)
        n = learned.fft_size

        def fixed_forward(r=r, n=n):
            return butterfly_conv(u, kernel, block_size=r, chunk_size=None, n=n)

        def fixed_train(r=r, n=n):
            k = kernel.detach().requires_grad_()
            butterfly_conv(u, k, block_size=r, chunk_size=None, n=n).square().mean().backward()

        def learned_train(learned=learned):
            k = kernel.detach().requires_grad_()
            learned.zero_grad(set_to_none=True)
            learned(u, k).square().mean().backward()

        with torch.inference_mode():
            fixed_ms, y_fixed = time_calls(fixed_forward, args, device)
            learned_ms, y_learned = time_calls(lambda learned=learned: learned(u, kernel), args, device)
        fixed_train_ms, _ = time_calls(fixed_train, args, device)
        learned_train_ms, _ = time_calls(learned_train, args, device)
        extra = learned.num_extra_parameters
        ratio_fwd = median(learned_ms) / median(fixed_ms)
        ratio_train = median(learned_train_ms) / median(fixed_train_ms)
        rows.append(
            [
                r,
                f"{extra:,} ({4 * extra / 2**20:.1f} MiB)",
                f"{median(fixed_ms):.1f} / {median(learned_ms):.1f} (n={len(fixed_ms)}, {len(learned_ms)})",
                f"{ratio_fwd:.2f}×",
                f"{median(fixed_train_ms):.1f} / {median(learned_train_ms):.1f}",
                f"{ratio_train:.2f}×",
                f"{(y_learned - y_fixed).abs().max().item():.1e}",
            ]
        )
        print("  " + " | ".join(str(c) for c in rows[-1]), flush=True)
        del learned
    return rows


def gpu_rows(args, gen) -> list[list[object]]:
    if not torch.cuda.is_available():
        return [[length, name, NOT_MEASURED] for length in args.lengths for name in GPU_BACKENDS]
    device = torch.device("cuda")
    from ssmhub.ops.triton import can_run, triton_conv

    rows = []
    with torch.inference_mode():
        for length in args.lengths:
            u, kernel = make_inputs(args.batch, args.heads, length, gen, device)
            calls = {
                "torch.fft (cuFFT)": lambda u=u, kernel=kernel: fft_conv(u, kernel),
                "Butterfly r = 16": lambda u=u, kernel=kernel: butterfly_conv(u, kernel, block_size=16),
                "fused Triton kernel": lambda u=u, kernel=kernel: triton_conv(u, kernel),
            }
            for name in GPU_BACKENDS:
                if name == "fused Triton kernel" and not can_run(device, max(256, fft_size(2 * length)))[0]:
                    rows.append([length, name, "over the fused kernel's size limit (falls back to Butterfly)"])
                    continue
                ms, _ = time_calls(calls[name], args, device)
                rows.append([length, name, f"{median(ms):.2f} (n={len(ms)})"])
    return rows


GPU_BACKENDS = ("torch.fft (cuFFT)", "Butterfly r = 16", "fused Triton kernel")


def main_backends(args, gen) -> int:
    started = time.perf_counter()
    print("CPU: torch.fft vs Butterfly matmuls")
    rows, spread_rows = backend_table(args, gen)
    table = markdown_table(["L", "backend", "ms (median)", "GFLOP", "GFLOP/s", "vs torch", "max abs diff"], rows)
    sections = ["## CPU: torch.fft vs Butterfly block sizes (paper Table 3 layout)\n\n" + table]
    if not args.no_learned:
        print("learned Butterfly")
        learned = learned_table(args, gen)
        sections.append(
            f"## Learned Butterfly (§3.2.1), L = {args.learned_length}, CPU\n\n"
            + markdown_table(
                [
                    "r",
                    "extra parameters (fp32)",
                    "forward ms fixed / learned",
                    "forward learned ÷ fixed",
                    "fwd+bwd ms fixed / learned",
                    "fwd+bwd learned ÷ fixed",
                    "max abs diff at init",
                ],
                learned,
            )
        )
    gpu = gpu_rows(args, gen)
    sections.append("## GPU\n\n" + markdown_table(["L", "backend", "ms (median)"], gpu))
    wall = time.perf_counter() - started
    notes = [
        f"- Shapes: u (B={args.batch}, H={args.heads}, L) float32, kernel (H, L) float32 (decaying random taps, "
        "unit L2 norm per channel), causal, FFT size 2L; forward only in the first table, `torch.inference_mode()`.",
        f"- Medians of n timed calls after one warm-up call ({args.slow_repeats} call where the warm-up took over "
        f"{args.slow_seconds:g} s); the machine is shared with other jobs (min / max below).",
        "- GFLOP: real FLOPs of the Butterfly block matmuls only (8·f per complex output of an f-block; input forward "
        "+ inverse, kernel forward); GFLOP/s = GFLOP ÷ the whole call's time. vs torch = Butterfly ms ÷ torch.fft ms.",
        f"- FFT sizes above {DEFAULT_CHUNK_SIZE} run as the three-pass algorithm (Algorithm 2) with chunks of "
        f"{DEFAULT_CHUNK_SIZE} real samples; max abs diff is against torch.fft's output (|y| is O(1)).",
        "- Learned Butterfly: learned input and output transforms (per-head blocks, one per distinct stage size), "
        "FFT size fixed to fft_size(2·L), single pass; the fixed Butterfly is timed at the same FFT size and r. "
        "fwd+bwd: loss = mean(y²), kernel (and the learned blocks) requiring grad.",
        f"- Wall time of this run: {wall:.0f} s.",
    ]
    sections.append("## Notes\n\n" + "\n".join(notes))
    sections.append(
        "## Spread of the timed calls (CPU)\n\n" + markdown_table(["L", "backend", "min / max ms"], spread_rows)
    )
    report(args, "FFT convolution backends: torch.fft vs FlashButterfly", sections)
    print(f"wall time {wall:.0f} s")
    return 0


# --------------------------------------------------------------------------------------------- direct
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


def main_direct(args, gen) -> int:
    rows, accuracy_rows, spread_rows = [], [], []
    with torch.inference_mode():
        for length in args.lengths:
            u, kernel = make_inputs(args.batch, args.heads, length, gen, torch.device("cpu"))

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
        f"- Shapes: u (B={args.batch}, H={args.heads}, L) float32, kernel (H, L) float32 (decaying random taps, "
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
    if accuracy_rows:
        accuracy = markdown_table(
            ["L", "fft_conv max abs err vs fp64 FFT", "conv1d max abs err vs fp64 FFT", "max |y|"], accuracy_rows
        )
        sections.append("## Accuracy against a float64 FFT convolution\n\n" + accuracy)
    report(args, "FFT long convolution vs direct depthwise conv1d", sections)
    return 0


# --------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    args = parse_args(argv)
    gen = torch.Generator().manual_seed(args.seed)
    return main_direct(args, gen) if args.kind == "direct" else main_backends(args, gen)


if __name__ == "__main__":
    sys.exit(main())
