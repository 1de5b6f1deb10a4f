"""The block-diagonal input-dependent linear recurrence as Triton scans, sequential or chunked, forward and backward.

Paper: Fan, Chi & Rudnicky, "Advancing Regular Language Reasoning in Linear Recurrent Neural Networks"
(arXiv 2309.07412), Eq. 5: ``x_k = A_k x_{k-1} + v_k`` with ``A_k = blockdiag(A_k^(1), ..., A_k^(h))``, b×b blocks,
``A[..., i, j]`` = row i, column j and ``x_i ← Σ_j A[..., i, j] x_j`` (the convention of
:mod:`ssmhub.ops.block_scan`). :func:`block_scan_triton` has the semantics and the return of
:func:`ssmhub.ops.block_scan.block_scan`; the kernels are in :mod:`ssmhub.ops.triton._block_scan_kernels`.

Sequential (``chunk_size=None``, the default): one program per (batch row, group of G heads) walks the T steps
with its state x (b floats per head) in registers, one b×b matvec per step: O(T·h·b²) work, no T×b×b products
formed or written (the parallel scan of §3.4, :func:`~ssmhub.ops.block_scan.block_scan`, composes ``A₂A₁`` pairs,
O(T·h·b³) flops, and keeps about T composed matrices per head for autograd). Its weakness on a GPU is latency:
batch·h/G programs (8·32/2 = 128 on 132 H100 SMs at the benchmark's shape), each a chain of T dependent steps whose
every step waits for a global load (the loads are not software-pipelined: no ``tl.dot`` in the loop).
On an H100 it took 7.6 ms forward + backward at T 4096 (benchmarks/results/gpu.md): ≈ 0.93 µs per step of
2 × 4096 steps, while A (268 MB there) would stream in ≈ 0.08 ms: 2.82× torch's parallel scan, short of 5×.

Chunked (``chunk_size=C``; :func:`block_scan_triton_chunked`, C = :data:`CHUNK_SIZE`): the T steps are cut into
N = ⌈T/C⌉ chunks and each direction runs three launches (the kernels module lists them): every chunk from a zero
state in parallel, forming its end state e_c and its product P_c = A_last ⋯ A_first; a sequential scan of the N − 1
pairs (P_c, e_c) — Eq. 5 one level up, the chunks composing by the §3.4 operator — giving each chunk's carried
state; every chunk again from its carried state, writing the states (the backward: the same in reverse with
transposed blocks, P_c^T = A_first^T ⋯ A_last^T, then dv, dA and dx_0). The arithmetic at the benchmark's shape
(batch 8, h 32, b 8, G 2, T 4096, C 64), not yet measured on a GPU:

- parallelism: 8·16·64 = 8192 programs per chunk pass instead of 128 (12-16 resident per SM at 32-40 registers
  and 4 warps, as compiled for sm_90: 4-5 waves);
- serial chain: 64 + 63 + 64 dependent steps a direction instead of 4096 (≈ 21× shorter);
- work: 2 walks over A a direction instead of 1, plus one b×b product per step in the first forward pass
  (b³ = 512 multiply-adds: ≈ 1 GFLOP in all) and 4 MB of chunk products;
- time, if a step keeps the sequential kernel's ≈ 0.93 µs: a chunk pass is bound by 8·16·4096 program-steps
  over 1600-2100 resident programs, 250-330 steps ≈ 0.25-0.3 ms, the carry scan by 63 steps ≈ 0.06 ms, so
  ≈ 0.6-0.7 ms a direction, ≈ 1.2-1.4 ms forward + backward; bytes (A read 4×, dA written once, the
  (batch, T, h, b) tensors ≈ 7×) ≈ 1.6 GB ≈ 0.5 ms at 3.35 TB/s. Either bound is well under the 4.3 ms that
  5× torch's 21.3 ms allows (a 3× miss on the per-step latency would still meet it).

A chunk's first state is the carry P_c s_{c−1} + e_c, another rounding of the state the chunk before ended on:
the chunked scan agrees with the sequential one within float32 round-off, not bit for bit across chunk ends.
A torch-level chunked path with matrix products inside a chunk (as SSD, GLA and DeltaNet do) does not apply: their
transitions are scalar, diagonal or identity-plus-low-rank, so a chunk's cumulative products have a closed form
(a cumulative sum of logs, a WY form); dense input-dependent b×b blocks have none, and a chunk's prefix products
are themselves a scan (b³ each); the only matrix form, the chunk's (C·b)² lower block-triangular transfer matrix,
costs C/2 times the bytes of A.

Backward (reverse time, custom): with ``g_k = ∂L/∂x_k`` counting every later use of x_k,
``g_k = ∂L/∂states_k + A_{k+1}^T g_{k+1}``, ``∂L/∂v_k = g_k``, ``∂L/∂A_k = g_k x_{k-1}^T`` and
``∂L/∂x_0 = A_1^T g_1`` (1-based as in the paper). x_{k-1} is read from the forward's states, which it
returns anyway, so saving them for backward costs nothing extra (the chunked scan also keeps its N − 1 products).

Padding and document restarts need nothing here: the layer writes them into A and v (A = I, v = 0 at a
masked step leaves the state unchanged; A = 0 restarts it, :func:`~ssmhub.ops.block_scan.restart_blocks`).

Where it runs: CUDA tensors, or CPU tensors when ``TRITON_INTERPRET=1`` is set before the kernels are first
imported (that is how the tests check it without a GPU); see :func:`can_run_block_scan`.
"""

