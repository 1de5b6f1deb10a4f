"""The learned, regularized long-convolution kernel of the long-conv paper (Fu et al. 2023, §3.1, Alg. 1).

:class:`LongConvKernel` owns ``K ∈ R^{H×L_max}`` and the skip ``D ∈ R^H`` in a submodule named ``ssm``
(so the model tier keeps them float32, gives them no weight decay and the kernel learning rate), and
turns them into the effective (H, L) kernel of a length-L input: regularize the *whole* L_max kernel
(:func:`ssmhub.ops.longconv.regularize_kernel`), then take its first L taps, zero beyond L_max. Regularizing
before slicing makes the effective kernel independent of L (a prefix of a sequence sees the same taps
as the whole sequence), which causal decoding needs; smoothing the sliced kernel would change the
last taps with L.

:meth:`LongConvKernel.convolve` runs the convolution itself (plus the skip D) with the FFT backend the
kernel was built with (``fft_backend``: torch.fft, FlashButterfly's Butterfly matmuls, Triton; the same
numbers), or, with ``learned_butterfly=True``, through :class:`LearnedButterflyConv`: the learned Butterfly
extension of §3.2.1, whose r×r DFT blocks are parameters per head, initialized at the DFT.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.butterfly import (
    DEFAULT_BLOCK_SIZE,
    TRANSFORMS,
    ButterflyBlocks,
    butterfly_conv,
    butterfly_plan,
    check_block_size,
    dft_blocks,
)
from ..ops.fftconv import fft_size
from ..ops.longconv import (
    causal_conv,
    geometric_decay_init,
    random_init,
    regularize_kernel,
)
from ..ops.precision import float32_math
from .initial_values import fill_initial_values
from .longconv_options import LongConvOptions
from .memo import can_keep, kept, tensor_versions

__all__ = [
    "ButterflyBlockParameters",
    "LearnedButterflyConv",
    "LongConvKernel",
    "LongConvOptions",
    "LongConvParameters",
]

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
        options: LongConvOptions,
        use_skip: bool = True,
    ):
        super().__init__()
        self.num_channels, self.max_kernel_length = num_channels, max_kernel_length
        self.kernel_init, self.kernel_init_std = options.kernel_init, options.kernel_init_std
        self.geometric_convention = options.geometric_convention
        self.kernel = nn.Parameter(torch.empty(num_channels, max_kernel_length))
        self.skip = nn.Parameter(torch.empty(num_channels)) if use_skip else None
        fill_initial_values(self)

    def initial_parameter_values(self, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """Fresh initial values of every parameter, keyed by name."""
        channels, length = self.num_channels, self.max_kernel_length
        if self.kernel_init == "geometric":
            std = DEFAULT_INIT_STD["geometric"] if self.kernel_init_std is None else self.kernel_init_std
            kernel = geometric_decay_init(channels, length, std, self.geometric_convention, generator=generator)
        elif self.kernel_init == "random":
            std = DEFAULT_INIT_STD["random"] if self.kernel_init_std is None else self.kernel_init_std
            kernel = random_init(channels, length, std, generator=generator)
        else:
            bound = 1.0 / math.sqrt(length) if self.kernel_init_std is None else self.kernel_init_std * math.sqrt(3.0)
            kernel = (torch.rand(channels, length, generator=generator) * 2 - 1) * bound
        values = {"kernel": kernel}
        if self.skip is not None:
            values["skip"] = torch.randn(channels, generator=generator)
        return values


class ButterflyBlockParameters(nn.Module):
    """The learned Butterfly blocks of one long convolution: per transform and block size f, a parameter
    ``{transform}_{f}`` of shape (H, f, f, 2) (real, imaginary), initialized at the DFT block F_f (the
    conjugate F̄_f for the inverse, ``output``). Named ``ssm`` by its owner so the model tier keeps it float32
    and gives it no weight decay, like the kernel itself."""

    def __init__(self, num_heads: int, factors: tuple[int, ...], transforms: tuple[str, ...]):
        super().__init__()
        self.num_heads, self.factors, self.transforms = num_heads, tuple(factors), tuple(transforms)
        for name, value in self.initial_parameter_values().items():
            self.register_parameter(name, nn.Parameter(value))

    def initial_parameter_values(self, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """The DFT blocks (the generator is unused: the init is deterministic)."""
        values = {}
        for transform in self.transforms:
            blocks = dft_blocks(self.num_heads, self.factors, inverse=transform == "output")
            for size, block in blocks.items():
                values[f"{transform}_{size}"] = torch.view_as_real(block).contiguous()  # (H, f, f, 2)
        return values

    def blocks(self) -> ButterflyBlocks:
        """The parameters as complex (H, f, f) blocks per transform (views: gradients flow to the parameters)."""
        fields = {}
        for transform in self.transforms:
            fields[transform] = {
                size: torch.view_as_complex(self.get_parameter(f"{transform}_{size}").float().contiguous())
                for size in sorted(set(self.factors))
            }
        return ButterflyBlocks(**fields)


class LearnedButterflyConv(nn.Module):
    """FlashButterfly with learned Butterfly blocks, long-conv paper §3.2.1.

    The FFT convolution of :func:`~ssmhub.ops.butterfly.butterfly_conv` with its r×r DFT blocks replaced by
    parameters, one set per head (H), shared by every stage of the same size (as safari's ``BlockFFT``).
    The twiddles, the real-input untangle and the FFT size stay fixed, so the FLOPs are those of the fixed
    Butterfly, and at initialization (DFT blocks) the output *is* the FFT convolution (float32 round-off).
    Extra parameters: ``2·H·Σ_f f²`` real numbers per learned transform (f the distinct stage sizes;
    :attr:`num_extra_parameters`), i.e. the paper's O(H r²).

    Once the blocks move away from the DFT the map is a learned linear (Monarch-like) operator, no longer a
    convolution: it is not causal and has no recurrent state. The paper uses it for classification (sCIFAR,
    Table 12); a causal language model should keep the fixed transform.

    Args:
        num_heads: H, the channels of the convolution (one kernel and one set of blocks each).
        max_length: the longest input. The FFT size is fixed to ``n = fft_size(2·max_length)`` so that the
            learned blocks have fixed sizes; shorter inputs are zero padded to it (still exact at init).
        block_size: r, a power of two in 2 … 256 (Table 12: 16, 32, 256).
        learn: which transforms get learned blocks, from ``("input", "kernel", "output")``: the forward
            transform of u, of the kernel, and the inverse. Default ``("input", "output")``: a learned
            transform of the (already free) kernel adds no expressivity; safari learns ``input`` and ``kernel``.
        chunk_size: three-pass chunk l in real samples (see ``butterfly_conv``); None: single pass.
    """

    def __init__(
        self,
        num_heads: int,
        max_length: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        learn: tuple[str, ...] = ("input", "output"),
        chunk_size: int | None = None,
    ):
        super().__init__()
        for name, value in (("num_heads", num_heads), ("max_length", max_length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {value!r}")
        check_block_size(block_size)
        learn = tuple(learn)
        if not learn or any(t not in TRANSFORMS for t in learn) or len(set(learn)) != len(learn):
            raise ValueError(f"learn must list distinct transforms from {TRANSFORMS}; got {learn!r}")
        self.num_heads, self.max_length, self.block_size = num_heads, max_length, block_size
        self.chunk_size, self.fft_size = chunk_size, max(2, fft_size(2 * max_length))
        plan = butterfly_plan(self.fft_size // 2, block_size, None if chunk_size is None else chunk_size // 2)
        self.ssm = ButterflyBlockParameters(num_heads, plan.factors, learn)

    @property
    def num_extra_parameters(self) -> int:
        """Real parameters added over the fixed Butterfly."""
        return sum(p.numel() for p in self.ssm.parameters())

    @float32_math
    def forward(
        self,
        u: torch.Tensor,
        kernel: torch.Tensor,
        kernel_backward: torch.Tensor | None = None,
        skip: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``butterfly_conv(u, kernel, kernel_backward)`` with the learned blocks, plus ``skip ⊙ u``.

        u: (…, H, L) with L <= max_length; kernel: (H, K); kernel_backward: optional (H, K'); skip: optional
        (H,). Returns (…, H, L) float32.
        """
        if u.dim() < 2 or u.shape[-2] != self.num_heads:
            raise ValueError(f"u must have shape (..., {self.num_heads}, L); got {tuple(u.shape)}")
        if u.shape[-1] > self.max_length:
            raise ValueError(
                f"LearnedButterflyConv was built for inputs of at most max_length={self.max_length} positions "
                f"(its FFT size is fixed to {self.fft_size}); got length {u.shape[-1]}"
            )
        y = butterfly_conv(
            u.float(),
            kernel,
            kernel_backward,
            block_size=self.block_size,
            chunk_size=self.chunk_size,
            n=self.fft_size,
            blocks=self.ssm.blocks(),
        )
        if skip is not None:
            y = y + skip.float()[:, None] * u.float()
        return y

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, max_length={self.max_length}, block_size={self.block_size}, "
            f"fft_size={self.fft_size}, learn={self.ssm.transforms}"
        )


