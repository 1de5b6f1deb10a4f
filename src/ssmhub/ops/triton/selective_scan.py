"""The selective scan (Mamba-1 S6) as fused Triton kernels, forward and backward: :func:`selective_scan_triton`.

Same arguments, math and results as :func:`ssmhub.ops.selective_scan.selective_scan` (Gu & Dao, arXiv 2312.00752,
§3.2 Algorithm 2; the module docstring there gives the layouts and the ``resets`` semantics), computed in float32
by the kernels of :mod:`._selective_scan_kernels`:

- forward: one program per (batch row, block of ``BLOCK_D`` channels) walks time with its (BLOCK_D, N) state in
  registers and fuses the discretisation ``exp(Δ·A)`` (as ``exp2(Δ·A·log₂e)``), ``Δ·x·B``, the C readout, the
  D skip and the silu(z) gate; it stores only the state before every chunk of ``chunk_size`` steps and the final
  state (Mamba §3.3: recompute the states in the backward instead of storing them).
- backward: the same programs walk the chunks from the end, recompute a chunk's states from its saved start into
  a per-program scratch buffer, then run the adjoint recurrence backwards through the chunk. B and C are shared
  by all channels, so their gradients (and A's and D's, shared by the batch rows) are per-program partial sums
  that are added up here in torch.

CPU tensors run under Triton's interpreter (``TRITON_INTERPRET=1`` set before the first Triton import; that is
how the tests check the kernels on a CPU-only machine); :func:`can_run_selective_scan` says whether a device can.
"""

from __future__ import annotations

import importlib
import importlib.util

import torch

from ..precision import float32_math
from . import kernel_support, launch_device
from .opaque import opaque_op

__all__ = ["BLOCK_D", "CHUNK_SIZE", "can_run_selective_scan", "selective_scan_triton"]

CHUNK_SIZE = 64  # time steps between saved states: the backward's recompute span and scratch length
BLOCK_D = 32  # channels per program: a (32, N) float32 state tile in registers

# by absolute name: a remote-code bundle carries this file flattened, but not the kernels
KERNELS_MODULE = "ssmhub.ops.triton._selective_scan_kernels"


def can_run_selective_scan(device: torch.device | str) -> tuple[bool, str]:
    """Whether :func:`selective_scan_triton` can run on ``device``: ``(True, "")`` or ``(False, "key: why")``."""
    usable, reason = kernel_support(KERNELS_MODULE, device)
    if not usable:
        return usable, reason
    return True, ""


def _kernels():
    return importlib.import_module(KERNELS_MODULE)


def _check_args(x, delta, A, B, C, D, z, initial_state, resets) -> tuple[int, int, int, int]:
    """Raise ValueError unless every argument has the documented shape and x's device; return (Bt, T, E, N)."""
    if x.dim() != 3 or x.shape[1] < 1:
        raise ValueError(f"x must have shape (Bt, T, E) with T ≥ 1; got {tuple(x.shape)}")
    batch, seq_len, channels = x.shape
    if A.dim() != 2 or A.shape[0] != channels:
        raise ValueError(f"A must have shape (E, N) with E = {channels}; got {tuple(A.shape)}")
    state_size = A.shape[1]
    expected = {
        "delta": (delta, (batch, seq_len, channels)),
        "B": (B, (batch, seq_len, state_size)),
        "C": (C, (batch, seq_len, state_size)),
        "D": (D, (channels,)),
        "z": (z, (batch, seq_len, channels)),
        "initial_state": (initial_state, (batch, channels, state_size)),
        "resets": (resets, (batch, seq_len)),
    }
    for name, (t, shape) in expected.items():
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}; got {tuple(t.shape)}")
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}: the kernels need one device")
    if resets is not None and resets.dtype != torch.bool:
        raise ValueError(f"resets must be a bool tensor; got {resets.dtype}")
    return batch, seq_len, channels, state_size


def _flags(D, z, keep) -> dict[str, bool]:
    return {"HAS_D": D is not None, "HAS_Z": z is not None, "HAS_RESETS": keep is not None}


def _block_n(state_size: int) -> int:
    """N rounded up to a power of two (``tl.arange`` needs one); the padded states stay zero."""
    return 1 << max(0, state_size - 1).bit_length()


