"""The options of a learned long convolution (long-conv paper, arXiv 2302.06646 §3.1-3.2, Alg. 1), defined
once: ``H3Options`` extends them and ``H3Config`` inherits them.

No ``from __future__ import annotations`` here: a config built on these fields checks their types.
"""

from dataclasses import dataclass, field

from ..ops.butterfly import BLOCK_SIZES, DEFAULT_BLOCK_SIZE
from ..ops.fftconv import BACKENDS
from ..ops.longconv import GEOMETRIC_CONVENTIONS, PAPER_ORDER, REGULARIZERS, SMOOTH_DOMAINS
from .options import MixerOptions, check_choice, check_integer, check_positive

__all__ = ["KERNEL_INITS", "LongConvOptions"]

KERNEL_INITS = ("geometric", "random", "conv")


@dataclass
class LongConvOptions(MixerOptions):
    """Options of :class:`~ssmhub.layers.longconv.LongConvKernel`: its init, its regularizers, its FFT backend.

    Args:
        kernel_init: ``"geometric"`` (§3.1 "Geom"/"Exp" decay, the LM runs, default), ``"random"`` or
            ``"conv"`` (``U(±1/√L_max)``, torch's Conv1d default, which the H3 code uses for its shift SSM).
        kernel_init_std: scale of the init (None: 0.02 geometric, 0.002 random, as safari; for ``"conv"`` the
            uniform bound 1/√L_max).
        geometric_convention: ``"paper"`` (§3.1 formula, default) or ``"code"`` (safari's ``double_exp``).
        kernel_dropout: elementwise dropout on the kernel taps in training, in [0, 1) (Table 17, OWT: 0).
        smooth_width: p of the Smooth operator, average pooling of width 2p+1 (0 = off, the paper's final
            choice; safari's window 7 is p = 3).
        smooth_domain: ``"time"`` (§3.1) or ``"frequency"`` (App. B.1).
        squash_lambda: λ of Squash, ``sign(K)·max(|K|−λ, 0)`` (0 = off; Table 17, OWT: 0.001).
        kernel_regularization_order: order of ``"dropout"``, ``"smooth"``, ``"squash"``, each at most once
            (default Algorithm 1: dropout → smooth → squash; safari applies smooth → squash → dropout).
        fft_backend: who computes the FFT convolutions: ``"torch"`` (``torch.fft``, default), ``"butterfly"``
            (FlashButterfly's Butterfly matmuls, §3.2), ``"triton"`` (the fused kernel) or ``"auto"``; all give
            the same numbers (:func:`ssmhub.ops.fftconv.fft_conv`), and a backend that cannot take a call falls
            back with a one-time warning.
        butterfly_block_size: r, the Butterfly block size (a power of two in 2 … 256; the paper's Tables 3 and
            12 sweep 2 … 256, 16 matches a Tensor Core tile).
    """

    kernel_init: str = "geometric"
    kernel_init_std: float | None = None
    geometric_convention: str = "paper"
    kernel_dropout: float = 0.0
    smooth_width: int = 0
    smooth_domain: str = "time"
    squash_lambda: float = 0.0
    kernel_regularization_order: list[str] = field(default_factory=lambda: list(PAPER_ORDER))
    fft_backend: str = "torch"
    butterfly_block_size: int = DEFAULT_BLOCK_SIZE

    def check_options(self, hidden_size: int | None = None) -> None:
        super().check_options(hidden_size)
        name = type(self).__name__
        check_choice(self, "kernel_init", KERNEL_INITS)
        check_choice(self, "geometric_convention", GEOMETRIC_CONVENTIONS)
        check_choice(self, "smooth_domain", SMOOTH_DOMAINS)
        check_choice(self, "fft_backend", BACKENDS)
        check_choice(self, "butterfly_block_size", BLOCK_SIZES)
        check_positive(self, "kernel_init_std", "kernel_dropout", "squash_lambda", allow_zero=True)
        check_integer(self, "smooth_width", minimum=0)
        if not self.kernel_dropout < 1:
            raise ValueError(f"{name}.kernel_dropout must be in [0, 1); got {self.kernel_dropout}")
        order = list(self.kernel_regularization_order)
        if any(step not in REGULARIZERS for step in order) or len(set(order)) != len(order):
            raise ValueError(
                f"{name}.kernel_regularization_order must list distinct names from {REGULARIZERS}; got {order!r}"
            )
