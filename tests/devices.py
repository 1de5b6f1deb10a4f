"""The device the tests run on (tests/conftest.py makes ``$SSMHUB_TEST_DEVICE`` torch's default device), for code in
tests that must name a device type: autocast contexts and transformers' ``TrainingArguments``."""

from __future__ import annotations

import torch


def device_type() -> str:
    """``"cpu"``, or ``"cuda"`` when the suite runs on a GPU (benchmarks/gpu_suite.py)."""
    return torch.get_default_device().type


def bf16_autocast(enabled: bool = True) -> torch.autocast:
    """bf16 autocast for the tests' device: ``torch.autocast("cpu", ...)`` leaves CUDA tensors in float32."""
    return torch.autocast(device_type(), dtype=torch.bfloat16, enabled=enabled)
