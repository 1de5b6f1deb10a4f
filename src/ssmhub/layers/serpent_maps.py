"""The small learned maps of a SeRpEnt resampling branch (arXiv 2501.11729 §4.2, Eq. 12-13).

- :class:`StepProjection`: θ_Δ of Eq. 13, the logit of a token's step Δ_l, computed in float64;
- :class:`DenseWindowMap`: θ_Γ of Eq. 12 as the paper writes it, one dense map of ``⊕_k [x_k, ε_k]``;
- :class:`DepthwiseWindowMap`: the additive layout's θ_Γ, a weight per window slot and channel plus a map of the
  distance features (ours: K·H_b + K·G·H_b parameters in place of K·(H + G)·H_b);
- :class:`BranchOutput`: the additive layout's projection H_b → H of a branch's output, zero at first.

θ_Δ and θ_Γ read their parameters directly (a float64 product; a split of θ_Γ's columns), so they are not
``nn.Linear``: weight-only quantization (``torch.ao.quantization.quantize_dynamic``, torchao's ``quantize_``)
replaces ``nn.Linear`` modules and leaves these float32, as it leaves the recurrence parameters.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .initial_values import fill_initial_values

__all__ = ["BranchOutput", "DenseWindowMap", "DepthwiseWindowMap", "StepProjection", "linear_init_std"]


def _uniform(shape, fan_in: int) -> torch.Tensor:
    """PyTorch's default ``nn.Linear`` init: U(−1/√fan_in, 1/√fan_in)."""
    bound = 1 / math.sqrt(max(fan_in, 1))
    return torch.empty(shape).uniform_(-bound, bound)


def linear_init_std(source) -> float | None:
    """How the model tier initialises a linear map under ``source`` (a model config, or layer options): the std of
    transformers' normal init (``init_scheme="normal"``, a config's default: weights N(0, initializer_range), biases
    0), or None: torch.nn's own defaults (``init_scheme="pytorch"``, or options that carry no init scheme, as a
    layer built outside a model has)."""
    if getattr(source, "init_scheme", None) != "normal":
        return None
    return getattr(source, "initializer_range", None) or 0.02  # what ``PreTrainedModel._init_weights`` takes


class _LinearLike(nn.Module):
    """A ``weight`` (out, in) and ``bias`` (out,) initialised as the ``nn.Linear`` they replace: at construction as
    torch.nn does (``reset_parameters``: Kaiming-uniform weight, U(±1/√in) bias, drawn in that order), and from the
    model tier (``initial_parameter_values``) as the model initialises its ``nn.Linear`` maps (``init_std``, from
    :func:`linear_init_std`: N(0, init_std) weight and zero bias; None: torch.nn's defaults again).

    The scale matters beyond training: θ_Δ's weight sets how far a rounding of x (a bfloat16 model's activations)
    moves each step Δ_l and with it the grid, so a map initialised wider than the model's other linear maps makes
    a half-precision model's branches drift from its float32 run."""

    decayed_parameters = ("weight",)  # weight decay takes it as an nn.Linear's (the model's optimizer groups)

    def __init__(self, out_features: int, in_features: int, init_std: float | None = None):
        super().__init__()
        self.init_std = init_std
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features))
        with torch.no_grad():
            for name, value in self._torch_defaults().items():
                self.get_parameter(name).copy_(value)

    def _torch_defaults(self) -> dict[str, torch.Tensor]:
        weight = nn.init.kaiming_uniform_(torch.empty(self.weight.shape), a=math.sqrt(5))  # U(±1/√in)
        return {"weight": weight, "bias": _uniform(self.bias.shape, self.weight.shape[1])}

    def initial_parameter_values(self) -> dict[str, torch.Tensor]:
        if self.init_std is None:
            return self._torch_defaults()
        weight = torch.empty(self.weight.shape).normal_(0.0, self.init_std)
        return {"weight": weight, "bias": torch.zeros(self.bias.shape)}


class StepProjection(_LinearLike):
    """θ_Δ of Eq. 13: x (..., H) -> the gate's logit (...) float64, ``weight`` (1, H) and ``bias`` (1,) named and
    initialised as the ``nn.Linear(H, 1)`` they replace (checkpoints keep their keys; ``init_std``: see
    :class:`_LinearLike`).

    A streamed token must get the very float32 Δ_l the parallel pass gives it, or the two clocks drift apart and
    cross grid points at different tokens. So θ_Δ·x is a float64 product and sum along H per token, not a matmul
    (whose rounding depends on how many tokens the call holds)."""

    def __init__(self, hidden_size: int, init_std: float | None = None):
        super().__init__(1, hidden_size, init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.double() * self.weight[0].double()).sum(-1) + self.bias.double()  # (...)


