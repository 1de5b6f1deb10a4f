"""benchmarks/gpu_suite.py --smoke runs every step on the CPU at tiny sizes, so the GPU suite never rots."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = (
    "a. Triton kernels against float64",
    "b. Scan speed, forward + backward",
    "c. fft_conv backends",
    "d. Decode per family: eager vs CUDA graph",
    "e. Training throughput vs GPT-2",
    "f. Test suite on the device",
    "g. FSDP2 training step, bf16 policy",
)


def test_gpu_suite_smoke_run_reports_every_step(tmp_path):
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_suite.py"), "--smoke", "--results_dir", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = (tmp_path / "gpu.md").read_text()
    for step in STEPS:
        assert f"## {step}" in report
    assert "FAILED" not in report
    assert "Device: CPU" in report and "Command:" in report
