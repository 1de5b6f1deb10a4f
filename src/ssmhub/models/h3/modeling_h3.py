"""H3 models for transformers with regularized long convolutions (arXiv 2302.06646 §4; H3: arXiv 2212.14052).

All shared machinery (block stack, cache, heads, init, remote code) lives in
:mod:`ssmhub.models.modeling_recurrent`; this file says only what is H3's own: which mixer each layer
gets (:class:`~ssmhub.layers.h3.H3Mixer`, or :class:`~ssmhub.layers.attention.CausalSelfAttention` at
``config.attention_layers``; the attention key/values live in the same recurrent cache).
"""

from __future__ import annotations

import torch
from torch import nn

from ...layers.attention import CausalSelfAttention
from ...layers.attention_options import AttentionOptions
from ...layers.h3 import H3Mixer
from ..modeling_recurrent import (
    RecurrentForCausalLM,
    RecurrentForSequenceClassification,
    RecurrentForTokenClassification,
    RecurrentModel,
    RecurrentPreTrainedModel,
)
from .configuration_h3 import H3Config

__all__ = [
    "H3ForCausalLM",
    "H3ForSequenceClassification",
    "H3ForTokenClassification",
    "H3Model",
    "H3PreTrainedModel",
]


class H3PreTrainedModel(RecurrentPreTrainedModel):
    config_class = H3Config

    def build_mixer(self, config: H3Config, layer_idx: int) -> nn.Module:
        if layer_idx in config.attention_layers:
            return CausalSelfAttention(config.hidden_size, config)
        return H3Mixer(config.hidden_size, config)

    def set_attention_window(self, attention_window: int | None) -> None:
        """Give every attention layer a sliding window of ``attention_window`` tokens (None: full attention),
        from the next forward on, and record it in the config (so ``save_pretrained`` keeps it). What
        ``ssmhub-eval --stateful --attention_window W`` does to a hybrid, so that its cache stops growing
        (:class:`~ssmhub.layers.attention_options.AttentionOptions`). Raises ValueError for a bad value."""
        AttentionOptions.take(self.config, attention_window=attention_window).check_options(self.config.hidden_size)
        self.config.attention_window = attention_window
        for module in self.modules():
            if isinstance(module, CausalSelfAttention):
                module.attention_window = attention_window

    @torch.no_grad()
    def distill_for_decoding(self, num_modes: int) -> dict[str, torch.Tensor]:
        """Replace every long convolution by a fit with ``num_modes`` complex exponentials per head.

        Each learned kernel (its L_max regularized taps) is fitted in modal form (Hankel/ESPRIT poles,
        least-squares residues: :func:`ssmhub.ops.modal.fit_modal_kernel`), a diagonal SSM whose decode
        state is O(num_modes) per channel, independent of the context length. The model then computes
        with the fitted kernels everywhere (its perplexity is measured as usual), records
        ``config.decode_num_modes`` and saves and loads like any other.

        Returns: ``{module name: (H,) relative L2 error of each kernel's fit}``.

        Raises:
            ValueError: ``num_modes`` below 1 or too large for L_max, or a model with no long convolution.
        """
        mixers = {
            name: m for name, m in self.named_modules() if isinstance(m, H3Mixer) and m.kernel_type == "long_conv"
        }
        if not mixers:
            raise ValueError(
                "this model has no long convolutions to distill (every layer is attention or a diagonal SSM)"
            )
        if isinstance(num_modes, bool) or not isinstance(num_modes, int) or num_modes < 1:
            raise ValueError(f"num_modes must be an integer >= 1; got {num_modes!r}")
        errors = {name: mixer.distill(num_modes) for name, mixer in mixers.items()}
        self.config.decode_num_modes = num_modes
        return errors


class H3Model(RecurrentModel, H3PreTrainedModel):
    """Token embeddings and a stack of H3 (and attention) layers; returns the last hidden states."""


class H3ForCausalLM(RecurrentForCausalLM, H3PreTrainedModel):
    """H3 language model. ``generate`` decodes exactly: each long convolution keeps its last L_max inputs
    (O(L_max) per token), each attention layer its keys and values."""

    backbone_class = H3Model


class H3ForSequenceClassification(RecurrentForSequenceClassification, H3PreTrainedModel):
    """H3 sequence classifier over pooled hidden states."""

    backbone_class = H3Model


class H3ForTokenClassification(RecurrentForTokenClassification, H3PreTrainedModel):
    """H3 with a label per position."""

    backbone_class = H3Model