from __future__ import annotations

import importlib
import importlib.util

import torch

from ..block_scan import block_scan_dtype, check_block_scan_inputs
from ..precision import float32_math
from . import kernel_support, launch_device
from .opaque import opaque_op

__all__ = ["CHUNK_SIZE", "MAX_BLOCK_SIZE", "block_scan_triton", "block_scan_triton_chunked", "can_run_block_scan"]

MAX_BLOCK_SIZE = 32  # a (BP, BP) fp32 tile of A per head per step in registers; not tuned on a GPU
CHUNK_SIZE = 64  # steps per program of the chunked scan: ≈ √4096, balancing C in-chunk steps with T/C chunk steps
KERNELS_MODULE = "ssmhub.ops.triton._block_scan_kernels"  # by absolute name: a remote-code bundle lacks it


def can_run_block_scan(device: torch.device | str, block_size: int | None = None) -> tuple[bool, str]:
    """Whether :func:`block_scan_triton` can run on ``device`` (with b = ``block_size``); if not, ``"key: why"``."""
    usable, reason = kernel_support(KERNELS_MODULE, device)
    if not usable:
        return usable, reason
    if block_size is not None and not 1 <= block_size <= MAX_BLOCK_SIZE:
        return False, f"block size: b = {block_size} is outside the kernel's 1 … {MAX_BLOCK_SIZE}"
    return True, ""


