"""The learned, regularized long-convolution kernel of the long-conv paper (Fu et al. 2023, §3.1, Alg. 1).

:class:`LongConvKernel` owns ``K ∈ R^{H×L_max}`` and the skip ``D ∈ R^H`` in a submodule named ``ssm``
(so the model tier keeps them float32, gives them no weight decay and the kernel learning rate), and
turns them into the effective (H, L) kernel of a length-L input: regularize the *whole* L_max kernel
(:func:`ssmhub.ops.longconv.regularize_kernel`), then take its first L taps, zero beyond L_max. Regularizing
before slicing makes the effective kernel independent of L (a prefix of a sequence sees the same taps
as the whole sequence), which causal decoding needs; smoothing the sliced kernel would change the
last taps with L.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.longconv import (
    GEOMETRIC_CONVENTIONS,
    PAPER_ORDER,
    REGULARIZERS,
    SMOOTH_DOMAINS,
    geometric_decay_init,
    random_init,
    regularize_kernel,
)

__all__ = ["KERNEL_INITS", "LongConvKernel", "LongConvParameters"]

KERNEL_INITS = ("geometric", "random", "conv")
DEFAULT_INIT_STD = {"geometric": 0.02, "random": 0.002}  # safari's double_exp and randn scales


class LongConvParameters(nn.Module):
    """The recurrence parameters of one long convolution: ``kernel`` (H, L_max) and ``skip`` D (H,).

    Inits (``kernel_init``): ``"geometric"`` and ``"random"`` as in §3.1 (see
    :func:`~ssmhub.ops.longconv.geometric_decay_init`, :func:`~ssmhub.ops.longconv.random_init`);
    ``"conv"``: ``U(−1/√L_max, 1/√L_max)``, torch's Conv1d default, which the H3 code uses for the
    taps of its shift SSM. ``D ~ 𝒩(0, 1)`` as in the H3 and safari code (``torch.randn(H)``).
    """

    def __init__(
        self,
        num_channels: int,
        max_kernel_length: int,
        kernel_init: str = "geometric",
        init_std: float | None = None,
        geometric_convention: str = "paper",
        use_skip: bool = True,
    ):
        super().__init__()
        if kernel_init not in KERNEL_INITS:
            raise ValueError(f"kernel_init must be one of {KERNEL_INITS}; got {kernel_init!r}")
        if geometric_convention not in GEOMETRIC_CONVENTIONS:
            raise ValueError(
                f"geometric_convention must be one of {GEOMETRIC_CONVENTIONS}; got {geometric_convention!r}"
            )
        if init_std is not None and not (isinstance(init_std, (int, float)) and init_std >= 0):
            raise ValueError(f"init_std must be a number >= 0; got {init_std!r}")
        self.num_channels, self.max_kernel_length = num_channels, max_kernel_length
        self.kernel_init, self.init_std, self.geometric_convention = kernel_init, init_std, geometric_convention
        self.kernel = nn.Parameter(torch.empty(num_channels, max_kernel_length))
        self.skip = nn.Parameter(torch.empty(num_channels)) if use_skip else None
        with torch.no_grad():
            for name, value in self.initial_parameter_values().items():
                self.get_parameter(name).copy_(value)

    def initial_parameter_values(self, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """Fresh initial values of every parameter, keyed by name."""
        channels, length = self.num_channels, self.max_kernel_length
        if self.kernel_init == "geometric":
            std = DEFAULT_INIT_STD["geometric"] if self.init_std is None else self.init_std
            kernel = geometric_decay_init(channels, length, std, self.geometric_convention, generator=generator)
        elif self.kernel_init == "random":
            std = DEFAULT_INIT_STD["random"] if self.init_std is None else self.init_std
            kernel = random_init(channels, length, std, generator=generator)
        else:
            bound = 1.0 / math.sqrt(length) if self.init_std is None else self.init_std * math.sqrt(3.0)
            kernel = (torch.rand(channels, length, generator=generator) * 2 - 1) * bound
        values = {"kernel": kernel}
        if self.skip is not None:
            values["skip"] = torch.randn(channels, generator=generator)
        return values


class LongConvKernel(nn.Module):
    """A learned long-convolution kernel with Squash/Smooth regularization and kernel dropout.

    Args:
        num_channels: H, the number of independent kernels.
        max_kernel_length: L_max, the number of learned taps; longer inputs are legal (taps beyond
            L_max are zero).
        kernel_init: ``"geometric"`` (§3.1 "Geom"/"Exp", default), ``"random"`` or ``"conv"``.
        init_std: std of the init (None: 0.02 geometric, 0.002 random, as safari; for ``"conv"`` the
            uniform bound 1/√L_max).
        geometric_convention: ``"paper"`` (§3.1 formula, default) or ``"code"`` (safari double_exp).
        kernel_dropout: elementwise dropout on the kernel weights, training only.
        smooth_width: p of the Smooth operator, window 2p+1 (0 = off, the paper's final choice;
            safari's window 7 is p = 3).
        smooth_domain: ``"time"`` (§3.1) or ``"frequency"`` (App. B.1).
        squash_lambda: λ of the Squash operator (0 = off).
        regularization_order: order of ``"dropout"``, ``"smooth"``, ``"squash"`` (default Algorithm 1:
            dropout → smooth → squash; safari applies smooth → squash → dropout).
        use_skip: learn the skip ``D`` (Algorithm 1 step 4).
    """

    def __init__(
        self,
        num_channels: int,
        max_kernel_length: int,
        kernel_init: str = "geometric",
        init_std: float | None = None,
        geometric_convention: str = "paper",
        kernel_dropout: float = 0.0,
        smooth_width: int = 0,
        smooth_domain: str = "time",
        squash_lambda: float = 0.0,
        regularization_order: tuple[str, ...] = PAPER_ORDER,
        use_skip: bool = True,
    ):
        super().__init__()
        for name, value in (("num_channels", num_channels), ("max_kernel_length", max_kernel_length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {value!r}")
        if not isinstance(kernel_dropout, (int, float)) or not 0.0 <= kernel_dropout < 1.0:
            raise ValueError(f"kernel_dropout must be in [0, 1); got {kernel_dropout!r}")
        if isinstance(smooth_width, bool) or not isinstance(smooth_width, int) or smooth_width < 0:
            raise ValueError(f"smooth_width must be an integer >= 0; got {smooth_width!r}")
        if not isinstance(squash_lambda, (int, float)) or not math.isfinite(squash_lambda) or squash_lambda < 0:
            raise ValueError(f"squash_lambda must be a finite number >= 0; got {squash_lambda!r}")
        if smooth_domain not in SMOOTH_DOMAINS:
            raise ValueError(f"smooth_domain must be one of {SMOOTH_DOMAINS}; got {smooth_domain!r}")
        order = tuple(regularization_order)
        if any(name not in REGULARIZERS for name in order) or len(set(order)) != len(order):
            raise ValueError(f"regularization_order must list distinct names from {REGULARIZERS}; got {order!r}")
        self.num_channels, self.max_kernel_length = num_channels, max_kernel_length
        self.kernel_dropout, self.smooth_width, self.smooth_domain = float(kernel_dropout), smooth_width, smooth_domain
        self.squash_lambda, self.regularization_order = float(squash_lambda), order
        self.ssm = LongConvParameters(
            num_channels, max_kernel_length, kernel_init, init_std, geometric_convention, use_skip
        )
        self._memo = None  # (key, regularized kernel) outside autograd and training, see full_kernel

    @property
    def skip(self) -> torch.Tensor | None:
        """The skip ``D`` (H,), or None."""
        return self.ssm.skip

    def full_kernel(self) -> torch.Tensor:
        """The regularized (H, L_max) float32 kernel (dropout only in training mode).

        In eval mode outside autograd it is memoized on the parameter's version counter, so decoding
        does not re-smooth the kernel at every token.
        """
        weight = self.ssm.kernel
        cacheable = not self.training and not torch.is_grad_enabled()
        settings = (self.squash_lambda, self.smooth_width, self.smooth_domain, self.regularization_order)
        key = (weight.data_ptr(), weight._version, weight.device, weight.dtype, settings)
        if cacheable and self._memo is not None and self._memo[0] == key:
            return self._memo[1]
        kernel = regularize_kernel(
            weight.float(),
            self.regularization_order,
            squash_lambda=self.squash_lambda,
            smooth_width=self.smooth_width,
            smooth_domain=self.smooth_domain,
            dropout=self.kernel_dropout,
            training=self.training,
        )
        if cacheable:
            self._memo = (key, kernel)
        return kernel

    def forward(self, length: int | None = None) -> torch.Tensor:
        """The effective (H, length) float32 kernel: the first ``length`` regularized taps, zero beyond L_max."""
        if length is None:
            length = self.max_kernel_length
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"length must be an integer >= 1; got {length!r}")
        kernel = self.full_kernel()
        if length <= self.max_kernel_length:
            return kernel[:, :length]
        return F.pad(kernel, (0, length - self.max_kernel_length))

    def extra_repr(self) -> str:
        return (
            f"num_channels={self.num_channels}, max_kernel_length={self.max_kernel_length}, "
            f"squash_lambda={self.squash_lambda}, smooth_width={self.smooth_width}, "
            f"kernel_dropout={self.kernel_dropout}, order={self.regularization_order}"
        )
