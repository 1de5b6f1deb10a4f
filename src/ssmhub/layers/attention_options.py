"""The options of a causal self-attention layer in a hybrid stack, defined once: ``H3Config`` inherits them.

No ``from __future__ import annotations`` here: a config built on these fields checks their types.
"""

from dataclasses import dataclass

from .options import MixerOptions, check_integer, check_positive

__all__ = ["AttentionOptions"]


@dataclass
class AttentionOptions(MixerOptions):
    """Options of :class:`~ssmhub.layers.attention.CausalSelfAttention`.

    Args:
        num_attention_heads: heads of the attention layers (must divide the width; H3-125M: 12).
        attention_dropout: attention-probability dropout in training, in [0, 1).
    """

    num_attention_heads: int = 12
    attention_dropout: float = 0.0

    def has_attention(self) -> bool:
        """Whether these options build an attention layer (a hybrid config without one says False, and the
        heads need not divide its width)."""
        return True

    def check_options(self, hidden_size: int | None = None) -> None:
        super().check_options(hidden_size)
        name = type(self).__name__
        check_integer(self, "num_attention_heads")
        check_positive(self, "attention_dropout", allow_zero=True)
        if not self.attention_dropout < 1:
            raise ValueError(f"{name}.attention_dropout must be in [0, 1); got {self.attention_dropout}")
        if hidden_size is not None and self.has_attention() and hidden_size % self.num_attention_heads:
            raise ValueError(
                f"{name}.num_attention_heads ({self.num_attention_heads}) must divide "
                f"{self.width_name()} ({hidden_size})"
            )
