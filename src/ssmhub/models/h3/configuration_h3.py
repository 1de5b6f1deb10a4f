"""Configuration of H3 models with regularized long convolutions (arXiv 2302.06646; H3: arXiv 2212.14052)."""

# no `from __future__ import annotations` here: @strict checks field types only on real annotations
from dataclasses import field

from huggingface_hub.dataclasses import strict

from ...ops.butterfly import BLOCK_SIZES
from ...ops.fftconv import BACKENDS
from ...ops.longconv import PAPER_ORDER
from ..configuration_recurrent import RecurrentLMConfig, check_choice, check_positive

__all__ = ["H3Config", "default_attention_layers"]

REGULARIZERS = ("dropout", "smooth", "squash")
PAPER_DEPTH = 12  # H3-125M of the long-conv paper's language models: 12 layers ...
PAPER_LATE_ATTENTION_LAYER = 8  # ... with attention at layers 1 and 8 (safari ``pile/h3-conv.yaml``)


def default_attention_layers(num_hidden_layers: int) -> list[int]:
    """The H3-125M attention placement, [1, 8] of 12 layers, scaled to ``num_hidden_layers``.

    Attention goes at layer 1 (the second layer, as in the paper's model) and at layer
    ``round(8 · num_hidden_layers / 12)`` (two thirds of the way up); indices outside the stack are
    dropped and a repeat counted once: 1 layer → [], 2 → [1], 3 → [1, 2], 4 → [1, 3], 6 → [1, 4],
    12 → [1, 8], 24 → [1, 16].
    """
    late = round(PAPER_LATE_ATTENTION_LAYER * num_hidden_layers / PAPER_DEPTH)
    return sorted({index for index in (1, late) if 0 <= index < num_hidden_layers})


