"""One command for a GPU machine: correctness and speed of ssmhub's fast paths on the device, in one report.

Run on a CUDA machine (about 8 minutes on an H200; writes ``benchmarks/results/gpu.md`` with the device name after
every step, and each failing test's traceback to ``gpu_test_failures.md`` beside it as it fails)::

    python benchmarks/gpu_suite.py

and on any CPU at tiny sizes, in seconds, so that the suite never rots (``make test`` runs this)::

    python benchmarks/gpu_suite.py --smoke --results_dir /tmp/gpu-smoke

Steps, each reported even when an earlier one failed (the exit status is 1 if any failed):

1. the fused Triton FlashButterfly kernel compiled and checked against a float64 ``torch.fft`` reference
   (long-conv paper §3.3); on a CPU, Triton's interpreter;
2. ``fft_conv`` backends timed against ``torch.fft`` (torch.fft, Butterfly, Triton) over L;
3. the chunked selective scan and the parallel block scan against their sequential loops (forward+backward);
4. decode ms/token for every family, eager and ``torch.compile``-d (a failure to compile is reported);
5. the test suite on the device (``SSMHUB_TEST_DEVICE``: tests/conftest.py makes it torch's default device), last,
   within ``--test_budget`` seconds, so that a machine's time limit cuts the tests rather than the measurements.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import traceback

if "--smoke" in sys.argv and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"  # set before any triton import: the CPU runs the kernel interpreted

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import RESULTS_DIR, markdown_table, median, write_report

import ssmhub
from ssmhub.models.cache_argument import CACHE_FIELD
from ssmhub.ops import block_scan, block_scan_ref, fft_conv, fft_conv_ref, selective_scan, selective_scan_ref
from ssmhub.ops.triton import can_run
from ssmhub.preflight import first_line

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, seconds (what CI runs)")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--results_dir", default=None, help="default: benchmarks/results (a temporary folder with --smoke)")
    p.add_argument("--test_budget", type=int, default=330, help="seconds for the test run (step 5)")
    p.add_argument(
        "--test_workers", type=int, default=None, help="pytest-xdist workers for step 5 (default: 16 on a GPU, else 0)"
    )
    p.add_argument("--repeats", type=int, default=5)
    return p.parse_args(argv)


def sizes(smoke: bool) -> dict:
    """What each step runs at: tiny in a smoke run, the issue's ranges on a GPU."""
    if smoke:
        return {
            "tests": ["tests/layers/test_mixer_protocol.py", "-k", "dlr and packed"],
            "triton_lengths": [16, 100],
            "fft_lengths": [256, 1024],
            "fft_shape": (2, 8),
            "scan_lengths": [64],
            "decode_width": (16, 2),
            "decode_tokens": 4,
            "compile": False,
        }
    return {
        "tests": ["tests/ops", "tests/layers", "tests/conformance"],
        "triton_lengths": [1024, 4096, 8192],
        "fft_lengths": [1024, 4096, 8192, 16384, 65536],
        "fft_shape": (8, 768),
        "scan_lengths": [512, 4096],
        "decode_width": (256, 4),
        "decode_tokens": 64,
        "compile": True,
    }


def timed(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after one warm-up, synchronizing the device."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return median(times)


# ----------------------------------------------------------------------------- steps
def step_tests(args, plan, device) -> str:
    """The test suite with the device as torch's default device; the last line of pytest's summary. Each failure's
    traceback goes to ``gpu_test_failures.md`` in the results folder when it happens (tests/conftest.py)."""
    failure_log = os.path.join(args.results_dir, "gpu_test_failures.md")
    if os.path.exists(failure_log):
        os.remove(failure_log)
    env = {**os.environ, "SSMHUB_TEST_DEVICE": device.type, "SSMHUB_TEST_FAILURE_LOG": failure_log}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:benchmark", *plan["tests"]]
    workers = args.test_workers if args.test_workers is not None else (16 if device.type == "cuda" else 0)
    if workers and importlib.util.find_spec("xdist") is not None:
        command += ["-n", str(workers)]  # one CUDA context per worker: the suite's tiny tensors leave the GPU idle
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))  # not workers × all cores
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.test_budget)
        summary = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
        status = "passed" if done.returncode == 0 else f"exit {done.returncode}"
    except subprocess.TimeoutExpired:
        summary, status = f"stopped after the {args.test_budget} s budget", "timeout"
    if status != "passed":
        logged = open(failure_log, encoding="utf-8").read().count("\n### ") + 1 if os.path.exists(failure_log) else 0
        raise RuntimeError(f"{' '.join(command[3:])}: {status}: {summary} ({logged} tracebacks in {failure_log})")
    return f"`SSMHUB_TEST_DEVICE={device.type} pytest {' '.join(command[3:])}`: {summary}"


