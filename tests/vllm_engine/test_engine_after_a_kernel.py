"""A vLLM engine starts in a process where one of ssmhub's one-pass kernels already ran (``generate`` on a CPU, then
``LLM(...)``; or one engine after another): vLLM 0.32's CPU worker scans every loaded module's globals as it starts
(``vllm.triton_utils.dispatcher``), and llvmlite's library wrapper, loaded with numba, broke that scan
(``ssmhub.ops.row_tables.import_numba`` mends it). Runs in ``make test-vllm``'s environment."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("numba")

from vllm.triton_utils.dispatcher import _rebind_kernels

from ssmhub.ops.diagonal_rows import diagonal_step_rows_


def test_vllms_start_up_scan_of_every_module_runs_after_a_kernel_ran():
    planes, weights = (torch.zeros(4),) * 2, (torch.zeros(3, 4),) * 2
    diagonal_step_rows_(torch.zeros(2, 3, 2, 4), torch.tensor([1]), torch.tensor([False]), torch.zeros(1, 3),
                        planes, weights)  # fmt: skip
    _rebind_kernels([])  # the worker's scan at start-up, over every module loaded now (llvmlite's included)