@strict
class H3Config(RecurrentLMConfig):
    """A stack of H3 layers whose SSMs are learned long convolutions, with optional attention layers.

    The defaults are the H3-125M shape of the long-conv paper's language models (d 768, 12 layers,
    MLP 3072, attention at layers 1 and 8 with 12 heads: safari ``pile/h3-conv.yaml``); at another depth
    the attention layers move with it (``attention_layers`` below).

    Args (besides those of :class:`~ssmhub.models.configuration_recurrent.RecurrentLMConfig`):
        max_kernel_length: L_max, learned taps per long convolution (longer inputs are legal: taps
            beyond L_max are zero).
        ssm_num_heads: heads of the H3 layer; None means head dimension 1 (every H3 config).
        shift_kernel_size: taps of the causal shift convolution on k (H3's shift SSM: 64).
        kernel_init: ``"geometric"`` (§3.1 geometric decay, the LM runs) or ``"random"``.
        kernel_init_std: scale of the kernel init (None: 0.02 geometric, 0.002 random, as safari).
        geometric_convention: ``"paper"`` (§3.1 formula) or ``"code"`` (safari's ``double_exp``).
        kernel_dropout: dropout on the kernel taps in training.
        smooth_width: p of the Smooth regularizer (average pooling of width 2p+1; 0: off).
        smooth_domain: ``"time"`` or ``"frequency"`` (the paper's App. B.1 variant).
        squash_lambda: λ of Squash, ``sign(K)·max(|K|−λ, 0)`` (Table 17, OpenWebText: 0.001).
        kernel_regularization_order: order of ``"dropout"``, ``"smooth"``, ``"squash"`` (default:
            Algorithm 1).
        regularize_shift_kernel: apply the regularizers to the shift kernel too (safari's H3Conv).
        attention_layers: 0-based indices of the layers that are causal self-attention instead of H3.
            None (the default) places them as the paper's 12-layer model does, scaled to
            ``num_hidden_layers`` (:func:`default_attention_layers`: [1, 8] at 12 layers, [1] at 2, [1, 16]
            at 24, none at 1); the placement is fixed when the config is built and saved as a list, so an
            explicit list in a saved ``config.json`` loads unchanged. Changing ``num_hidden_layers`` later
            does not move it: a model built from a config whose list no longer fits raises a ValueError.
        num_attention_heads: heads of those attention layers.
        attention_dropout: attention-probability dropout in training.
        decode_num_modes: set by :meth:`~ssmhub.models.h3.modeling_h3.H3PreTrainedModel.distill_for_decoding`:
            each long convolution is then its fitted modal form with this many modes per head (None: the
            learned kernels, decoded exactly).
        fft_backend: who computes the long convolutions' FFTs: ``"torch"`` (``torch.fft``, default),
            ``"butterfly"`` (FlashButterfly's Butterfly matmuls, long-conv paper §3.2), ``"triton"`` (the
            fused kernel) or ``"auto"``; all give the same numbers (``ssmhub.ops.fftconv.fft_conv``), and
            a backend that cannot take a call falls back with a one-time warning.
        kernel_type: ``"long_conv"`` (the long-conv paper's learned kernels, default) or ``"diagonal_ssm"``
            (the original H3: an S4D diagonal SSM per head, decoded in O(ssm_state_size) per channel).
        ssm_state_size: N, complex modes per head of the diagonal SSM (H3: 64).
        butterfly_block_size: r, the Butterfly block size (a power of two in 2 … 256; the paper's Table 3
            and 12 sweep 2 … 256, 16 matches a Tensor Core tile).

    The learned-Butterfly extension (§3.2.1) is not an H3 option: once its blocks leave the DFT the layer is
    no longer a causal convolution and has no recurrent decode, which a causal LM needs. It lives on the
    long-conv layer (``ssmhub.layers.LongConvKernel(learned_butterfly=True)``, ``LearnedButterflyConv``).
    """

    model_type = "h3"

    hidden_size: int = 768
    num_hidden_layers: int = 12
    intermediate_size: int = 3072
    max_kernel_length: int = 2048
    ssm_num_heads: int | None = None
    shift_kernel_size: int = 4
    kernel_init: str = "geometric"
    kernel_init_std: float | None = None
    geometric_convention: str = "paper"
    kernel_dropout: float = 0.0
    smooth_width: int = 0
    smooth_domain: str = "time"
    squash_lambda: float = 0.001
    kernel_regularization_order: list[str] = field(default_factory=lambda: list(PAPER_ORDER))
    regularize_shift_kernel: bool = False
    attention_layers: list[int] | None = None
    num_attention_heads: int = 12
    attention_dropout: float = 0.0
    decode_num_modes: int | None = None
    fft_backend: str = "torch"
    butterfly_block_size: int = 16
    kernel_type: str = "long_conv"
    ssm_state_size: int = 64

    def __post_init__(self, **kwargs):
        if self.attention_layers is None:
            self.attention_layers = default_attention_layers(self.num_hidden_layers)
        super().__post_init__(**kwargs)

    def check_fields(self) -> None:
        super().check_fields()
        check_positive(
            self, "max_kernel_length", "shift_kernel_size", "num_attention_heads", "ssm_num_heads", "decode_num_modes"
        )
        check_positive(self, "kernel_init_std")
        check_positive(self, "kernel_dropout", "smooth_width", "squash_lambda", "attention_dropout", allow_zero=True)
        check_choice(self, "kernel_init", ("geometric", "random"))
        check_choice(self, "geometric_convention", ("paper", "code"))
        check_choice(self, "smooth_domain", ("time", "frequency"))
        for name in self.kernel_regularization_order:
            if name not in REGULARIZERS:
                raise ValueError(
                    f"H3Config.kernel_regularization_order holds {name!r}; expected names of {REGULARIZERS}"
                )
        self._check_attention_layers()
        if self.attention_layers and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"H3Config.num_attention_heads ({self.num_attention_heads}) must divide hidden_size {self.hidden_size}"
            )
        if self.ssm_num_heads is not None and self.hidden_size % self.ssm_num_heads:
            raise ValueError(
                f"H3Config.ssm_num_heads ({self.ssm_num_heads}) must divide hidden_size ({self.hidden_size})"
            )
        check_choice(self, "fft_backend", BACKENDS)
        check_choice(self, "kernel_type", ("long_conv", "diagonal_ssm"))
        check_positive(self, "ssm_state_size")
        if self.kernel_type == "diagonal_ssm" and self.decode_num_modes is not None:
            raise ValueError("H3Config.decode_num_modes is for distilled long convolutions; a diagonal-SSM H3 is modal")
        if self.butterfly_block_size not in BLOCK_SIZES:
            raise ValueError(
                f"H3Config.butterfly_block_size must be a power of two in {list(BLOCK_SIZES)}; "
                f"got {self.butterfly_block_size}"
            )
        if not self.kernel_dropout < 1:
            raise ValueError(f"H3Config.kernel_dropout must be in [0, 1); got {self.kernel_dropout}")

    def _check_attention_layers(self) -> None:
        if self.attention_layers is None:
            raise ValueError(
                "H3Config.attention_layers must be a list of layer indices; None picks the default placement "
                f"only when the config is built (for {self.num_hidden_layers} layers: "
                f"{default_attention_layers(self.num_hidden_layers)})"
            )
        for index in self.attention_layers:
            if not 0 <= index < self.num_hidden_layers:
                raise ValueError(
                    f"H3Config.attention_layers holds {index}, outside the layers 0..{self.num_hidden_layers - 1} "
                    f"(the default placement for {self.num_hidden_layers} layers is "
                    f"{default_attention_layers(self.num_hidden_layers)})"
                )
