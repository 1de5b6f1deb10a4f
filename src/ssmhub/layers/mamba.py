"""The Mamba mixer (Gu & Dao 2023, arXiv 2312.00752 §3.4, Fig. 3), the SSM inside every SeRpEnt branch.

On an input ``u ∈ R^{B×L×H}`` (already normed by the block) with inner width E, state size N and
time-step rank R, as in the authors' reference code (github.com/state-spaces/mamba, ``mamba_simple.py``),
which takes ``B̄_l = Δ_l B_l`` (Euler) rather than the zero-order hold of SeRpEnt's Eq. 3 (arXiv 2501.11729):

- ``[x, z] = u W_in``                                  (H → 2E)
- ``x ← SiLU(causal depthwise conv1d(x))``              (width ``conv_kernel``, with bias)
- ``[δ, B, C] = x W_x``;  ``Δ = softplus(δ W_dt + b_dt)``  (E → R + 2N, R → E)
- ``h_l = exp(Δ_l A) ⊙ h_{l−1} + Δ_l B_l x_l``,  ``A = −exp(A_log)``  (selective SSM, SeRpEnt Eq. 2 / 8)
- ``y_l = (C_l h_l + D ⊙ x_l) ⊙ SiLU(z_l)``;  output ``y W_out``  (E → output size)

Parameter names and layouts are those of transformers' ``MambaMixer`` (``in_proj``, ``conv1d``,
``x_proj``, ``dt_proj``, ``out_proj``), except that ``A_log`` and ``D`` sit in the ``ssm`` submodule
(ssmhub's rule: recurrence parameters stay float32 and get no weight decay).
:func:`ssmhub.models.serpent.convert_mamba_checkpoint` maps the names.

Padding: a masked position is no token at all. Its input is zeroed before ``in_proj`` and after the
convolution, its Δ is 0 (the SSM state is left exactly unchanged), and the convolution skips it: a real token's
taps meet the k − 1 real tokens before it and the window holds at a pad, in the parallel form
(:func:`~ssmhub.ops.short_conv.causal_depthwise_conv` with ``mask``) and in the step (:func:`mamba_step`). So a row
with pads anywhere (left padding, holes inside it) gives the numbers of the row without them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from ..ops.row_tables import kernel_importable
from ..ops.selective_rows import selective_kernel_available, selective_step_rows_
from ..ops.selective_scan import selective_scan, selective_scan_ref, selective_step
from ..ops.short_conv import causal_depthwise_conv, conv_window
from ..ops.triton import pick_triton
from ..ops.triton.selective_scan import can_run_selective_scan, selective_scan_triton
from ..ops.window_rows import window_step_rows_
from .initial_values import fill_initial_values
from .mamba_options import MambaOptions
from .mixer import TokenMixer
from .stacking import kept_stack, linear_maps, stack

__all__ = ["MambaMixer", "MambaOptions", "MambaStepWeights", "mamba_step", "scan_for", "stack_step_weights"]

_SCAN_FUNCTIONS = {"chunked": selective_scan, "sequential": selective_scan_ref, "triton": selective_scan_triton}


def scan_for(choice: str, x: torch.Tensor):
    """The selective scan that option ``scan`` = ``choice`` runs on inputs like ``x`` (B, L, E): ``"auto"`` is
    the Triton kernel on CUDA tensors where it can run and x is not float64 (it computes in float32), else the
    chunked torch scan (on CPU always); ``"triton"`` raises ValueError where the kernel cannot run."""
    support = functools.partial(can_run_selective_scan, x.device)
    choice = pick_triton(choice, x, support, fallback="chunked", option="MambaOptions.scan")
    return _SCAN_FUNCTIONS[choice]


def _kaiming_uniform_values(module: nn.Module) -> dict[str, torch.Tensor]:
    """PyTorch's default weight init (Kaiming-uniform, a = √5) and a zero bias, as fresh tensors."""
    weight = torch.empty(module.weight.shape)
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    values = {"weight": weight}
    if module.bias is not None:
        values["bias"] = torch.zeros(module.bias.shape)
    return values


