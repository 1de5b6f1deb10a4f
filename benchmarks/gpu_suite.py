"""One command for a GPU machine: correctness and speed of ssmhub's fast paths on the device, in one report.

A GPU session (15 minutes of device time, the machine's start of 2-3 minutes included, at most 10 minutes a call)
runs two calls, in this order (issue 52):

1. the training table at users' shapes, with its targets, arithmetic and profiles (step e alone; it stops itself
   at ``--deadline_s``, and every row reaches ``benchmarks/results/gpu_training.md`` as it is measured, so a run
   cut short keeps them)::

       python benchmarks/gpu_suite.py --steps e --deadline_s 450 --results_dir "$OUT"

2. the test suite on the device (step f, in a process of its own; pytest-xdist's 16 workers where installed, else
   one process), written to ``gpu_tests.md`` (a call of every step writes ``gpu.md``)::

       python benchmarks/gpu_suite.py --steps f --deadline_s 270 --results_dir "$OUT"

The other steps (a-d, g: kernels, scans, decode, FSDP) measured what they had to on 2026-11-28; they run in a
third call when a session has the time (``--steps dgcab``). Without ``--steps`` every step runs, e first.

On any CPU at tiny sizes, in a minute or two, so that the suite never rots (tests/test_gpu_suite_smoke.py runs
this)::

    python benchmarks/gpu_suite.py --smoke --results_dir /tmp/gpu-smoke

Steps (issues 43 and 52), each reported even when an earlier one failed (exit status 1 if any failed), each
stopped at its time cap; sizes are in :func:`plan` and in the report:

a. every Triton kernel's error against float64 (FlashButterfly ``fft_conv``, and the Triton selective and block
   scans once they exist: "not available" rows before), outputs and gradients (``_gpu_kernels.py``);
b. forward + backward speed: selective scan at B 8, d_inner 1536, N 16, T 512 and 4096, Triton vs pure torch vs
   transformers' ``mamba_selective_scan``; block scan Triton vs torch's parallel scan vs the loop (``_gpu_scans.py``);
c. ``fft_conv`` backends (torch.fft, Butterfly, Triton) over L (``_gpu_kernels.py``);
d. decode ms/token per family at width 256 × 4 layers, eager against a CUDA graph of one step over the static cache,
   and whether their greedy tokens are equal (``_gpu_decode.py``);
e. training at users' shapes (``_gpu_train.py``): GPT-2 small (SDPA) and every family at ~125M parameters
   (``_gpu_models.py``), bf16 autocast, AdamW, L 2048 × batch 8 and L 8192 × batch 2, each eager and compiled
   per block (``fullgraph=True``), the compiled GPT-2 the ratio's denominator; step ms, tokens/s, peak memory and
   launches per step per row; the targets of issue 52 §4 (``_gpu_targets.py``), FLOPs and bytes per token against
   the card's peaks (``_gpu_arithmetic.py``), a profile of one step per model (``_gpu_profile.py``) and GPT-2 and
   DLR compiled whole. Rows run by importance: the compiled rows at 2048 (GPT-2 first), at 8192, the eager rows,
   the profiles, the whole-model compilations. Each row has a cap (compiled 75 s, eager 30 s, profile 20 s; the
   step itself has none but the deadline). Expected on an H100: an eager step of ~125M parameters at 16K tokens
   0.1-0.5 s (SeRpEnt more), so an eager row ≈ 5-10 s with its build; a compiled row 20-60 s, mostly compilation
   (identical blocks share one graph); 30 rows and 7 profiles ≈ 350-450 s: the last rows may not run, and say so;
f. the test suite on the device (``SSMHUB_TEST_DEVICE``), last, in the time left (``_gpu_tests.py``);
g. an FSDP2 training step per family in one process (nccl, world size 1) with the bf16 policy of
   ``ssmhub.training.shard_model``: losses finite, the recurrence float32 (``_gpu_fsdp.py``).

The report lists the steps a to g; in one call they run in the order e, d, g, c, a, b, f: the Triton scans, new on
a GPU, after the other measurements, so that a sticky CUDA error (an illegal address) in them cannot cost those; the
tests run in their own process. Kernel configurations are fixed (no autotuning here); every time is a median of
``--repeats`` (step e: ``train_steps``) after a warm-up. A smoke run compiles with the ``eager`` backend (Dynamo's
capture with ``fullgraph=True``: a graph break fails the row; no backward trace, no code generation, so seconds a
model); ``--compile_backend aot_eager`` adds the backward's trace (a minute a model on a small shared CPU),
``inductor`` compiles as on a GPU.
"""

