"""Comparisons shared by the test tree, and the float32 tolerances they use, derived from the arithmetic.

When the bits are promised, and only then, a test asserts equality (``torch.equal``) and says why in a comment:
integer and boolean results, greedy tokens, a copy of a tensor, and the same op run on the same inputs in the same
call. Two *different* computations of the same function (a cache replay and a fresh forward, a batch and its rows
alone, one long forward and its windows, a reloaded model, two thread counts or CPU code paths) are not promised
the same bits: BLAS and FFT kernels choose blockings and reduction orders by shape, alignment, thread count and
instruction set (AVX2, AVX-512, a GPU), and float32 rounds each partial sum. Such results are compared within a
tolerance relative to the largest value, since float32 round-off in a reduction is relative to the largest
magnitude it sums, not to each element (elementwise relative tolerances are meaningless near zero crossings).

The bounds: float32 has a unit round-off u = 2^-24 (``EPS32`` = 2u). A result that passes through ``depth`` rounded
stages (a matmul or norm over n terms counts as log2(n) stages when summed pairwise, an FFT of size n as log2(n)
butterflies, a sequential scan of n steps as n), computed two ways, differs by at most about
2 × depth × u × (amplification) relative to its largest value. Each constant below states its depth.
"""

from __future__ import annotations

import torch

EPS32 = torch.finfo(torch.float32).eps  # 1.19e-7 = 2u

# One op in float32 against a float64 reference (an FFT convolution, a scan of ≤ 64 steps, a kernel of ≤ 1024 taps):
# depth ≤ ~40 stages of ≤ 1 ulp each, ≈ 5e-6 of max|y|; 1e-5 (84 EPS32) covers it with a factor of 2.
FP32_REL = 1e-5

# A whole tiny model (the conformance configs: ≤ 4 blocks, width ≤ 64, ≤ 32 positions) computed two ways: per block
# ≈ 60 rounded stages (norm, projections over ≤ 64 terms, an FFT conv of ≤ 64 points or a scan of ≤ 32 steps,
# gates, residual), ≤ 4 blocks plus the head: ≈ 300 stages × 2 ways × u ≈ 3.6e-5 of max|logits|; norms and gates
# can amplify by a small factor, so 2e-4 (~1700 EPS32).
MODEL_REL = 2e-4

# Gradients of such a model computed two ways: backpropagation runs the forward's depth again in transpose and
# multiplies the forward's rounding by the local Jacobians (a softmax cross-entropy, gates), ≈ 2x the forward's
# depth and amplification: 1e-3 of the largest gradient entry.
MODEL_GRAD_REL = 1e-3


def scaled_close(actual, expected, rel=FP32_REL, what=""):
    """``actual`` equals ``expected`` within ``rel`` × max|expected|: float32 round-off is relative to the largest
    value, so elementwise relative tolerances would be meaningless near zero crossings. ``what`` names the
    compared quantity in a failure."""
    if expected.is_complex():
        actual, expected = torch.view_as_real(actual.resolve_conj()), torch.view_as_real(expected.resolve_conj())
    scale = expected.abs().max().item() or 1.0
    actual = actual.to(device=expected.device, dtype=expected.dtype)
    torch.testing.assert_close(actual, expected, atol=rel * scale, rtol=0, msg=lambda m: f"{what}: {m}" if what else m)


def same_values(actual, expected, rel=MODEL_REL, what=""):
    """Two computations of the same tensor: integer and boolean tensors equal exactly (their values are promised);
    floating tensors within ``rel`` × max|expected| (``MODEL_REL`` by default: a tiny model computed two ways)."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, (what, actual.shape, expected.shape)
    if actual.is_floating_point() or actual.is_complex():
        scaled_close(actual, expected, rel=rel, what=what)
    else:
        assert torch.equal(actual, expected.to(actual.device)), what  # integers and booleans: exact by nature


def same_states(cache, reference, rel=MODEL_REL):
    """Two caches hold the same states: the same length, layers, names and shapes; every integer state (counters,
    positions) exactly, every float state within ``rel`` of its largest value."""
    assert cache.get_seq_length() == reference.get_seq_length()
    for index, (got, want) in enumerate(zip(cache.layers, reference.layers, strict=True)):
        assert got.keys() == want.keys(), index
        for name in got:
            same_values(got[name], want[name], rel=rel, what=f"layer {index} state {name!r}")
