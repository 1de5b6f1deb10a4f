"""Configuration of H3 models with regularized long convolutions (arXiv 2302.06646; H3: arXiv 2212.14052)."""

# no `from __future__ import annotations` here: @strict checks field types only on real annotations
from huggingface_hub.dataclasses import strict

from ...layers.attention_options import AttentionOptions, default_attention_heads
from ...layers.h3_options import H3Options
from ..configuration_recurrent import RecurrentLMConfig

__all__ = ["H3Config", "default_attention_layers"]

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
class H3Config(RecurrentLMConfig, H3Options, AttentionOptions):
    """A stack of H3 layers whose SSMs are learned long convolutions, with optional attention layers.

    The defaults are the H3-125M shape of the long-conv paper's language models (d 768, 12 layers,
    MLP 3072, attention at layers 1 and 8 with 12 heads: safari ``pile/h3-conv.yaml``); at another depth
    the attention layers move with it (``attention_layers`` below), at another width the heads keep H3-125M's
    width of 64 (``num_attention_heads``).

    Fields: those of :class:`~ssmhub.models.configuration_recurrent.RecurrentLMConfig` (the block stack and
    heads), of :class:`~ssmhub.layers.h3_options.H3Options` (the H3 layer and its long convolution:
    ``max_kernel_length``, ``ssm_num_heads``, ``shift_kernel_size``, ``kernel_init``, ``kernel_init_std``,
    ``geometric_convention``, ``kernel_dropout``, ``smooth_width``, ``smooth_domain``, ``squash_lambda``,
    ``kernel_regularization_order``, ``regularize_shift_kernel``, ``decode_num_modes``, ``fft_backend``,
    ``butterfly_block_size``, ``kernel_type``, ``ssm_state_size``, ``ssm_discretization``) and of
    :class:`~ssmhub.layers.attention_options.AttentionOptions` (``num_attention_heads``,
    ``attention_dropout``, ``attention_window``, ``rotary_emb_dim``, ``rotary_emb_base``, ``rotary_emb_interleaved``),
    each documented and checked there, once; and:

    Args:
        attention_layers: 0-based indices of the layers that are causal self-attention instead of H3.
            None (the default) places them as the paper's 12-layer model does, scaled to
            ``num_hidden_layers`` (:func:`default_attention_layers`: [1, 8] at 12 layers, [1] at 2, [1, 16]
            at 24, none at 1); the placement is fixed when the config is built and saved as a list, so an
            explicit list in a saved ``config.json`` loads unchanged. Changing ``num_hidden_layers`` later
            does not move it: a model built from a config whose list no longer fits raises a ValueError.

    The learned-Butterfly extension (§3.2.1) is not an H3 option: once its blocks leave the DFT the layer is
    no longer a causal convolution and has no recurrent decode, which a causal LM needs. It lives on the
    long-conv layer (``ssmhub.layers.LongConvKernel(learned_butterfly=True)``, ``LearnedButterflyConv``).
    """

    model_type = "h3"
    # a folder saved before ``ssm_discretization`` existed (issue 61) holds a zero-order-hold diagonal SSM
    values_before_field = {"ssm_discretization": "zoh"}

    hidden_size: int = 768
    num_hidden_layers: int = 12
    intermediate_size: int = 3072
    attention_layers: list[int] | None = None

    def __post_init__(self, **kwargs):
        if self.attention_layers is None:
            self.attention_layers = default_attention_layers(self.num_hidden_layers)
        if self.num_attention_heads is None:  # fixed now and saved, as the placement above
            self.num_attention_heads = default_attention_heads(self.hidden_size)
        super().__post_init__(**kwargs)

    def has_attention(self) -> bool:
        return bool(self.attention_layers)

    @property
    def layers_block_type(self) -> list[str]:
        """Each layer's kind, ``"attention"`` or ``"mamba"`` (a recurrent H3 layer): the list a serving engine reads
        off a hybrid's config (vLLM's name for it, as Jamba's config has it). Derived from ``attention_layers``."""
        return ["attention" if idx in self.attention_layers else "mamba" for idx in range(self.num_hidden_layers)]

    def check_fields(self) -> None:
        super().check_fields()
        self._check_attention_layers()

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
