"""The block-scan Triton kernels (ssmhub.ops.triton._block_scan_kernels: the sequential and the chunked scan, forward
and backward) compile for an H100 (sm_90) down to a cubin, on a CPU-only machine: the interpreter tests
(test_block_scan_triton.py) prove their numbers, this proves the GPU compiler takes them (a 4-d broadcast product,
branches on the chunk index, int64 loop bounds), so that a rare GPU run does not find it out. Skipped where triton or
its NVIDIA backend is missing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
pytest.importorskip("triton.backends.nvidia")

HELPER = Path(__file__).with_name("triton_offline_compile.py")
KERNELS = "ssmhub.ops.triton._block_scan_kernels"


def _cases():
    """Every kernel at b = 8 (the paper's: 8 lanes, 2 heads a program), and the 4-d product at b = 3 (padded to 4
    lanes, masked, 8 heads a program)."""
    tile = {"B": 8, "BP": 8, "G": 2}
    return [
        ["block_scan_fwd_kernel", {"HAS_X0": True, **tile}, 4],
        ["block_scan_chunk_fwd_kernel", tile, 4],
        ["block_scan_chunk_fwd_kernel", {"B": 3, "BP": 4, "G": 8}, 1],
        ["block_scan_bwd_kernel", {"HAS_X0": True, "NEED_DA": True, **tile}, 4],
        ["block_scan_bwd_kernel", {"HAS_X0": False, "NEED_DA": False, **tile}, 1],
        ["block_scan_chunk_bwd_kernel", tile, 4],
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernels compile in test_block_scan_triton.py")
def test_the_kernels_compile_for_sm90_without_a_gpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(HELPER), KERNELS, json.dumps(_cases())],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    failed = [r for r in results if not r["ok"]]
    assert len(results) == len(_cases()) and not failed, (failed, done.stderr[-2000:])