class LongConvKernel(nn.Module):
    """A learned long-convolution kernel with Squash/Smooth regularization and kernel dropout.

    Args:
        num_channels: H, the number of independent kernels.
        max_kernel_length: L_max, the number of learned taps; longer inputs are legal (taps beyond
            L_max are zero).
        options: a :class:`~ssmhub.layers.longconv_options.LongConvOptions` (init, regularizers, FFT backend;
            or any options or config holding its fields); ``**values`` override single fields.
        use_skip: learn the skip ``D`` (Algorithm 1 step 4).
        learned_butterfly: run :meth:`convolve` through a :class:`LearnedButterflyConv` (§3.2.1) built for
            inputs of at most ``max_kernel_length`` positions (not causal once trained, no recurrent state).
        learned_butterfly_transforms: which transforms it learns (its ``learn``).
    """

    def __init__(
        self,
        num_channels: int,
        max_kernel_length: int,
        options: LongConvOptions | None = None,
        *,
        use_skip: bool = True,
        learned_butterfly: bool = False,
        learned_butterfly_transforms: tuple[str, ...] = ("input", "output"),
        **values,
    ):
        super().__init__()
        options = LongConvOptions.take(options, **values)
        options.check_options()
        for name, value in (("num_channels", num_channels), ("max_kernel_length", max_kernel_length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {value!r}")
        self.num_channels, self.max_kernel_length = num_channels, max_kernel_length
        self.kernel_dropout, self.smooth_width = float(options.kernel_dropout), options.smooth_width
        self.smooth_domain, self.squash_lambda = options.smooth_domain, float(options.squash_lambda)
        self.kernel_regularization_order = tuple(options.kernel_regularization_order)
        self.ssm = LongConvParameters(num_channels, max_kernel_length, options, use_skip)
        self.fft_backend, self.butterfly_block_size = options.fft_backend, options.butterfly_block_size
        self.butterfly = None
        if learned_butterfly:
            self.butterfly = LearnedButterflyConv(
                num_channels, max_kernel_length, self.butterfly_block_size, learn=tuple(learned_butterfly_transforms)
            )

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
        settings = (self.squash_lambda, self.smooth_width, self.smooth_domain, self.kernel_regularization_order)

        def build():
            return regularize_kernel(
                weight.float(),
                self.kernel_regularization_order,
                squash_lambda=self.squash_lambda,
                smooth_width=self.smooth_width,
                smooth_domain=self.smooth_domain,
                dropout=self.kernel_dropout,
                training=self.training,
            )

        if self.training or not can_keep():  # dropout draws anew; a graph must not be kept
            return build()
        return kept(self, "_memo", (tensor_versions([weight]), settings), build)

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

    def convolve(
        self,
        u: torch.Tensor,
        initial_state: torch.Tensor | None = None,
        return_final_state: bool = False,
        state_length: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``y = K ∗ u + D ⊙ u`` on (…, H, L) inputs (Algorithm 1 step 4) with this kernel's FFT backend.

        Without a learned Butterfly this is :func:`~ssmhub.ops.longconv.causal_conv` with the effective
        (H, L) kernel (``initial_state`` / ``return_final_state`` / ``state_length`` as there). With one it is
        :class:`LearnedButterflyConv`, which has no recurrent state (a ValueError if one is asked for).
        """
        if self.butterfly is not None:
            if initial_state is not None or return_final_state:
                raise ValueError(
                    "a learned Butterfly convolution has no recurrent state: once its blocks leave the DFT it is "
                    "not a convolution (long-conv paper §3.2.1); use learned_butterfly=False to decode"
                )
            return self.butterfly(u, self(self.max_kernel_length), skip=self.skip), None
        return causal_conv(
            u,
            self(self.max_kernel_length),
            self.skip,
            initial_state=initial_state,
            return_final_state=return_final_state,
            state_length=state_length,
            backend=self.fft_backend,
            block_size=self.butterfly_block_size,
        )

    def extra_repr(self) -> str:
        return (
            f"num_channels={self.num_channels}, max_kernel_length={self.max_kernel_length}, "
            f"squash_lambda={self.squash_lambda}, smooth_width={self.smooth_width}, "
            f"kernel_dropout={self.kernel_dropout}, order={self.kernel_regularization_order}"
        )