def step_triton(args, plan, device) -> str:
    """The fused kernel against a float64 FFT convolution: max |error| / max |reference| per length."""
    rows = []
    for length in plan["triton_lengths"]:
        runs, why = can_run(device, 2 * length)
        if not runs:
            rows.append((length, "not run", why))
            continue
        gen = torch.Generator(device=device).manual_seed(length)
        u = torch.randn(2, 4, length, device=device, generator=gen)
        kernel = torch.randn(4, length, device=device, generator=gen) / length**0.5
        got = fft_conv(u, kernel, backend="triton")
        expected = fft_conv_ref(u.double(), kernel.double())
        error = ((got.double() - expected).abs().max() / expected.abs().max()).item()
        if not error < 1e-5:
            raise RuntimeError(f"Triton FlashButterfly at L={length}: relative error {error:.2e} >= 1e-5")
        rows.append((length, f"{error:.1e}", "ok"))
    return markdown_table(["L", "relative error vs float64 torch.fft", "status"], rows)


def step_fft_backends(args, plan, device) -> str:
    """``fft_conv`` (causal, forward) per backend, median ms and the speed-up over torch.fft."""
    batch, heads = plan["fft_shape"]
    rows = []
    for length in plan["fft_lengths"]:
        u = torch.randn(batch, heads, length, device=device)
        kernel = torch.randn(heads, length, device=device) / length**0.5
        ms = {}
        for backend in ("torch", "butterfly", "triton"):
            if backend == "triton" and not can_run(device, 2 * length)[0]:
                continue
            call = lambda b=backend, u=u, k=kernel: fft_conv(u, k, backend=b)  # noqa: E731
            ms[backend] = 1e3 * timed(call, device, args.repeats)
        cells = [f"{ms[b]:.3f} ({ms['torch'] / ms[b]:.2f}×)" if b in ms else "not run" for b in ("butterfly", "triton")]
        rows.append((length, f"{ms['torch']:.3f}", *cells))
    return markdown_table(["L", "torch.fft ms", "Butterfly ms (speed-up)", "Triton ms (speed-up)"], rows)


def _scan_pair(kind: str, length: int, device) -> tuple:
    """Leaf inputs and the (fast, loop) functions of one scan, forward + backward of a weighted sum."""
    if kind == "selective":
        x, delta = torch.randn(2, length, 64, device=device), torch.rand(2, length, 64, device=device) * 0.1
        A, B, C = (
            -torch.rand(64, 8, device=device),
            torch.randn(2, length, 8, device=device),
            torch.randn(2, length, 8, device=device),
        )
        leaves = [t.requires_grad_() for t in (x, delta, B, C)]
        fast, loop = (lambda: selective_scan(x, delta, A, B, C)[0]), (lambda: selective_scan_ref(x, delta, A, B, C)[0])
    else:
        A = torch.randn(2, length, 8, 8, 8, device=device)
        A = A / A.abs().sum(-2, keepdim=True).clamp_min(1.0)  # columns in the unit 1-ball (Eq. 6, p = 1)
        v = torch.randn(2, length, 8, 8, device=device)
        leaves = [t.requires_grad_() for t in (A, v)]
        fast, loop = (lambda: block_scan(A, v)), (lambda: block_scan_ref(A, v))
    return leaves, fast, loop


def step_scans(args, plan, device) -> str:
    """Each scan against its loop: the same values, and the median ms of forward + backward."""
    rows = []
    for kind in ("selective", "block"):
        for length in plan["scan_lengths"]:
            _, fast, loop = _scan_pair(kind, length, device)
            fast_y, loop_y = fast(), loop()
            error = ((fast_y - loop_y).abs().max() / loop_y.abs().max().clamp_min(1e-30)).item()
            if not error < 1e-4:
                raise RuntimeError(f"{kind} scan at T={length} differs from its loop by {error:.2e} (relative)")

            def train(fn=fast):
                fn().square().sum().backward()

            fast_ms, loop_ms = (1e3 * timed(lambda f=f: train(f), device, args.repeats) for f in (fast, loop))
            rows.append((kind, length, f"{error:.1e}", f"{fast_ms:.2f}", f"{loop_ms:.2f}", f"{loop_ms / fast_ms:.1f}×"))
    return markdown_table(["scan", "T", "rel. error vs loop", "fast ms", "loop ms", "speed-up"], rows)


DECODE_FAMILIES = {
    "dlr": (ssmhub.DLRConfig, ssmhub.DLRForCausalLM, {"state_size": 64}),
    "h3": (ssmhub.H3Config, ssmhub.H3ForCausalLM, {"max_kernel_length": 256, "attention_layers": []}),
    "h3-hybrid": (
        ssmhub.H3Config,
        ssmhub.H3ForCausalLM,
        {"max_kernel_length": 256, "attention_layers": [1], "num_attention_heads": 4},
    ),
    "mamba": (ssmhub.SerpentConfig, ssmhub.SerpentForCausalLM, {"resampling_rates": []}),
    "serpent": (
        ssmhub.SerpentConfig,
        ssmhub.SerpentForCausalLM,
        {"resampling_rates": [0.5, 0.1], "hidden_size_multiple": 3},
    ),
    "bdlrnn": (ssmhub.BDLRNNConfig, ssmhub.BDLRNNForCausalLM, {"block_size": 8}),
}


