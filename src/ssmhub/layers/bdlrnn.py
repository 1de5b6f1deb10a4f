"""The block-diagonal input-dependent LRNN layer (Fan, Chi & Rudnicky, arXiv 2309.07412) as a token mixer.

On an input ``u ∈ R^{B×T×d}`` (already LayerNormed by the block), with ``h = d / b`` blocks of size b:

1. transition ``G_k = W_g2 ReLU(W_g1 u_k + c1) + c2`` reshaped to ``(h, b, b)``, indexed [row i, col j]
   (``A_k = g(u_k)``, Eq. 5, §3.3; the matvec is ``x_i ← Σ_j A[i, j] x_j``);
2. normalisation of each block's columns (Eq. 6), see :func:`normalize_blocks`;
3. input ``v_k = B u_k``: the authors' code uses a 2-layer ReLU MLP d→d→d (``input_map="mlp"``, default),
   the paper a linear map (``input_map="linear"``);
4. ``x_k = A_k x_{k-1} + v_k`` from a learned ``x_0`` (randn init, shared across the batch; zeros with
   ``learned_initial_state=False``), run as a log-depth parallel scan (§3.4, :func:`ssmhub.ops.block_scan`),
   a loop over time (``scan="sequential"``, :func:`ssmhub.ops.block_scan_ref`, faster on CPU) or a
   sequential Triton kernel (``scan="triton"``, :mod:`ssmhub.ops.triton.block_scan`; ``"auto"`` on CUDA);
5. output ``y_k = flatten(x_k) ∈ R^d`` (x_0 excluded; the layer's ``h(·)`` is the identity).

Where the authors' code (github.com/tinghanf/RegluarLRNN, ``BlockModel``) differs from the paper, the code
is the default, since it is what reproduces Table 2: ``norm_mode="code"`` centres every column over its rows
and divides the whole block by its largest column p-norm (no epsilon); ``norm_mode="paper"`` is Eq. 6's
per-column ``v / max(1, ‖v‖_p)`` without centring. ``v_k`` is an MLP in the code, ``B u_k`` in the paper.

Stability (§3.3, Eq. 7): with p = 1 under ``norm_mode="paper"`` every column has 1-norm ≤ 1, a property
closed under products, so ``‖x_k‖_1 ≤ ‖x_0‖_1 + Σ_j ‖v_j‖_1``. For p > 1 (the paper's 1.2) there is no
such guarantee (column 1-norms can reach b^{1-1/p}).

Decoding (:meth:`BDLRNNMixer.step`) is one ``(h, b, b)`` matvec per token (O(h·b²) in the recurrence,
plus the two MLPs). Masked positions (``mask == 0``) use ``A = I`` and ``v = 0``, so they leave the state
exactly unchanged and left-padded rows give the numbers of the unpadded row.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from ..ops.block_norm import normalize_by_largest_column
from ..ops.block_scan import block_scan, block_scan_ref, block_step, restart_blocks
from ..ops.pnorm import vector_p_norm
from ..ops.precision import float32_math
from ..ops.triton import pick_triton
from ..ops.triton.block_scan import block_scan_triton, can_run_block_scan
from .bdlrnn_options import NORM_MODES, BDLRNNOptions
from .initial_values import fill_initial_values
from .mixer import TokenMixer

__all__ = ["BDLRNNMixer", "BDLRNNOptions", "normalize_blocks"]


@float32_math
def normalize_blocks(G: torch.Tensor, p: float, mode: str = "code", eps: float = 0.0) -> torch.Tensor:
    """Turn raw transitions G (..., b, b) [row i, col j] into blocks that satisfy the norm constraint.

    ``mode="code"`` (the authors' code, ``BlockModel``): ``G ← G − mean_i G`` (each column sums to 0),
    then ``A = G / (max_j ‖G[:, j]‖_p + eps)`` per block, so the largest column has p-norm exactly 1
    (for eps = 0). ``mode="paper"`` (Eq. 6): each column ``v ← v / max(1, ‖v‖_p)``, no centring; columns
    already inside the unit p-ball are unchanged (eps is not used).

    Runs with autocast off, in float32 for half-precision G (float64 stays float64).
    """
    if G.dtype in (torch.float16, torch.bfloat16):
        G = G.float()
    if mode == "code":  # centre each column, divide by the largest column p-norm (fused backward)
        return normalize_by_largest_column(G, p, eps)
    if mode == "paper":
        column_norms = vector_p_norm(G, p, dim=-2, keepdim=True)  # (..., 1, b)
        return G / column_norms.clamp_min(1.0)  # v / max(1, ‖v‖_p), Eq. 6
    raise ValueError(f"norm_mode must be one of {NORM_MODES}; got {mode!r}")


class BDLRNNParameters(nn.Module):
    """The recurrence parameters of one layer: the learned initial state ``x_0`` (1, h, b), kept in
    float32 and out of weight decay; ``initial_state`` is None when x_0 is fixed at zero."""

    def __init__(self, num_heads: int, block_size: int, learned_initial_state: bool):
        super().__init__()
        self.num_heads, self.block_size = num_heads, block_size
        self.initial_state = nn.Parameter(torch.empty(1, num_heads, block_size)) if learned_initial_state else None
        fill_initial_values(self)

    def initial_parameter_values(self, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """Fresh values of every parameter, keyed by name: ``x_0 ~ N(0, 1)`` as in the authors' code (``a0``)."""
        if self.initial_state is None:
            return {}
        return {"initial_state": torch.randn(1, self.num_heads, self.block_size, generator=generator)}


class BDLRNNMixer(TokenMixer):
    """Block-diagonal input-dependent LRNN token mixer (Eq. 5-6, §3.3-3.4; :class:`~ssmhub.layers.mixer.TokenMixer`).

    Args:
        hidden_size: d = h·b, the model width (and the state size per sequence).
        options: a :class:`BDLRNNOptions` (or a ``BDLRNNConfig``, which is one); ``**values`` override single
            fields.
    """

    # packed rows at an unpacked row's cost: at a document start Eq. 5 restarts from the learned x_0 (A_k → 0,
    # v_k → v_k + A_k x_0, ops.block_scan.restart_blocks); the oracle is _forward_documents_stepwise
    native_packing = True

    def __init__(self, hidden_size: int, options: BDLRNNOptions | None = None, **values):
        super().__init__()
        options = BDLRNNOptions.take(options, **values)
        options.check_options(hidden_size)
        block_size = options.block_size
        self.hidden_size = hidden_size
        self.block_size = block_size
        self.num_heads = hidden_size // block_size
        self.p_norm = options.p_norm
        self.norm_mode = options.norm_mode
        self.norm_eps = options.norm_eps
        self.input_map = options.input_map
        self.scan = options.scan
        transition_hidden_size = options.transition_hidden_size or hidden_size * block_size
        # g(u) = W_g2 ReLU(W_g1 u + c1) + c2, one b×b block per head (Eq. 5, A_k = g(u_k))
        self.transition = nn.Sequential(
            nn.Linear(hidden_size, transition_hidden_size),
            nn.ReLU(),
            nn.Linear(transition_hidden_size, self.num_heads * block_size * block_size),
        )
        if self.input_map == "mlp":  # the code's v_k = W_v2 ReLU(W_v1 u + c3) + c4
            self.in_proj = nn.Sequential(
                nn.Linear(hidden_size, hidden_size), nn.ReLU(), nn.Linear(hidden_size, hidden_size)
            )
        else:  # the paper's B u_k
            self.in_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.ssm = BDLRNNParameters(self.num_heads, block_size, options.learned_initial_state)

    # ----------------------------------------------------------------------------- transitions
    def transitions(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A, v)`` of every token: x (..., d) -> A (..., h, b, b) normalised, v (..., h, b).

        The MLPs follow autocast; A and v come back in float32 (float64 for float64 inputs). Where
        ``mask`` (same leading shape as x) is 0, A is the identity and v is 0: the state passes unchanged.
        """
        heads, block = self.num_heads, self.block_size
        G = self.transition(x).view(*x.shape[:-1], heads, block, block)  # (..., h, b, b) [row i, col j]
        if mask is not None:  # a masked (zeroed) input can give G = 0, whose normalisation is 0/0: never normalise it
            keep = mask.to(torch.bool)[..., None, None, None]
            G = torch.where(keep, G, torch.eye(block, dtype=G.dtype, device=G.device))
        A = normalize_blocks(G, self.p_norm, self.norm_mode, self.norm_eps)
        v = self.in_proj(x).view(*x.shape[:-1], heads, block)  # (..., h, b)
        v = v.to(A.dtype)
        if mask is not None:
            A = torch.where(keep, A, torch.eye(block, dtype=A.dtype, device=A.device))  # (..., h, b, b)
            v = torch.where(keep[..., 0], v, v.new_zeros(()))  # (..., h, b)
        return A, v

    # ----------------------------------------------------------------------------- state
    def _initial_state(self) -> torch.Tensor | None:
        """x_0 as (1, h, b) float32 (float64 if the layer is), or None for zeros."""
        x0 = self.ssm.initial_state
        if x0 is None:
            return None
        return x0 if x0.dtype == torch.float64 else x0.float()

    def state_layout(self, batch_size: int, dtype=None):
        """``bdlrnn_state``: x_k, (B, h, b) float32 whatever the model dtype (float64 in a float64 layer)."""
        x0 = self._initial_state()
        kind = torch.float32 if x0 is None else x0.dtype
        return {"bdlrnn_state": ((batch_size, self.num_heads, self.block_size), kind)}

    def init_state(self, batch_size: int, device=None, dtype=None) -> dict[str, torch.Tensor]:
        """The state before the first token: x_0 expanded to (B, h, b) float32 (zeros if not learned)."""
        state = super().init_state(batch_size, device, dtype)
        x0 = self._initial_state()
        if x0 is not None:
            state["bdlrnn_state"] = x0.to(device).expand_as(state["bdlrnn_state"]).clone()
        return state

    # ----------------------------------------------------------------------------- forward
    def _forward(self, x, mask, state, return_state, rows=None):
        """x (B, T, d) -> y (B, T, d) in x's dtype: the flattened states x_1..x_T; ``rows``
        (:class:`~ssmhub.layers.packing.PackedRows`) or None: the document starts of packed rows."""
        A, v = self.transitions(x, mask)  # (B, T, h, b, b), (B, T, h, b)
        if rows is not None:
            A, v = restart_blocks(A, v, rows.starts, self._initial_state())
        x0 = state["bdlrnn_state"] if state is not None else self._initial_state()
        if x0 is not None and x0.dtype != A.dtype:
            x0 = x0.to(A.dtype)
        scan = _choose_scan(self.scan, A)
        if scan == "triton":
            states = block_scan_triton(A, v, x0)  # (B, T, h, b)
        elif scan == "parallel":
            states = block_scan(A, v, x0)  # (B, T, h, b)
        else:
            states = _sequential_scan(A, v, x0)  # (B, T, h, b)
        y = states.flatten(2).to(x.dtype)  # (B, T, d)
        return y, ({"bdlrnn_state": states[:, -1]} if return_state else None)

    def _step(self, x_t, state, mask_t):
        """One token: O(h·b²) in the recurrence (plus the two MLPs)."""
        A_t, v_t = self.transitions(x_t, mask_t)  # (B, h, b, b), (B, h, b)
        x0 = state["bdlrnn_state"]
        new_state = block_step(A_t, v_t, x0 if x0.dtype == A_t.dtype else x0.to(A_t.dtype))  # (B, h, b)
        return new_state.flatten(1).to(x_t.dtype), {"bdlrnn_state": new_state}


def _choose_scan(scan: str, A: torch.Tensor) -> str:
    """The scan that runs ``scan`` on blocks A (B, T, h, b, b): ``"auto"`` is the Triton kernel on CUDA where
    :func:`~ssmhub.ops.triton.block_scan.can_run_block_scan` allows it and A is not float64 (the kernel
    computes in float32), else the parallel scan on CUDA and the loop elsewhere; ``"triton"`` raises if it
    cannot run."""
    support = functools.partial(can_run_block_scan, A.device, A.shape[-1])
    fallback = "parallel" if A.is_cuda else "sequential"
    return pick_triton(scan, A, support, fallback=fallback, option="BDLRNNOptions.scan")


@float32_math
def _sequential_scan(A: torch.Tensor, v: torch.Tensor, x0: torch.Tensor | None) -> torch.Tensor:
    """The loop over time, with autocast off so its einsums stay in A's dtype."""
    return block_scan_ref(A, v, x0)