class MambaParameters(nn.Module):
    """The recurrence parameters of one mixer: ``A_log`` (E, N) and the skip ``D`` (E,), float32.

    S4D-Real initialization (the reference): ``A = −(1, 2, …, N)`` in every channel, ``D = 1``.
    """

    def __init__(self, intermediate_size: int, state_size: int):
        super().__init__()
        self.A_log = nn.Parameter(torch.empty(intermediate_size, state_size))
        self.D = nn.Parameter(torch.empty(intermediate_size))
        fill_initial_values(self)

    def initial_parameter_values(self) -> dict[str, torch.Tensor]:
        channels, state = self.A_log.shape
        A = torch.arange(1, state + 1, dtype=torch.float32).expand(channels, state)  # (E, N)
        return {"A_log": torch.log(A).contiguous(), "D": torch.ones(channels)}


class TimeStepProjection(nn.Linear):
    """``δ W_dt + b_dt`` (R → E), initialized as in the reference so that ``softplus(b_dt)`` is
    log-uniform in [time_step_min, time_step_max] (floored at time_step_floor) and ``W_dt`` is
    uniform in ±R^(−1/2)·time_step_scale (or that constant)."""

    def __init__(self, rank: int, channels: int, options: MambaOptions):
        super().__init__(rank, channels, bias=True)
        self.time_step_min, self.time_step_max = options.time_step_min, options.time_step_max
        self.time_step_floor, self.time_step_scale = options.time_step_floor, options.time_step_scale
        self.time_step_init_scheme = options.time_step_init_scheme
        fill_initial_values(self)

    def initial_parameter_values(self) -> dict[str, torch.Tensor]:
        std = self.in_features**-0.5 * self.time_step_scale
        if self.time_step_init_scheme == "constant":
            weight = torch.full_like(self.weight, std, dtype=torch.float32, device="cpu")
        else:
            weight = torch.empty(self.weight.shape).uniform_(-std, std)
        log_min, log_max = math.log(self.time_step_min), math.log(self.time_step_max)
        dt = torch.exp(torch.rand(self.out_features) * (log_max - log_min) + log_min).clamp(min=self.time_step_floor)
        inverse_softplus = dt + torch.log(-torch.expm1(-dt))  # softplus(inverse_softplus) = dt
        return {"weight": weight, "bias": inverse_softplus}


class DepthwiseConv(nn.Conv1d):
    """The causal depthwise convolution of width k over the inner channels. It is applied with the
    last k − 1 inputs (the decode state) prepended instead of zero padding, so a forward can continue
    from a cached window. PyTorch's default (Kaiming-uniform) weights and a zero bias, as the reference."""

    def __init__(self, channels: int, kernel_size: int, bias: bool):
        super().__init__(channels, channels, kernel_size, groups=channels, bias=bias)

    def initial_parameter_values(self) -> dict[str, torch.Tensor]:
        return _kaiming_uniform_values(self)


class OutputProjection(nn.Linear):
    """``y W_out`` (E → output size), PyTorch's default Kaiming-uniform init as in the reference."""

    def initial_parameter_values(self) -> dict[str, torch.Tensor]:
        return _kaiming_uniform_values(self)


