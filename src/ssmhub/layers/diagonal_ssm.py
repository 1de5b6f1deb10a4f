"""The diagonal SSM of the original H3 (S4D), as a kernel in modal form.

H3 (Dao, Fu et al. 2022, arXiv 2212.14052 §3.1 and App. A) mixes ``kv`` with a diagonal state-space model
instead of a learned long kernel: per head, ``N`` complex modes with S4D-Lin's initialization
``A_n = −1/2 + iπn`` (Gu et al. 2022, "On the parameterization and initialization of diagonal state space
models", arXiv 2206.11893 §4), a step ``Δ = exp(log_dt)`` with ``log_dt ~ U[log 1e-3, log 1e-1]``, ``B = 1``
and a learned complex ``C``. The continuous SSM is discretized (S4D §3.1, Eq. 5-6) one of two ways:

- ``"bilinear"`` (H3's: its S4D kernel discretizes bilinearly, and no H3 model overrides it):
  ``λ_n = (1 + ΔA_n/2) / (1 − ΔA_n/2)``,  ``B̄_n = Δ / (1 − ΔA_n/2)``;
- ``"zoh"`` (zero-order hold): ``λ_n = exp(ΔA_n)``,  ``B̄_n = (λ_n − 1) / A_n``;

and in both ``K[t] = 2·Re Σ_n C_n B̄_n λ_n^t`` (the factor 2 counts the conjugate half of the spectrum that S4D
leaves implicit: the ``N`` modes here are H3's ``d_state = 2N`` real state dimensions, one mode per conjugate
pair, so H3's ``d_state = 64`` is ``N = 32``). That is exactly a :class:`~ssmhub.ops.modal.ModalKernel` with
poles ``λ_n``, residues ``c_n = 2 C_n B̄_n`` and no direct term. So the layer trains with
:func:`~ssmhub.ops.modal.modal_scan` (an FFT convolution with the materialized kernel) and decodes with
:func:`~ssmhub.ops.modal.modal_step` in O(N) per channel, ``s_t = λ s_{t−1} + u_t``, ``y_t = Re(c·s_t)``, as a
distilled long convolution does; the skip ``D`` is applied by the H3 layer. The parameters live in a submodule
named ``ssm`` (fp32, no weight decay); the discretization maps them to poles and residues in float64.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..ops.modal import ModalKernel, modal_kernel
from .h3_options import DISCRETIZATIONS
from .initial_values import fill_initial_values

__all__ = ["DiagonalSSMKernel", "DiagonalSSMParameters"]


class DiagonalSSMParameters(nn.Module):
    """``log_dt`` (H,), ``log_neg_real`` (H, N) with ``Re A = −exp(·)``, ``imag`` (H, N) = ``Im A``, ``c`` (H, N, 2)
    the real and imaginary parts of C, and the skip ``skip`` D (H,)."""

    def __init__(self, num_heads: int, state_size: int, dt_min: float = 1e-3, dt_max: float = 1e-1):
        super().__init__()
        for name, value in (("num_heads", num_heads), ("state_size", state_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {value!r}")
        if not 0 < dt_min <= dt_max:
            raise ValueError(f"need 0 < dt_min <= dt_max; got dt_min={dt_min}, dt_max={dt_max}")
        self.num_heads, self.state_size, self.dt_min, self.dt_max = num_heads, state_size, dt_min, dt_max
        self.log_dt = nn.Parameter(torch.empty(num_heads))
        self.log_neg_real = nn.Parameter(torch.empty(num_heads, state_size))
        self.imag = nn.Parameter(torch.empty(num_heads, state_size))
        self.c = nn.Parameter(torch.empty(num_heads, state_size, 2))
        self.skip = nn.Parameter(torch.empty(num_heads))
        fill_initial_values(self)

    def initial_parameter_values(self, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """S4D-Lin: ``A_n = −1/2 + iπn``, log-uniform Δ, ``C ~ 𝒩(0, 1/2)`` per part (unit complex variance),
        ``D ~ 𝒩(0, 1)`` (the H3 code's ``torch.randn(H)``)."""
        heads, modes = self.num_heads, self.state_size
        u = torch.rand(heads, generator=generator)
        log_dt = math.log(self.dt_min) + u * (math.log(self.dt_max) - math.log(self.dt_min))
        return {
            "log_dt": log_dt,
            "log_neg_real": torch.full((heads, modes), math.log(0.5)),
            "imag": math.pi * torch.arange(modes, dtype=torch.float32).expand(heads, modes).clone(),
            "c": torch.randn(heads, modes, 2, generator=generator) * math.sqrt(0.5),
            "skip": torch.randn(heads, generator=generator),
        }


class DiagonalSSMKernel(nn.Module):
    """H3's diagonal SSM: its modal form (:meth:`modal`, differentiable) and the kernel it stands for.

    Args:
        num_heads: H, one SSM (and one skip D) per head.
        state_size: N complex modes per head, one per conjugate pair (H3's ``d_state = 64`` is N = 32).
        dt_min, dt_max: range of the log-uniform init of the step Δ.
        discretization: ``"bilinear"`` (H3's default) or ``"zoh"`` (module docstring).
    """

    def __init__(
        self,
        num_heads: int,
        state_size: int = 32,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        discretization: str = "bilinear",
    ):
        super().__init__()
        if discretization not in DISCRETIZATIONS:
            raise ValueError(f"discretization must be one of {DISCRETIZATIONS}; got {discretization!r}")
        self.discretization = discretization
        self.ssm = DiagonalSSMParameters(num_heads, state_size, dt_min, dt_max)

    @property
    def num_heads(self) -> int:
        return self.ssm.num_heads

    @property
    def state_size(self) -> int:
        return self.ssm.state_size

    @property
    def skip(self) -> nn.Parameter:
        return self.ssm.skip

    def discretized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The poles ``λ`` and input weights ``B̄`` (H, N) complex128 of the chosen discretization (module
        docstring), differentiable in the parameters."""
        p = self.ssm
        dt = torch.exp(p.log_dt.double()).unsqueeze(-1)  # (H, 1)
        a = torch.complex(-torch.exp(p.log_neg_real.double()), p.imag.double())  # (H, N)
        dt_a = dt * a  # (H, N)
        if self.discretization == "zoh":
            poles = torch.polar(torch.exp(dt_a.real), torch.remainder(dt_a.imag, 2 * math.pi))
            return poles, (poles - 1) / a
        return (1 + dt_a / 2) / (1 - dt_a / 2), dt / (1 - dt_a / 2)

    def modal(self) -> ModalKernel:
        """The discretized SSM as a :class:`ModalKernel` (float32 tensors that carry gradients), computed in float64:
        ``log|λ|`` and ``arg λ`` (ZOH: ``Δ·Re A`` and ``Δ·Im A`` exactly; bilinear: in ``[0, π]``, as
        ``Im λ = Δ·Im A / |1 − ΔA/2|² ≥ 0``) and ``c = 2·C·B̄``."""
        p = self.ssm
        poles, b_bar = self.discretized()
        if self.discretization == "zoh":  # the exponent itself: no log of a computed modulus
            dt = torch.exp(p.log_dt.double()).unsqueeze(-1)
            log_modulus, phase = -dt * torch.exp(p.log_neg_real.double()), dt * p.imag.double()
        else:
            log_modulus, phase = torch.log(poles.abs()), torch.angle(poles)
        residues = 2 * torch.complex(p.c[..., 0].double(), p.c[..., 1].double()) * b_bar  # (H, N)
        zeros = torch.zeros(p.num_heads, dtype=torch.float32, device=p.c.device)
        return ModalKernel(
            log_modulus=log_modulus.float(),
            phase=phase.float(),
            residues=torch.view_as_real(residues).float(),
            d=zeros,
            relative_error=zeros,
        )

    def forward(self, length: int) -> torch.Tensor:
        """The (H, length) float32 kernel ``K[t] = 2·Re Σ_n C_n B̄_n λ_n^t`` (no skip)."""
        return modal_kernel(self.modal(), length)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, state_size={self.state_size}, discretization={self.discretization!r}"
