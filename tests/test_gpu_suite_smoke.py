"""benchmarks/gpu_suite.py --smoke runs every step on the CPU at tiny sizes, so the GPU suite never rots."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = (
    "Test suite on the device",
    "Triton FlashButterfly against torch.fft",
    "fft_conv backends",
    "Scans against their loops",
    "Decode per family",
)


def test_gpu_suite_smoke_run_reports_every_step(tmp_path):
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_suite.py"), "--smoke", "--results_dir", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = (tmp_path / "gpu.md").read_text()
    for step in STEPS:
        assert f"## {step}" in report
    assert "FAILED" not in report