def _launch_forward(x, delta, A, B, C, D, z, h0, keep, chunk, block_d):
    """y (Bt, T, E), the state before every chunk (Bt, nC, E, N) and the final state (Bt, E, N), float32."""
    batch, seq_len, channels = x.shape
    state_size = A.shape[1]
    n_chunks = -(-seq_len // chunk)
    y = torch.empty_like(x)
    starts = x.new_empty(batch, n_chunks, channels, state_size)
    final = x.new_empty(batch, channels, state_size)
    grid = (batch, -(-channels // block_d))
    with launch_device(x):
        _kernels().scan_forward_kernel[grid](
            x, delta, A, B, C,
            x if D is None else D, x if z is None else z, x if keep is None else keep,  # dummies when absent
            h0, y, starts, final,
            seq_len, channels, state_size, chunk, n_chunks,
            **_flags(D, z, keep), BLOCK_D=block_d, BLOCK_N=_block_n(state_size),
        )  # fmt: skip
    return y, starts, final


def _launch_backward(saved, dy, dfinal, chunk, block_d):
    """Gradients of x, Δ, A, B, C, D, z and h0 (None for an absent D or z) from dL/dy and dL/d(final state)."""
    x, delta, A, B, C, D, z, keep, starts = saved
    batch, seq_len, channels = x.shape
    state_size, n_chunks, block_n = A.shape[1], starts.shape[1], _block_n(A.shape[1])
    n_blocks = -(-channels // block_d)
    scratch = x.new_empty(batch, n_blocks, chunk + 1, block_d, block_n)  # each program's recomputed chunk
    dx, ddelta = torch.empty_like(x), torch.empty_like(delta)  # (Bt, T, E)
    dz = None if z is None else torch.empty_like(z)  # (Bt, T, E)
    dB_parts = x.new_empty(n_blocks, batch, seq_len, state_size)  # (nE, Bt, T, N): Σ over one channel block
    dC_parts = torch.empty_like(dB_parts)
    dA_rows, dh0 = x.new_empty(batch, channels, state_size), x.new_empty(batch, channels, state_size)  # (Bt, E, N)
    dD_rows = None if D is None else x.new_empty(batch, channels)  # (Bt, E)
    with launch_device(x):
        _kernels().scan_backward_kernel[(batch, n_blocks)](
            x, delta, A, B, C,
            x if D is None else D, x if z is None else z, x if keep is None else keep,  # dummies when absent
            starts, dy, dfinal, scratch,
            dx, ddelta, x if dz is None else dz, dB_parts, dC_parts, dA_rows, x if dD_rows is None else dD_rows, dh0,
            batch, seq_len, channels, state_size, chunk, n_chunks,
            **_flags(D, z, keep), BLOCK_D=block_d, BLOCK_N=block_n,
        )  # fmt: skip
    dD = None if dD_rows is None else dD_rows.sum(0)
    return dx, ddelta, dA_rows.sum(0), dB_parts.sum(0), dC_parts.sum(0), dD, dz, dh0


def _forward_fake(x, delta, A, B, C, D, z, h0, keep, chunk, block_d):
    batch, seq_len, channels = x.shape
    state_size = A.shape[1]
    n_chunks = -(-seq_len // chunk)
    return torch.empty_like(x), x.new_empty(batch, n_chunks, channels, state_size), torch.empty_like(h0)


def _forward_launch(
    x: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    h0: torch.Tensor,
    keep: torch.Tensor | None,
    chunk: int,
    block_d: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, the state before every chunk, the final state) of contiguous float32 inputs: x, delta (Bt, T, E);
    A (E, N); B, C (Bt, T, N); D (E,) or None; z (Bt, T, E) or None; h0 (Bt, E, N); keep = 1 − resets (Bt, T)."""
    return _launch_forward(x, delta, A, B, C, D, z, h0, keep, chunk, block_d)


def _backward_fake(x, delta, A, B, C, D, z, keep, starts, dy, dfinal, chunk, block_d):
    absent = x.new_empty(0)
    dD = absent if D is None else torch.empty_like(D)
    dz = absent if z is None else torch.empty_like(z)
    like = (x, delta, A, B, C)
    return [*(torch.empty_like(t) for t in like), dD, dz, torch.empty_like(dfinal)]


def _backward_launch(
    x: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    keep: torch.Tensor | None,
    starts: torch.Tensor,
    dy: torch.Tensor,
    dfinal: torch.Tensor,
    chunk: int,
    block_d: int,
) -> list[torch.Tensor]:
    """Gradients of x, Δ, A, B, C, D, z and h0; an absent D or z gets an empty tensor (an operator returns tensors)."""
    grads = _launch_backward((x, delta, A, B, C, D, z, keep, starts), dy, dfinal, chunk, block_d)
    return [x.new_empty(0) if g is None else g for g in grads]


def _save_for_backward(ctx, inputs, output):
    x, delta, A, B, C, D, z, _, keep, chunk, block_d = inputs
    ctx.save_for_backward(x, delta, A, B, C, D, z, keep, output[1])  # output[1]: the state before each chunk
    ctx.config = (chunk, block_d, D is not None, z is not None)


def _backward(ctx, dy, _dstarts, dfinal):
    chunk, block_d, has_d, has_z = ctx.config
    dx, ddelta, dA, dB, dC, dD, dz, dh0 = _SCAN_BACKWARD(
        *ctx.saved_tensors, dy.contiguous(), dfinal.contiguous(), chunk, block_d
    )
    return dx, ddelta, dA, dB, dC, dD if has_d else None, dz if has_z else None, dh0, None, None, None


_SCAN_BACKWARD = opaque_op("selective_scan_triton_backward", _backward_launch, _backward_fake)
# (y, the state before each chunk (Bt, nC, E, N), the final state) with gradients; double backward unsupported
_SCAN = opaque_op(
    "selective_scan_triton", _forward_launch, _forward_fake, backward=_backward, setup_context=_save_for_backward
)


def _float32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.to(torch.float32).contiguous()


@float32_math
def selective_scan_triton(
    x: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
    chunk_size: int = CHUNK_SIZE,
    resets: torch.Tensor | None = None,
    *,
    block_d: int = BLOCK_D,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`ssmhub.ops.selective_scan.selective_scan` by the fused Triton kernels (Mamba §3.2-3.3), with gradients.

    Args:
        x, delta, A, B, C, D, z, initial_state, return_final_state, resets: exactly as for ``selective_scan``:
            x, Δ (≥ 0, 0 = padding), z (Bt, T, E); A (E, N) ≤ 0; B, C (Bt, T, N); D (E,); initial_state
            (Bt, E, N); resets (Bt, T) bool, where True the state restarts from zero before step t.
        chunk_size: time steps between the states the forward saves for the backward, which recomputes one
            chunk at a time (memory O(Bt·E·N·(T / chunk_size + chunk_size)) besides the inputs).
        block_d: channels per program, a power of two.

    Returns:
        ``(y, final_state)``: y (Bt, T, E) in x's dtype; final_state (Bt, E, N) float32 with
        ``return_final_state``, else None. Computes in float32 whatever the input dtype (float64 inputs too),
        autocast off. Raises ValueError when the device cannot run Triton (see :func:`can_run_selective_scan`).
    """
    batch, seq_len, channels, state_size = _check_args(x, delta, A, B, C, D, z, initial_state, resets)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int; got {chunk_size!r}")
    if isinstance(block_d, bool) or not isinstance(block_d, int) or block_d < 1 or block_d & (block_d - 1):
        raise ValueError(f"block_d must be a power of two; got {block_d!r}")
    usable, reason = can_run_selective_scan(x.device)
    if not usable:
        raise ValueError(f"selective_scan_triton cannot run this call: {reason}")
    if initial_state is None:
        h0 = x.new_zeros(batch, channels, state_size, dtype=torch.float32)
    else:
        h0 = _float32(initial_state)
    keep = None if resets is None else (~resets).to(torch.float32).contiguous()  # (Bt, T): 1 − r_t
    inputs = [_float32(t) for t in (x, delta, A, B, C, D, z)]
    y, _, final = _SCAN(*inputs, h0, keep, min(chunk_size, seq_len), block_d)
    return y.to(x.dtype), (final if return_final_state else None)
