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
        rotary_emb_dim: 0 (the default, H3's own attention: no position embeddings, order comes from the
            recurrent layers around it) or an even number of features, at most the head width, that rotary
            position embeddings rotate in each head's queries and keys (RoFormer, arXiv 2104.09864 §3.4.2,
            Eq. 34; :mod:`ssmhub.ops.rotary`); the rest of each head passes through. The released H3 hybrids'
            attention (flash-attn's ``MHA(rotary_emb_dim=64)``) rotates 64 features per head.
        rotary_emb_base: the base b of the rotary frequencies θ_i = b^(−2i / rotary_emb_dim) (arXiv 2104.09864
            Eq. 15), 10000.0 as in the paper and flash-attn; read only when ``rotary_emb_dim`` > 0.
        rotary_emb_interleaved: which features pair up in a rotation. False (the default, flash-attn's and so
            the released H3 models', GPT-NeoX's layout): feature i with feature i + rotary_emb_dim / 2. True
            (the paper's Eq. 34 order, GPT-J's): features 2i and 2i + 1.
    """

    num_attention_heads: int | None = None
    attention_dropout: float = 0.0
    attention_window: int | None = None
    rotary_emb_dim: int = 0
    rotary_emb_base: float = 10000.0
    rotary_emb_interleaved: bool = False

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
        check_integer(self, "rotary_emb_dim", minimum=0)
        check_positive(self, "attention_dropout", allow_zero=True)
        check_positive(self, "rotary_emb_base")
        if not self.attention_dropout < 1:
            raise ValueError(f"{name}.attention_dropout must be in [0, 1); got {self.attention_dropout}")
        heads = self.num_attention_heads
        if hidden_size is not None and self.has_attention() and heads is not None and hidden_size % heads:
            raise ValueError(
                f"{name}.num_attention_heads ({self.num_attention_heads}) must divide "
                f"{self.width_name()} ({hidden_size})"
            )
        if self.rotary_emb_dim % 2:
            raise ValueError(
                f"{name}.rotary_emb_dim must be even (rotary embeddings rotate pairs of features); "
                f"got {self.rotary_emb_dim}"
            )
        if hidden_size is not None and self.has_attention() and self.rotary_emb_dim:
            head_dim = hidden_size // self.attention_heads(hidden_size)
            if self.rotary_emb_dim > head_dim:
                raise ValueError(
                    f"{name}.rotary_emb_dim ({self.rotary_emb_dim}) must be at most the head width {head_dim} "
                    f"({self.width_name()} {hidden_size} / {self.attention_heads(hidden_size)} heads)"
                )
