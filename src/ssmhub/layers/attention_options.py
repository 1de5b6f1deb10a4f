"""The options of a causal self-attention layer in a hybrid stack, defined once: ``H3Config`` inherits them.

No ``from __future__ import annotations`` here: a config built on these fields checks their types.
"""

from dataclasses import dataclass

from .options import MixerOptions, check_integer, check_positive

__all__ = ["AttentionOptions", "default_attention_heads"]

ATTENTION_HEAD_DIM = 64  # the head width of H3-125M's attention (768 / 12 heads, arXiv 2212.14052 §5.1) and GPT-2's


def default_attention_heads(hidden_size: int) -> int:
    """Heads of width 64 where the width allows (768 → 12, H3-125M's), else the largest count ≤ hidden_size / 64
    that divides the width, at least 1: 64 → 1, 256 → 4, 512 → 8, 96 → 1, 320 → 5."""
    target = max(1, hidden_size // ATTENTION_HEAD_DIM)
    return next(heads for heads in range(target, 0, -1) if hidden_size % heads == 0)


@dataclass
class AttentionOptions(MixerOptions):
    """Options of :class:`~ssmhub.layers.attention.CausalSelfAttention`.

    Args:
        num_attention_heads: heads of the attention layers (must divide the width). None (the default): heads of
            width 64 as the width allows (:func:`default_attention_heads`: 12 at H3-125M's 768, 4 at 256); a
            config fixes the count when it is built and saves it.
        attention_dropout: attention-probability dropout in training, in [0, 1).
        attention_window: None (the default, H3's attention, arXiv 2212.14052 §3.4): each token attends to
            every earlier token of its sequence, and the cache keeps all their keys and values. An integer W:
            each token attends to the last W tokens, itself included (sliding-window attention), in every
            forward, and the cache keeps only the last W − 1 keys and values, so a hybrid's memory stays flat
            in the context, as a recurrent layer's does: what evaluating a whole book statefully needs
            (``ssmhub-eval --stateful --attention_window W``). Results equal full attention while a sequence
            is at most W tokens long.
    """

    num_attention_heads: int | None = None
    attention_dropout: float = 0.0
    attention_window: int | None = None

    def has_attention(self) -> bool:
        """Whether these options build an attention layer (a hybrid config without one says False, and the
        heads need not divide its width)."""
        return True

    def attention_heads(self, hidden_size: int) -> int:
        """``num_attention_heads``, or the default for ``hidden_size`` when it is None."""
        return self.num_attention_heads or default_attention_heads(hidden_size)

    def check_options(self, hidden_size: int | None = None) -> None:
        super().check_options(hidden_size)
        name = type(self).__name__
        check_integer(self, "num_attention_heads", "attention_window")
        check_positive(self, "attention_dropout", allow_zero=True)
        if not self.attention_dropout < 1:
            raise ValueError(f"{name}.attention_dropout must be in [0, 1); got {self.attention_dropout}")
        heads = self.num_attention_heads
        if hidden_size is not None and self.has_attention() and heads is not None and hidden_size % heads:
            raise ValueError(
                f"{name}.num_attention_heads ({self.num_attention_heads}) must divide "
                f"{self.width_name()} ({hidden_size})"
            )
