"""Comparisons shared by the test tree: a float32 result against a float64 reference, scaled to the signal."""

from __future__ import annotations

import torch

# Float32 round-off in an FFT or a long reduction is relative to the largest value, not to each element: measured
# 1e-7 to 5e-7 of max|y| (outputs and gradients) at the sizes tested; 1e-5 (~80 float32 epsilons) leaves room.
FP32_REL = 1e-5


def scaled_close(actual, expected, rel=FP32_REL, what=""):
    """``actual`` equals ``expected`` within ``rel`` × max|expected|: float32 round-off is relative to the largest
    value, so elementwise relative tolerances would be meaningless near zero crossings. ``what`` names the
    compared quantity in a failure."""
    scale = expected.abs().max().item() or 1.0
    actual = actual.to(device=expected.device, dtype=expected.dtype)
    torch.testing.assert_close(actual, expected, atol=rel * scale, rtol=0, msg=lambda m: f"{what}: {m}" if what else m)