def _decode_model(name: str, width: int, layers: int, device):
    config_class, model_class, fields = DECODE_FAMILIES[name]
    fields = dict(fields)
    width = width - width % fields.pop("hidden_size_multiple", 1)
    config = config_class(vocab_size=512, hidden_size=width, num_hidden_layers=layers, **fields)
    return model_class(config).to(device).eval()


def _ms_per_token(model, tokens: int, device, repeats: int, compiled_step=None, graphs: bool = False) -> float:
    """Decode time per token; with ``compiled_step`` (the compiled forward) the prompt is prefilled eagerly into a
    preallocated cache (``model.static_cache``) and every token goes through the compiled step, as in ``generate``;
    ``graphs``: the step was compiled with ``mode="reduce-overhead"`` (CUDA graphs), each call a new graph step."""
    prompt = torch.randint(0, 512, (1, 32), device=device)

    def decode():
        cache = None if compiled_step is None else model.static_cache(1, prompt.shape[1] + tokens)
        out = model(prompt, use_cache=True, cache=cache)
        cache, token = getattr(out, CACHE_FIELD), out.logits[:, -1:].argmax(-1)
        step = model if compiled_step is None else compiled_step
        for _ in range(tokens):
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            out = step(token, cache=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)

    with torch.no_grad():
        return 1e3 * timed(decode, device, repeats) / tokens


def _cell(measure, *args, **kwargs) -> str:
    """``measure(*args, **kwargs)`` as a table cell: ms with two decimals, or the first line of its error."""
    try:
        return f"{measure(*args, **kwargs):.2f}"
    except Exception as error:
        return f"failed: {type(error).__name__}: {first_line(error)[:120]}"


def step_decode(args, plan, device) -> str:
    """Decode ms/token (a 32-token prompt, then greedy tokens one at a time): eager, compiled (Inductor) and, on a
    GPU, compiled with CUDA graphs (what ``generate`` does with a static cache there). A family that fails is
    reported in its row; an eager failure fails the step after the table is made."""
    width, layers = plan["decode_width"]
    tokens, repeats = plan["decode_tokens"], args.repeats
    rows = []
    for name in DECODE_FAMILIES:
        model = _decode_model(name, width, layers, device)
        eager = _cell(_ms_per_token, model, tokens, device, repeats)
        compiled = graphs = "not run (--smoke)"
        if plan["compile"]:  # fullgraph: a graph break fails the cell
            compiled = _cell(
                _ms_per_token, model, tokens, device, repeats, torch.compile(model.forward, fullgraph=True)
            )
            graphs = "not run (no CUDA)"
            if device.type == "cuda":
                step = torch.compile(model.forward, fullgraph=True, mode="reduce-overhead")
                graphs = _cell(_ms_per_token, model, tokens, device, repeats, step, graphs=True)
        rows.append((name, f"{width}×{layers}", eager, compiled, graphs))
    table = markdown_table(
        ["family", "width × layers", "eager ms/token", "compiled ms/token", "compiled + CUDA graphs ms/token"], rows
    )
    if any(row[2].startswith("failed") for row in rows):
        raise RuntimeError(f"eager decode failed for a family:\n\n{table}")
    return table


STEPS = [
    ("Triton FlashButterfly against torch.fft", step_triton),
    ("fft_conv backends", step_fft_backends),
    ("Scans against their loops", step_scans),
    ("Decode per family", step_decode),
    ("Test suite on the device", step_tests),
]


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    plan = sizes(args.smoke)
    if args.smoke:
        args.repeats = 1  # the smoke run checks that every step runs, not how fast
    results_dir = args.results_dir = args.results_dir or (
        tempfile.mkdtemp(prefix="gpu-smoke-") if args.smoke else RESULTS_DIR
    )
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (no CUDA device)"
    sections, failed = [f"Device: {name}{' (smoke run: tiny sizes)' if args.smoke else ''}"], []
    for title, step in STEPS:
        start = time.perf_counter()
        try:
            body = step(args, plan, device)
        except Exception as error:
            failed.append(title)
            body = f"FAILED: {type(error).__name__}: {error}\n\n```\n{traceback.format_exc(limit=3)}```"
        sections.append(f"## {title}\n\n{body}\n\n({time.perf_counter() - start:.1f} s)")
        print(sections[-1], flush=True)
        # after every step, so that a run stopped by its machine's time limit keeps the steps it finished
        path = write_report("gpu", "ssmhub on a GPU: tests, kernels, scans, decode", sections, results_dir=results_dir)
    print(f"wrote {path}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