class MambaMixer(TokenMixer):
    """Mamba token mixer (:class:`~ssmhub.layers.mixer.TokenMixer`).

    Args:
        hidden_size: input width H.
        options: a :class:`MambaOptions` (or a config holding its fields); ``**values`` override single fields.
        output_size: width of the output (None: H). SeRpEnt branches output H / #branches; the inner width
            is ``expand × output_size`` (transformers' ``intermediate_size = expand × hidden_size``).
    """

    # packed rows at an unpacked row's cost: at a document start the short convolution takes no tap from before it
    # and the selective scan restarts from h = 0 (Ā_t → 0); the oracle is _forward_documents_stepwise
    native_packing = True

    def __init__(
        self, hidden_size: int, options: MambaOptions | None = None, *, output_size: int | None = None, **values
    ):
        super().__init__()
        options = MambaOptions.take(options, **values)
        options.check_options(hidden_size)
        self.hidden_size = hidden_size
        self.output_size = output_size or hidden_size
        self.intermediate_size = options.expand * self.output_size
        self.state_size = options.state_size
        self.conv_kernel = options.conv_kernel
        self.time_step_rank = options.time_step_rank or math.ceil(hidden_size / 16)
        self.scan = options.scan
        E, N, R = self.intermediate_size, self.state_size, self.time_step_rank
        self.in_proj = nn.Linear(hidden_size, 2 * E, bias=options.use_bias)
        self.conv1d = DepthwiseConv(E, self.conv_kernel, bias=options.use_conv_bias)
        self.x_proj = nn.Linear(E, R + 2 * N, bias=False)
        self.dt_proj = TimeStepProjection(R, E, options)
        self.out_proj = OutputProjection(E, self.output_size, bias=options.use_bias)
        self.ssm = MambaParameters(E, N)

    # ----------------------------------------------------------------------------- state
    def state_layout(self, batch_size: int, dtype=None):
        """float32 whatever the model dtype: ``conv_state`` (B, E, conv_kernel − 1), the last inputs of the
        convolution, oldest first; ``ssm_state`` (B, E, N)."""
        E = self.intermediate_size
        return {
            "conv_state": ((batch_size, E, self.conv_kernel - 1), torch.float32),
            "ssm_state": ((batch_size, E, self.state_size), torch.float32),
        }

    def conv_state_after(self, x: torch.Tensor, state: dict[str, torch.Tensor], ends: torch.Tensor) -> torch.Tensor:
        """The convolution's window after each row's first ``ends`` (B,) tokens of x (B, L, H), continuing
        ``state``: (B, E, k − 1) float32, what a forward over those tokens alone leaves (and what a forward with the
        mask of those tokens returns: pads leave the window as it was)."""
        u = self.in_proj(x)[..., : self.intermediate_size]  # (B, L, E): the convolution's inputs
        history = state["conv_state"].transpose(1, 2).to(u.dtype)  # (B, k − 1, E)
        return conv_window(history, u, ends=ends).transpose(1, 2).float().contiguous()

    def A(self) -> torch.Tensor:
        """A = −exp(A_log), (E, N) float32."""
        return -torch.exp(self.ssm.A_log.float())

    # ----------------------------------------------------------------------------- pieces
    def _selective_inputs(self, x: torch.Tensor, mask: torch.Tensor | None):
        """Conv output x (..., E) -> (Δ (..., E) float32, B (..., N), C (..., N)); Δ = 0 where masked."""
        time_step, B, C = torch.split(self.x_proj(x), [self.time_step_rank, self.state_size, self.state_size], dim=-1)
        delta = F.softplus(self.dt_proj(time_step).float())  # Δ = softplus(δ W_dt + b_dt)
        if mask is not None:
            delta = delta * mask.unsqueeze(-1).to(delta.dtype)
        return delta, B, C

    def _conv_taps(self) -> torch.Tensor:
        return self.conv1d.weight[:, 0, :]  # (E, k): tap k − 1 meets the newest input

    # ----------------------------------------------------------------------------- forward
    def _forward(self, x, mask, state, return_state, rows=None):
        """x (B, L, H) -> y (B, L, output_size); ``rows`` (:class:`~ssmhub.layers.packing.PackedRows`) or None: the
        document starts of packed rows."""
        batch = x.shape[0]
        starts = None if rows is None else rows.starts  # (B, L) bool
        u, z = self.in_proj(x).chunk(2, dim=-1)  # (B, L, E) each
        if state is None:  # (B, k − 1, E): the inputs before u, oldest first (zeros before the first token)
            history = u.new_zeros(batch, self.conv_kernel - 1, u.shape[-1])
        else:
            history = state["conv_state"].transpose(1, 2).to(u.dtype)
        conv_inputs = u
        # (B, L, E), 0 at pads (the convolution's output there is 0, and SiLU(0) = 0)
        u = F.silu(causal_depthwise_conv(u, self._conv_taps(), self.conv1d.bias, history, starts, mask))
        delta, B, C = self._selective_inputs(u, mask)
        y, ssm_final = scan_for(self.scan, u)(
            u,
            delta,
            self.A(),
            B,
            C,
            D=self.ssm.D,
            z=z,
            initial_state=None if state is None else state["ssm_state"],
            return_final_state=return_state,
            resets=starts,
        )  # (B, L, E), (B, E, N) or None
        out = self.out_proj(y.to(x.dtype))
        if not return_state:
            return out, None
        conv_final = conv_window(history, conv_inputs, starts, mask=mask)  # (B, k − 1, E): pads skipped
        conv_final = conv_final.transpose(1, 2).float().contiguous()  # (B, E, k − 1)
        return out, {"conv_state": conv_final, "ssm_state": ssm_final}

    def _step(self, x_t, state, mask_t):
        """One token, O(E·(N + conv_kernel)) besides the projections: :func:`mamba_step` with R = 1."""
        weights = kept_stack(self, [self], lambda: stack_step_weights([self]))
        y, conv_state, ssm_state = mamba_step(
            weights, x_t[None], state["conv_state"][None], state["ssm_state"][None], mask_t
        )  # (1, B, ...) each
        return y[0], {"conv_state": conv_state[0].contiguous(), "ssm_state": ssm_state[0]}

    @property
    def steps_rows_in_one_pass(self) -> bool:
        """On a CPU with numba, the selective state steps in one pass (:meth:`step_rows_`)."""
        return self.ssm.A_log.device.type == "cpu" and kernel_importable()

    def step_rows_(self, x_t, tables, rows, new, coefficients=None, step=None):
        """:meth:`~ssmhub.layers.mixer.TokenMixer.step_rows_` with the SSM state updated in one pass, in place
        (:func:`~ssmhub.ops.selective_rows.selective_step_rows_`: the decay, the update, the read-out, the skip and
        the gate fused), the convolution's window (k − 1 inputs per channel) likewise
        (:func:`~ssmhub.ops.window_rows.window_step_rows_`). The protocol's
        gather, step and write-back where the kernel cannot run or a gradient is asked for."""
        gradient = torch.is_grad_enabled() and self._gradient_asked(x_t, dict(self.named_parameters()))
        if step is not None or gradient or not selective_kernel_available(tables["ssm_state"]):
            return super().step_rows_(x_t, tables, rows, new, coefficients, step)
        self._check_step_input(x_t)
        w = kept_stack(self, [self], lambda: stack_step_weights([self]))  # A = −exp(A_log) formed once, (1, 1, E, N)
        u, z = self.in_proj(x_t).chunk(2, dim=-1)  # (R, E) each
        taps = w.conv_taps[0, 0].flip(-1)  # (E, k): tap j meets the input j steps back
        bias = None if w.conv_bias is None else w.conv_bias[0, 0]
        u = F.silu(window_step_rows_(tables["conv_state"], rows, new, u, taps, bias=bias)).to(u.dtype)  # (R, E)
        delta, B, C = self._selective_inputs(u, None)  # (R, E) float32, (R, N) each
        y = selective_step_rows_(tables["ssm_state"], rows, new, u, delta, w.A[0, 0], B, C, w.D[0, 0], z)
        return self.out_proj(y.to(x_t.dtype))  # (R, E) -> (R, H_out)

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
            f"state_size={self.state_size}, conv_kernel={self.conv_kernel}, time_step_rank={self.time_step_rank}, "
            f"output_size={self.output_size}, scan={self.scan!r}"
        )