class DenseWindowMap(_LinearLike):
    """θ_Γ of Eq. 12 (the concatenated layout): window inputs (..., K, W) and distance features (..., K, G) ->
    x̄ (..., H_b) = W_Γ ⊕_k [x_k, ε_k] + b, ``weight`` (H_b, K·(W + G)) and ``bias`` (H_b,) named and initialised
    as the ``nn.Linear`` they replace (``init_std``: see :class:`_LinearLike`). Its columns are split into those
    that read inputs and those that read features, so that the (..., K, W + G) window is never concatenated (a
    copy K times the size of x)."""

    def __init__(
        self, window: int, input_size: int, num_features: int, branch_size: int, init_std: float | None = None
    ):
        super().__init__(branch_size, window * (input_size + num_features), init_std)
        self.window, self.input_size, self.branch_size = window, input_size, branch_size

    def forward(self, inputs: torch.Tensor, features: torch.Tensor, linear=F.linear) -> torch.Tensor:
        """``linear``: how ``x Wᵀ + b`` is computed (a decode step: :func:`~ssmhub.layers.stacking.row_linear`)."""
        weight = self.weight.view(self.branch_size, self.window, -1)  # (H_b, K, W + G)
        x_weight = weight[..., : self.input_size].reshape(self.branch_size, -1)  # (H_b, K·W)
        f_weight = weight[..., self.input_size :].reshape(self.branch_size, -1)  # (H_b, K·G)
        y = linear(inputs.flatten(-2), x_weight.to(inputs.dtype), self.bias.to(inputs.dtype))
        return y + linear(features.to(inputs.dtype).flatten(-2), f_weight.to(inputs.dtype))  # (..., H_b)


class DepthwiseWindowMap(nn.Module):
    """θ_Γ of the additive layout: window inputs (..., K, H_b) and distance features (..., K, G) -> x̄ (..., H_b) =
    Σ_k w_k ⊙ x_k + W_ε ⊕_k ε_k + b: a weight per slot and channel (``slot_weight`` (K, H_b), init 1/K, a window
    mean) and a dense map of the K·G distance features (``feature_weight`` (H_b, K·G)), which carry where in time
    each slot's token lies (Eq. 12's ε)."""

    decayed_parameters = ("feature_weight",)  # a matrix, decayed as an nn.Linear's; the slot weights are scales

    def __init__(self, window: int, branch_size: int, num_features: int):
        super().__init__()
        self.slot_weight = nn.Parameter(torch.empty(window, branch_size))
        self.feature_weight = nn.Parameter(torch.empty(branch_size, window * num_features))
        self.bias = nn.Parameter(torch.empty(branch_size))
        fill_initial_values(self)

    def initial_parameter_values(self) -> dict[str, torch.Tensor]:
        window = self.slot_weight.shape[0]
        return {
            "slot_weight": torch.full(self.slot_weight.shape, 1 / window),
            "feature_weight": _uniform(self.feature_weight.shape, self.feature_weight.shape[1]),
            "bias": torch.zeros(self.bias.shape),
        }

    def forward(self, inputs: torch.Tensor, features: torch.Tensor, linear=F.linear) -> torch.Tensor:
        """``linear``: how ``x Wᵀ + b`` is computed (a decode step: :func:`~ssmhub.layers.stacking.row_linear`)."""
        y = (inputs * self.slot_weight.to(inputs.dtype)).sum(-2)  # (..., K, H_b) -> (..., H_b)
        features = features.to(inputs.dtype).flatten(-2)  # (..., K·G)
        return y + linear(features, self.feature_weight.to(inputs.dtype), self.bias.to(inputs.dtype))


class BranchOutput(nn.Linear):
    """The additive layout's H_b → H projection of a resampling branch's output, no bias, zero at first by default
    (``init_std`` 0): a new branch adds nothing until it is trained (a converted Mamba keeps its logits)."""

    def __init__(self, branch_size: int, hidden_size: int, init_std: float = 0.0):
        super().__init__(branch_size, hidden_size, bias=False)
        self.init_std = init_std
        fill_initial_values(self)

    def initial_parameter_values(self) -> dict[str, torch.Tensor]:
        if not self.init_std:
            return {"weight": torch.zeros(self.weight.shape)}
        return {"weight": torch.randn(self.weight.shape) * self.init_std}