from __future__ import annotations

import time

START = time.monotonic()  # the deadline counts from here, before the slow imports

import argparse  # noqa: E402
import gc  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402

if "--smoke" in sys.argv and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"  # set before any triton import: the CPU runs the kernels interpreted

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _gpu_common import REPORT_NAME, Context, Report, Section, StepTimeout, free_memory, run_with_alarm  # noqa: E402
from _gpu_decode import step_decode  # noqa: E402
from _gpu_fsdp import step_fsdp  # noqa: E402
from _gpu_kernels import step_fft_backends, step_kernel_errors  # noqa: E402
from _gpu_scans import step_scan_speed  # noqa: E402
from _gpu_tests import step_tests  # noqa: E402
from _gpu_train import step_training  # noqa: E402
from _report import RESULTS_DIR  # noqa: E402

from ssmhub.preflight import first_line  # noqa: E402

# (title, step, time cap in seconds on a GPU; None: the time left)
STEPS = [
    ("a. Triton kernels against float64", step_kernel_errors, 150),  # compiles about 14 kernels
    ("b. Scan speed, forward + backward", step_scan_speed, 120),
    ("c. fft_conv backends", step_fft_backends, 40),
    ("d. Decode per family: eager vs CUDA graph", step_decode, 60),
    ("e. Training at users' shapes vs compiled GPT-2, bf16", step_training, None),  # caps per row, its own
    ("f. Test suite on the device", step_tests, None),
    ("g. FSDP2 training step, bf16 policy", step_fsdp, 45),
]
RUN_ORDER = "edgcabf"  # by the titles' letters (see the module docstring)
OWN_FILES = {"e": "gpu_training", "f": "gpu_tests"}  # a call of one of these steps alone writes its own file


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, seconds (what CI runs)")
    p.add_argument("--device", default=None, help="default: cuda when available (cpu with --smoke)")
    p.add_argument("--results_dir", default=None, help="default: benchmarks/results (a temporary folder with --smoke)")
    p.add_argument("--deadline_s", type=float, default=450, help="the whole run stops itself by then (seconds)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per measurement (their median)")
    p.add_argument("--test_timeout", type=int, default=120, help="seconds per test (pytest-timeout, when installed)")
    p.add_argument("--test_workers", type=int, default=None, help="pytest-xdist workers (default: 16 on a GPU)")
    p.add_argument("--steps", default=RUN_ORDER, help=f"the steps to run, by letter (default: all, {RUN_ORDER})")
    p.add_argument("--compile_backend", default=None, help="step e's compile backend (inductor; --smoke: eager)")
    args = p.parse_args(argv)
    unknown = set(args.steps) - set(RUN_ORDER)
    if unknown or not args.steps:
        p.error(f"--steps takes letters of {RUN_ORDER}; got {args.steps!r}")
    return args