# --------------------------------------------------------------------------------------------- the decode step
class MambaStepWeights(NamedTuple):
    """What a decode step reads of R Mamba mixers of one shape (R = 1: a mixer alone): the projections as maps
    (R, B, in) -> (R, B, out) (:func:`~ssmhub.layers.stacking.linear_maps`: one batched matmul over stacked plain
    weights, or each module itself where it is quantized): in_proj (H -> 2E), x_proj (E -> rank + 2N), dt_proj
    (rank -> E), out_proj (E -> H_out); and stacked tensors: conv_taps (R, 1, E, k), conv_bias (R, 1, E) or None,
    A (R, 1, E, N) float32, D (R, 1, E); rank, the time step's rank."""

    in_proj: Callable[[torch.Tensor], torch.Tensor]
    conv_taps: torch.Tensor
    conv_bias: torch.Tensor | None
    x_proj: Callable[[torch.Tensor], torch.Tensor]
    dt_proj: Callable[[torch.Tensor], torch.Tensor]
    out_proj: Callable[[torch.Tensor], torch.Tensor]
    A: torch.Tensor
    D: torch.Tensor
    rank: int


def stack_step_weights(mixers: list[MambaMixer]) -> MambaStepWeights:
    """The step weights of ``mixers`` (one shape), stacked along a leading dim."""
    return MambaStepWeights(
        in_proj=linear_maps([m.in_proj for m in mixers]),
        conv_taps=stack([m._conv_taps() for m in mixers], middle=True),
        conv_bias=stack([m.conv1d.bias for m in mixers], middle=True),
        x_proj=linear_maps([m.x_proj for m in mixers]),
        dt_proj=linear_maps([m.dt_proj for m in mixers]),
        out_proj=linear_maps([m.out_proj for m in mixers]),
        A=stack([m.A() for m in mixers], middle=True),
        D=stack([m.ssm.D for m in mixers], middle=True),
        rank=mixers[0].time_step_rank,
    )


