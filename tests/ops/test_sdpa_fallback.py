"""ssmhub.ops.attention: the fused kernel where it is safe, the math backend where the AMX packing would crash."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from ssmhub.ops.attention import fused_attention_unsafe, scaled_dot_product_attention

# bfloat16 keeps 8 bits of mantissa (unit round-off 2^-9 ≈ 2e-3); q, k, v rounded to it and a softmax-weighted sum of
# values of magnitude ≤ ~4 stay within a few units of that relative to max|y|: 3e-2.
BF16_REL = 3e-2


def _naive_attention(q, k, v, allowed):
    """softmax(QKᵀ/√d + log mask)·V in float64 (arXiv 1706.03762, §3.2.1)."""
    q, k, v = (t.double() for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("length", [8, 64, 300])
def test_attention_equals_the_formula(dtype, length):
    q, k, v = (torch.randn(2, 3, length, 16, generator=torch.Generator().manual_seed(i)).to(dtype) for i in range(3))
    allowed = torch.ones(length, length, dtype=torch.bool).tril()[None, None]
    y = scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    expected = _naive_attention(q, k, v, allowed)
    rel = BF16_REL if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(y.double(), expected, atol=rel * expected.abs().max().item(), rtol=0)


def test_bfloat16_attention_runs_under_every_capability():
    """The crash this module avoids: an AMX CPU with ATEN_CPU_CAPABILITY below AVX-512 (a child process, since the
    capability is read once per process). On other CPUs the same code runs the fused kernel."""
    script = textwrap.dedent(
        """
        import torch
        from ssmhub.ops.attention import fused_attention_unsafe, scaled_dot_product_attention
        q = torch.randn(1, 2, 64, 16, dtype=torch.bfloat16)
        mask = torch.ones(64, 64, dtype=torch.bool).tril()[None, None]
        y = scaled_dot_product_attention(q, q, q, attn_mask=mask)
        print(bool(torch.isfinite(y).all()), fused_attention_unsafe())
        """
    )
    for capability in ("avx2", "default"):
        env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        finite, unsafe = done.stdout.split()
        assert finite == "True"
        assert unsafe == str(bool(torch.cpu._is_amx_tile_supported())), (capability, done.stdout)


def test_the_fused_kernel_is_kept_at_full_capability():
    if torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        assert not fused_attention_unsafe()
