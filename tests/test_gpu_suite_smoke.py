"""benchmarks/gpu_suite.py --smoke runs every step on the CPU at tiny sizes, so the GPU suite never rots; the training
table (step e) keeps going past a failing cell."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
STEPS = (
    "a. Triton kernels against float64",
    "b. Scan speed, forward + backward",
    "c. fft_conv backends",
    "d. Decode per family: eager vs CUDA graph",
    "e. Training at users' shapes vs compiled GPT-2, bf16",
    "f. Test suite on the device",
    "g. FSDP2 training step, bf16 policy",
)
TRAINING_PARTS = (
    "| model | params (M) | vs GPT-2 | configuration |",
    "| model | L × batch | mode | params (M) | first step s | step ms |",
    "### Targets (issue 52 §4)",
    "### Arithmetic per token",
    "### Profiles: one eager step per model",
    "### Whole-model compilation, against per-block",
)


def test_gpu_suite_smoke_run_reports_every_step(tmp_path):
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_suite.py"), "--smoke", "--results_dir", str(tmp_path)]
    command += ["--deadline_s", "1200"]  # 7 min measured on 2 cores shared with a load of 20: room for a busy CI
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = (tmp_path / "gpu.md").read_text()
    for step in STEPS:
        assert f"## {step}" in report
    for part in TRAINING_PARTS:
        assert part in report
    for name in ("gpt2", "dlr", "h3", "h3-hybrid", "bdlrnn", "mamba", "serpent"):
        for mode in ("compiled", "eager"):
            assert f"| {name} | 32 × 2 | {mode} |" in report and f"| {name} | 64 × 1 | {mode} |" in report
        assert f"**{name}**, eager, L 32 × batch 2:" in report  # its profile
    assert "FAILED" not in report
    assert "Device: CPU" in report and "Command:" in report


@pytest.fixture
def smoke_context(tmp_path):
    import gpu_suite
    from _gpu_common import Context, Report

    args = gpu_suite.parse_args(["--smoke", "--results_dir", str(tmp_path)])
    args.compile_backend = "eager"
    ctx = Context(args, gpu_suite.plan(True), gpu_suite.torch.device("cpu"), gpu_suite.time.monotonic() + 300)
    return ctx, Report(str(tmp_path), ["test"])


def test_a_failing_cell_does_not_stop_the_training_table(smoke_context, monkeypatch):
    import _gpu_train

    ctx, report = smoke_context
    build = _gpu_train.build_model

    def build_or_fail(name, shape, device):
        if name == "dlr":
            raise ValueError("no dlr today")
        return build(name, shape, device)

    monkeypatch.setattr(_gpu_train, "build_model", build_or_fail)
    rows = [_gpu_train.Row(name, 32, 2, "eager") for name in ("gpt2", "dlr", "h3")]
    gpt2 = {("gpt2", 32, "compiled"): {"ms": 10.0}}  # the ratio's denominator, as a compiled row would leave it
    results = _gpu_train.train_table(ctx, report.section("e"), rows, gpt2)
    text = report.sections[0].render()
    assert "| dlr | 32 × 2 | eager | – | – | failed: ValueError: no dlr today |" in text
    assert "ms" in results[("gpt2", 32, "eager")] and "ms" in results[("h3", 32, "eager")]
    h3 = next(line for line in text.splitlines() if line.startswith("| h3 | 32 × 2 | eager | "))
    assert f"| {10.0 / results[('h3', 32, 'eager')]['ms']:.2f}× |" in h3
