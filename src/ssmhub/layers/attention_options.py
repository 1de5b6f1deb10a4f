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
        attention_window: None (the default, H3's attention, arXiv 2212.14052 §3.4): each token attends to
            every earlier token of its sequence, and the cache keeps all their keys and values. An integer W:
            each token attends to the last W tokens, itself included (sliding-window attention), in every
            forward, and the cache keeps only the last W − 1 keys and values, so a hybrid's memory stays flat
            in the context, as a recurrent layer's does: what evaluating a whole book statefully needs
            (``ssmhub-eval --stateful --attention_window W``). Results equal full attention while a sequence
            is at most W tokens long.
    """

    num_attention_heads: int = 12
    attention_dropout: float = 0.0
    attention_window: int | None = None

    def has_attention(self) -> bool:
        """Whether these options build an attention layer (a hybrid config without one says False, and the
        heads need not divide its width)."""
        return True

    def check_options(self, hidden_size: int | None = None) -> None:
        super().check_options(hidden_size)
        name = type(self).__name__
        check_integer(self, "num_attention_heads", "attention_window")
        check_positive(self, "attention_dropout", allow_zero=True)
        if not self.attention_dropout < 1:
            raise ValueError(f"{name}.attention_dropout must be in [0, 1); got {self.attention_dropout}")
        if hidden_size is not None and self.has_attention() and hidden_size % self.num_attention_heads:
            raise ValueError(
                f"{name}.num_attention_heads ({self.num_attention_heads}) must divide "
                f"{self.width_name()} ({hidden_size})"
            )
