"""The options of an H3 layer with a learned long convolution (arXiv 2302.06646 §4; H3: arXiv 2212.14052),
defined once: ``H3Config`` inherits them.

No ``from __future__ import annotations`` here: a config built on these fields checks their types.
"""

from dataclasses import dataclass

from .longconv_options import LongConvOptions
from .options import check_choice, check_integer

__all__ = ["DISCRETIZATIONS", "H3_KERNEL_INITS", "KERNEL_TYPES", "SHIFT_KERNEL_FIELDS", "H3Options"]

KERNEL_TYPES = ("long_conv", "diagonal_ssm")
DISCRETIZATIONS = ("bilinear", "zoh")  # of the diagonal SSM, H3's own first
H3_KERNEL_INITS = ("geometric", "random")  # the long kernel's; "conv" is the shift kernel's own
# The long-convolution options an unregularized shift kernel (H3's shift SSM) takes from the layer's: how its
# convolution is computed. Its init and regularizers are its own (see H3Options.shift_kernel_options).
SHIFT_KERNEL_FIELDS = ("geometric_convention", "fft_backend", "butterfly_block_size")


@dataclass
class H3Options(LongConvOptions):
    """Options of :class:`~ssmhub.layers.h3.H3Mixer`: those of its long convolution
    (:class:`~ssmhub.layers.longconv_options.LongConvOptions`; ``kernel_init`` is ``"geometric"`` or
    ``"random"`` here, and ``squash_lambda`` defaults to 0.001, Table 17's OpenWebText value) and:

    Args:
        max_kernel_length: L_max, learned taps per long convolution (longer inputs are legal: taps beyond
            L_max are zero).
        ssm_num_heads: H heads of size d/H (must divide the width d). None (default) means head dimension 1
            (d heads, every H3 config); a smaller H gives the multi-head outer-product state of the H3 code.
        shift_kernel_size: taps of the causal shift convolution on k (H3's shift SSM: 64; default 4).
        regularize_shift_kernel: give the shift kernel the long kernel's init and regularizers (safari's
            ``H3Conv``) instead of H3's Conv1d init without regularization (see :meth:`shift_kernel_options`
            for which options reach the shift kernel either way).
        decode_num_modes: the layer is distilled, its long convolution a modal fit with this many modes per
            head (set by ``H3PreTrainedModel.distill_for_decoding``; None: the learned kernels, decoded exactly).
        kernel_type: ``"long_conv"`` (the long-conv paper's learned kernels, default) or ``"diagonal_ssm"``
            (the original H3: an S4D diagonal SSM per head, decoded in O(ssm_state_size) per channel;
            ``max_kernel_length`` and the kernel regularizers do not apply to it).
        ssm_state_size: N, complex modes per head of the diagonal SSM, one per conjugate pair: H3's ``d_state``
            counts both members of each pair, so ``ssm_state_size = d_state // 2``, and the default 32 is H3's
            ``d_state = 64`` (poles ``A_n = −1/2 + iπn``, n < 32, as H3 builds them).
        ssm_discretization: how the diagonal SSM is discretized (:mod:`ssmhub.layers.diagonal_ssm`):
            ``"bilinear"`` (default, H3's: ``λ = (1 + ΔA/2)/(1 − ΔA/2)``) or ``"zoh"`` (zero-order hold,
            ``λ = exp(ΔA)``). A diagonal-SSM ``config.json`` saved before this field existed holds a ZOH model and
            loads as ``"zoh"`` (``H3Config.from_dict``).
    """

    squash_lambda: float = 0.001
    max_kernel_length: int = 2048
    ssm_num_heads: int | None = None
    shift_kernel_size: int = 4
    regularize_shift_kernel: bool = False
    decode_num_modes: int | None = None
    kernel_type: str = "long_conv"
    ssm_state_size: int = 32
    ssm_discretization: str = "bilinear"

    def check_options(self, hidden_size: int | None = None) -> None:
        super().check_options(hidden_size)
        name = type(self).__name__
        check_choice(self, "kernel_init", H3_KERNEL_INITS)
        check_choice(self, "kernel_type", KERNEL_TYPES)
        check_choice(self, "ssm_discretization", DISCRETIZATIONS)
        check_integer(self, "max_kernel_length", "ssm_num_heads", "shift_kernel_size", "decode_num_modes")
        check_integer(self, "ssm_state_size")
        if self.kernel_type == "diagonal_ssm" and self.decode_num_modes is not None:
            raise ValueError(f"{name}.decode_num_modes is for distilled long convolutions; a diagonal-SSM H3 is modal")
        if hidden_size is not None and self.ssm_num_heads is not None and hidden_size % self.ssm_num_heads:
            raise ValueError(
                f"{name}.ssm_num_heads ({self.ssm_num_heads}) must divide {self.width_name()} ({hidden_size})"
            )

    def shift_kernel_options(self) -> LongConvOptions:
        """The options of the shift kernel on k (H3's shift SSM, arXiv 2212.14052 §3), chosen here, in one place.

        With ``regularize_shift_kernel`` (safari's ``H3Conv``, long-conv paper arXiv 2302.06646 §4.1.3) it takes
        every long-convolution option of the layer. Without it (H3's shift SSM, the default) it takes only
        :data:`SHIFT_KERNEL_FIELDS` (its FFT backend; ``geometric_convention`` is unused by its init) and is
        otherwise H3's own: ``kernel_init="conv"`` at torch's Conv1d scale ``1/√shift_kernel_size``, whatever
        ``kernel_init_std`` says, and no regularization (``kernel_dropout``, ``smooth_*`` and ``squash_lambda``
        apply to the long kernel only).
        """
        if self.regularize_shift_kernel:
            return LongConvOptions.take(self)
        return LongConvOptions(kernel_init="conv", **{name: getattr(self, name) for name in SHIFT_KERNEL_FIELDS})