def plan(smoke: bool) -> dict:
    """What each step runs at: tiny in a smoke run, the issue's sizes on a GPU."""
    if smoke:
        return {
            "triton_lengths": [16, 100],
            "triton_fft_max": 256,
            "error_selective": (1, 24, 8, 16),  # B, T, E, N
            "error_block": (1, 12, 2, 8),  # B, T, h, b
            "selective_speed": (1, 8, 16),  # B, E, N
            "scan_lengths": [16, 32],
            "slow_call_s": 20,
            "block_speed": (1, 2, 8),  # B, h, b
            "block_lengths": [16],
            "fft_lengths": [256],
            "fft_shape": (2, 8),
            "model_width": (16, 2),
            "decode_tokens": 4,
            "train_batch": 2,  # FSDP's (g)
            "train_lengths": [(32, 2), (64, 1)],  # (L, batch): the GPU's two shapes, tiny
            "train_user_shape": False,  # the zoo of _gpu_models.py at width 24
            "train_steps": 1,
            "train_caps": {"compiled": 60, "eager": 30, "profile": 30},
            "train_reserve_s": 5,
            "profile_ops": 10,
            "fsdp_length": 32,
            "tests": ["tests/test_fileio.py"],  # the step's machinery, not the suite: pytest's start-up dominates
            "cap": 60,
        }
    return {
        "triton_lengths": [1024],  # the fused kernel's FFT (2L) stops at 4096; at 4096 it compiled > 40 s (H100)
        "triton_fft_max": 1024,
        "error_selective": (2, 1024, 256, 16),
        "error_block": (2, 1024, 8, 8),
        "selective_speed": (8, 1536, 16),
        "scan_lengths": [512, 4096],
        "slow_call_s": 20,  # a call predicted slower is not run
        "block_speed": (8, 32, 8),
        "block_lengths": [512, 4096],
        "fft_lengths": [1024, 2048, 16384],
        "fft_shape": (8, 768),
        "model_width": (256, 4),
        "decode_tokens": 64,
        "train_batch": 4,  # FSDP's (g)
        "train_lengths": [(2048, 8), (8192, 2)],  # (L, batch): the same tokens per step
        "train_user_shape": True,  # ~125M parameters (_gpu_models.py)
        "train_steps": 5,
        "train_caps": {"compiled": 75, "eager": 30, "profile": 20},  # seconds per row (see the module docstring)
        "train_reserve_s": 10,
        "profile_ops": 10,
        "fsdp_length": 512,
        "tests": ["tests/ops", "tests/layers", "tests/conformance"],
        "cap": None,  # each step's own (STEPS)
    }


def preamble(ctx: Context) -> list[str]:
    if ctx.device.type == "cuda":
        memory = torch.cuda.get_device_properties(ctx.device).total_memory / 2**30
        name = f"{torch.cuda.get_device_name(ctx.device)} ({memory:.0f} GiB, CUDA {torch.version.cuda})"
    else:
        name = "CPU (no CUDA device)"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    smoke = " (smoke run: tiny sizes)" if ctx.args.smoke else ""
    return [
        f"Device: {name}{smoke}; triton {triton_version}; TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')}",
        f"Deadline: {ctx.args.deadline_s:.0f} s from the start; medians of {ctx.args.repeats} timed calls.",
    ]


def run_step(ctx: Context, section: Section, step, cap: float | None) -> bool:
    """Run one step under its time cap; a failure becomes a FAILED line with the one-line reason."""
    title, section.footer = section.title, ""
    print(f"-- {title} ({ctx.left():.0f} s left)", flush=True)
    start, ok = time.perf_counter(), False
    cap = cap and (ctx.plan["cap"] or cap)  # a smoke run's caps are its own; None stays None (no alarm)
    try:
        if cap is None:
            step(ctx, section)
        elif ctx.left() < 10:
            raise RuntimeError(f"not run: {ctx.left():.0f} s left before the deadline")
        else:
            run_with_alarm(min(cap, ctx.left() - 5), step, ctx, section)
        ok = True
    except (Exception, StepTimeout) as error:
        trace = "".join(traceback.format_exception(error, limit=-4))
        section.text(f"FAILED: {type(error).__name__}: {first_line(error)}\n\n```\n{trace}```")
    section.footer = f"({time.perf_counter() - start:.1f} s; {time.monotonic() - START:.0f} s into the run)"
    section.report.write()
    print(section.render(), flush=True)
    gc.collect()
    free_memory(ctx.device)
    return ok


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.smoke else "cpu"))
    if args.smoke:
        args.repeats = 1  # the smoke run checks that every step runs, not how fast
    args.compile_backend = args.compile_backend or ("eager" if args.smoke else "inductor")
    args.results_dir = args.results_dir or (tempfile.mkdtemp(prefix="gpu-smoke-") if args.smoke else RESULTS_DIR)
    ctx = Context(args, plan(args.smoke), device, START + args.deadline_s)
    report = Report(args.results_dir, preamble(ctx), OWN_FILES.get(args.steps, REPORT_NAME))
    sections = {title: report.section(title) for title, _, _ in STEPS if title[0] in args.steps}  # listed a to g
    for section in sections.values():
        section.footer = "(not run yet)"
    order = sorted((s for s in STEPS if s[0][0] in args.steps), key=lambda entry: RUN_ORDER.index(entry[0][0]))
    failed = [title for title, step, cap in order if not run_step(ctx, sections[title], step, cap)]
    path = report.write()
    print(f"wrote {path} in {time.monotonic() - START:.0f} s" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