def _kernels():
    return importlib.import_module(KERNELS_MODULE)


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _is_power_of_two(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 1 and not n & (n - 1)


def _launch_shape(
    batch: int, heads: int, block: int, heads_per_program: int | None, num_warps: int | None = None
) -> tuple[tuple[int, int], dict]:
    """Grid (batch, ⌈h / G⌉) and the launch keywords: the constexprs B = b, BP = b padded to a power of two, G heads
    per program, and num_warps when given (None: Triton's default, 4)."""
    padded = _next_power_of_two(block)
    if heads_per_program is None:  # about 128 lanes of A per program (one warp's worth of fp32 pairs); untuned
        heads_per_program = max(1, min(_next_power_of_two(heads), 128 // (padded * padded)))
    if not _is_power_of_two(heads_per_program):
        raise ValueError(f"heads_per_program must be a power of two; got {heads_per_program}")
    if num_warps is not None and not (_is_power_of_two(num_warps) and num_warps <= 32):
        raise ValueError(f"num_warps must be None or a power of two from 1 to 32; got {num_warps!r}")
    grid = (batch, -(-heads // heads_per_program))
    return grid, {"B": block, "BP": padded, "G": heads_per_program} | (
        {} if num_warps is None else {"num_warps": num_warps}
    )


def _chunk_length(seq_len: int, chunk_size: int | None) -> int:
    """CHUNK, the steps one program walks: T for the sequential scan (None or C ≥ T), else C."""
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive int or None (one chunk a row); got {chunk_size!r}")
    return seq_len if chunk_size is None else min(chunk_size, seq_len)


def _x0_stride(x0: torch.Tensor | None, heads: int, block: int) -> int:
    return 0 if x0 is None or x0.shape[0] == 1 else heads * block


def _chunk_carries(A, v, x0, chunk, shape) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward passes 1 and 2: the products P (batch, N-1, h, b, b) of every chunk but the last and the states
    s (batch, N-1, h, b) after each of them, N = ⌈T / chunk⌉ > 1."""
    batch, seq_len, heads, block = v.shape
    (_, groups), meta = shape
    n_carries = -(-seq_len // chunk) - 1
    products = A.new_empty(batch, n_carries, heads, block, block)  # (batch, N-1, h, b, b): P_c
    ends = v.new_empty(batch, n_carries, heads, block)  # (batch, N-1, h, b): e_c, each chunk from zero
    kernels = _kernels()
    kernels.block_scan_chunk_fwd_kernel[(batch, groups, n_carries)](A, v, ends, products, seq_len, heads, chunk, **meta)
    carries = torch.empty_like(ends)  # (batch, N-1, h, b): s_c = P_c s_{c-1} + e_c, s_{-1} = x_0
    kernels.block_scan_fwd_kernel[(batch, groups, 1)](
        products, ends, ends if x0 is None else x0, carries, carries, n_carries, heads,
        _x0_stride(x0, heads, block), n_carries, HAS_X0=x0 is not None, **meta,
    )  # fmt: skip
    return products, carries


def _forward(A, v, x0, chunk, shape) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(states (batch, T, h, b), the chunk products P or None) of the float32 contiguous inputs; x0 (batch or 1, h, b)
    or None; chunk = the steps of one program (T: the sequential scan, no products)."""
    batch, seq_len, heads, block = v.shape
    (_, groups), meta = shape
    n_chunks = -(-seq_len // chunk)
    states = torch.empty_like(v)
    with launch_device(v):
        products, carries = _chunk_carries(A, v, x0, chunk, shape) if n_chunks > 1 else (None, v)
        _kernels().block_scan_fwd_kernel[(batch, groups, n_chunks)](
            A, v, v if x0 is None else x0, carries, states, seq_len, heads, _x0_stride(x0, heads, block), chunk,
            HAS_X0=x0 is not None, **meta,
        )  # fmt: skip
    return states, products


def _arriving_gradients(A, products, grad, dx0, chunk, shape) -> torch.Tensor:
    """Backward passes 1 and 2: r (batch, N-1, h, b), the gradient arriving at the end of chunk c from the chunks
    after it (r_c = l_{c+1} + P_{c+1}^T r_{c+1}, l_c: chunk c's own, from a zero carry). ``dx0`` is scratch here."""
    batch, seq_len, heads, block = grad.shape
    (_, groups), meta = shape
    n_carries = products.shape[1]
    handed = grad.new_empty(batch, n_carries, heads, block)  # (batch, N-1, h, b): l_{c+1} at c
    kernels = _kernels()
    kernels.block_scan_chunk_bwd_kernel[(batch, groups, n_carries)](A, grad, handed, seq_len, heads, chunk, **meta)
    arriving = torch.empty_like(handed)  # (batch, N-1, h, b): r_c, the reverse scan of (P, l) one chunk later
    kernels.block_scan_bwd_kernel[(batch, groups, 1)](
        products, handed, handed, handed, handed, products, arriving, dx0, n_carries, heads, 0, n_carries,
        HAS_X0=False, NEED_DA=False, **meta,
    )  # fmt: skip
    return arriving


def _backward(A, states, x0, products, grad, need_dA, chunk, shape):
    """(dA or None, dv, dx0 per row (batch, h, b)) of the scan, by the reverse-time kernels."""
    batch, seq_len, heads, block = states.shape
    (_, groups), meta = shape
    dA = torch.empty_like(A) if need_dA else A  # A: a dummy pointer, never written when NEED_DA is off
    dv = torch.empty_like(states)
    dx0 = states.new_empty(batch, heads, block)
    with launch_device(states):
        arriving = grad if products is None else _arriving_gradients(A, products, grad, dx0, chunk, shape)
        _kernels().block_scan_bwd_kernel[(batch, groups, -(-seq_len // chunk))](
            A, states, states if x0 is None else x0, arriving, grad, dA, dv, dx0, seq_len, heads,
            _x0_stride(x0, heads, block), chunk, HAS_X0=x0 is not None, NEED_DA=need_dA, **meta,
        )  # fmt: skip
    return (dA if need_dA else None), dv, dx0


def _op_shape(v: torch.Tensor, heads_per_program: int, num_warps: int):
    """The launch shape of an operator call: ``num_warps`` 0 stands for None (Triton's default)."""
    batch, _, heads, block = v.shape
    return _launch_shape(batch, heads, block, heads_per_program, num_warps or None)


def _scan_fake(A, v, x0, chunk, heads_per_program, num_warps):
    batch, seq_len, heads, block = v.shape
    n_carries = -(-seq_len // chunk) - 1
    return torch.empty_like(v), A.new_empty(batch, n_carries, heads, block, block) if n_carries else A.new_empty(0)


def _scan_launch(
    A: torch.Tensor, v: torch.Tensor, x0: torch.Tensor | None, chunk: int, heads_per_program: int, num_warps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(states, the chunk products P, empty for one chunk) of float32 contiguous inputs (:func:`_forward`)."""
    states, products = _forward(A, v, x0, chunk, _op_shape(v, heads_per_program, num_warps))
    return states, A.new_empty(0) if products is None else products


def _scan_backward_fake(A, states, x0, products, grad, need_dA, chunk, heads_per_program, num_warps):
    batch, _, heads, block = states.shape
    return [
        torch.empty_like(A) if need_dA else A.new_empty(0),
        torch.empty_like(states),
        states.new_empty(batch, heads, block),
    ]


def _scan_backward_launch(
    A: torch.Tensor,
    states: torch.Tensor,
    x0: torch.Tensor | None,
    products: torch.Tensor,
    grad: torch.Tensor,
    need_dA: bool,
    chunk: int,
    heads_per_program: int,
    num_warps: int,
) -> list[torch.Tensor]:
    """[dA (empty when not needed), dv, dx0 per row (batch, h, b)] (:func:`_backward`)."""
    shape = _op_shape(states, heads_per_program, num_warps)
    dA, dv, dx0 = _backward(A, states, x0, products if products.numel() else None, grad, need_dA, chunk, shape)
    return [A.new_empty(0) if dA is None else dA, dv, dx0]


def _save_for_backward(ctx, inputs, output):
    A, _, x0, chunk, heads_per_program, num_warps = inputs
    ctx.save_for_backward(A, output[0], x0, output[1])  # A, the states, x_0, the chunk products
    ctx.config = (chunk, heads_per_program, num_warps)


def _backward_states(ctx, grad_states, _grad_products):
    A, states, x0, products = ctx.saved_tensors
    need_dA, need_dv, need_dx0 = ctx.needs_input_grad[:3]
    grad = grad_states.float().contiguous()
    dA, dv, dx0 = _SCAN_BACKWARD(A, states, x0, products, grad, need_dA, *ctx.config)
    if x0 is not None and x0.shape[0] == 1:
        dx0 = dx0.sum(0, keepdim=True)  # (1, h, b): a shared x_0 collects every row's gradient
    return (dA if need_dA else None), (dv if need_dv else None), (dx0 if need_dx0 else None), None, None, None


_SCAN_BACKWARD = opaque_op("block_scan_triton_backward", _scan_backward_launch, _scan_backward_fake)
# states = scan(A, v, x0) on float32 contiguous tensors, with the chunk products; double backward unsupported
_SCAN = opaque_op(
    "block_scan_triton", _scan_launch, _scan_fake, backward=_backward_states, setup_context=_save_for_backward
)


@float32_math
def block_scan_triton(
    A: torch.Tensor,
    v: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    *,
    heads_per_program: int | None = None,
    chunk_size: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """All states of ``x_k = A_k x_{k-1} + v_k`` (arXiv 2309.07412 Eq. 5) by the Triton scan.

    Args:
        A: (batch, T, h, b, b) per-token blocks, ``A[..., i, j]`` = row i, column j.
        v: (batch, T, h, b) per-token inputs ``B u_k``.
        initial_state: x_0, (batch, h, b) or (1, h, b) broadcast over the batch; None means zeros.
        heads_per_program: G, heads per Triton program (a power of two; None: about 128 lanes of A each).
        chunk_size: None (default): one program walks a row's T steps (the sequential scan); C: the chunked scan,
            ⌈T / C⌉ programs a row walk C steps each, joined by a scan over the chunks (see the module docstring).
        num_warps: warps per Triton program (a power of two ≤ 32; None: Triton's default, 4). Untuned on a GPU.

    Returns:
        states (batch, T, h, b) = x_1..x_T, as :func:`ssmhub.ops.block_scan.block_scan`: float32 for
        half-precision inputs, the inputs' dtype otherwise, but always *computed* in float32 (a float64 input
        gets float32 accuracy). Differentiable in A, v and initial_state. Raises ValueError when the device
        or b cannot run the kernel (:func:`can_run_block_scan` says why) or an option is out of range.
    """
    check_block_scan_inputs(A, v, initial_state)
    batch, seq_len, heads, block, _ = A.shape
    usable, reason = can_run_block_scan(A.device, block)
    if not usable:
        raise ValueError(f"block_scan_triton cannot run this call: {reason}")
    chunk = _chunk_length(seq_len, chunk_size)
    _, meta = _launch_shape(batch, heads, block, heads_per_program, num_warps)  # options checked before any work
    dtype = block_scan_dtype(A, v, initial_state)
    A32, v32 = A.float().contiguous(), v.float().contiguous()  # (batch, T, h, b, b), (batch, T, h, b)
    x0 = None if initial_state is None else initial_state.float().contiguous()  # (batch or 1, h, b)
    return _SCAN(A32, v32, x0, chunk, meta["G"], num_warps or 0)[0].to(dtype)


def block_scan_triton_chunked(
    A: torch.Tensor,
    v: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    *,
    heads_per_program: int | None = None,
    chunk_size: int = CHUNK_SIZE,
    num_warps: int | None = None,
) -> torch.Tensor:
    """:func:`block_scan_triton` with ``chunk_size`` = :data:`CHUNK_SIZE` by default: the chunked scan."""
    return block_scan_triton(
        A, v, initial_state, heads_per_program=heads_per_program, chunk_size=chunk_size, num_warps=num_warps
    )