def conv_silu_step(history, u, taps, bias):
    """A step of the causal depthwise convolution and its SiLU: the last inputs history (..., E, k − 1), oldest first,
    and the new one u (..., E); taps (E, k) broadcasting against the window (tap k − 1 meets u), bias (E,)
    broadcasting against u, or None. Returns (SiLU(conv) (..., E) in u's dtype, the window (..., E, k), newest last)."""
    window = torch.cat([history.to(u.dtype), u.unsqueeze(-1)], dim=-1)  # (..., E, k)
    out = (window * taps.to(u.dtype)).sum(-1)
    if bias is not None:
        out = out + bias.to(u.dtype)
    return F.silu(out), window


def mamba_step(w: MambaStepWeights, x, conv_state, ssm_state, mask_t=None):
    """One token through R Mamba mixers at once (arXiv 2312.00752 §3.4, the formulas of the module docstring).

    Args:
        w: :func:`stack_step_weights` of the mixers. x: (R, B, H) each mixer's input. conv_state: (R, B, E, k − 1),
            the convolution's last inputs, oldest first. ssm_state: (R, B, E, N). mask_t: None or (B,), 0 where the
            token is padding (it then leaves both states unchanged: the window holds, Δ = 0).

    Returns:
        y (R, B, H_out) in x's dtype, conv_state (R, B, E, k − 1) and ssm_state (R, B, E, N) float32.
    """
    u, z = w.in_proj(x).chunk(2, dim=-1)  # (R, B, E) each
    u, window = conv_silu_step(conv_state, u, w.conv_taps, w.conv_bias)  # (R, B, E), (R, B, E, k)
    if mask_t is not None:  # the conv bias made a pad's input nonzero again
        u = u * mask_t[:, None].to(u.dtype)
    state_size = w.A.shape[-1]
    time_step, B, C = torch.split(w.x_proj(u), [w.rank, state_size, state_size], dim=-1)
    delta = F.softplus(w.dt_proj(time_step).float())  # (R, B, E): softplus(δ W_dt + b_dt)
    if mask_t is not None:  # Δ = 0: the pad leaves the SSM state unchanged
        delta = delta * mask_t[:, None].to(delta.dtype)
    y, ssm_state = selective_step(u, delta, w.A, B, C, D=w.D, z_t=z, state=ssm_state)  # (R, B, E), (R, B, E, N)
    y = w.out_proj(y.to(x.dtype))  # (R, B, H_out)
    new_conv_state = window[..., 1:].float()  # (R, B, E, k − 1)
    if mask_t is not None:  # a pad is no input: the window holds
        new_conv_state = torch.where(mask_t[:, None, None] != 0, new_conv_state, conv_state.float())
    return y, new_conv_state, ssm_state
