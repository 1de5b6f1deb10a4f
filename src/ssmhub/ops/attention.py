"""Scaled dot-product attention that runs on every CPU whatever ``ATEN_CPU_CAPABILITY`` says.

PyTorch's fused CPU attention (its flash kernel) chooses an AMX packing (``pack_vnni2``) for bfloat16 from the
CPU's features, not from the capability in force: on an Intel CPU with AMX, a process run with
``ATEN_CPU_CAPABILITY=avx2`` (or ``default``) fails with ``pack_vnni2 is only supported when avx512 is supported``
on bfloat16 inputs of more than a few tokens (seen with torch 2.13). There, and only there, attention runs on
PyTorch's math backend instead: the same formula softmax(QKᵀ/√d + mask)·V (arXiv 1706.03762, §3.2.1), slower
and numerically equivalent to float round-off. The choice is made once, on the host, from the CPU and the
capability, so nothing is read back per call and ``torch.compile(fullgraph=True)`` traces either branch.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

__all__ = ["fused_attention_unsafe", "scaled_dot_product_attention"]

_REDUCED = (torch.bfloat16, torch.float16)


@functools.cache
def fused_attention_unsafe() -> bool:
    """Whether the fused CPU attention kernel would pick an AMX packing that the capability in force forbids:
    the CPU has AMX tiles and ATen runs with less than its AVX-512 kernels."""
    has_amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    return bool(has_amx) and torch.backends.cpu.get_cpu_capability() not in ("AVX512", "AVX512_BF16")


def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p: float = 0.0):
    """``torch.nn.functional.scaled_dot_product_attention`` (q, k, v: (B, heads, L, d_head); ``attn_mask``
    broadcast to (B, heads, L, T), True = attend), on the math backend where the fused CPU kernel would crash
    (:func:`fused_attention_unsafe`): reduced-precision inputs on such a CPU."""
    if q.device.type == "cpu" and q.dtype in _REDUCED and fused_attention_unsafe():
        with sdpa_kernel([SDPBackend.MATH]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
