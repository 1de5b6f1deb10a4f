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
from ...layers.h3 import DistillationReport, H3Mixer
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

    def _long_conv_mixers(self) -> dict[str, H3Mixer]:
        """Every H3 layer with a learned long convolution, by module name (a ValueError when there is none)."""
        mixers = {
            name: m for name, m in self.named_modules() if isinstance(m, H3Mixer) and m.kernel_type == "long_conv"
        }
        if not mixers:
            raise ValueError(
                "this model has no long convolutions to distill (every layer is attention or a diagonal SSM)"
            )
        return mixers

    @torch.no_grad()
    def hankel_singular_values(self) -> dict[str, torch.Tensor]:
        """``{module name: (H, L_max − 1) Hankel singular values of each head's learned kernel, descending}``.

        A head whose values fall below ``tol·‖K‖`` after ``r`` entries needs about ``r/2`` complex modes
        (:func:`ssmhub.ops.modal.hankel_singular_values`); read them before choosing a budget.
        """
        return {name: mixer.hankel_singular_values() for name, mixer in self._long_conv_mixers().items()}

    @torch.no_grad()
    def distill_for_decoding(
        self, num_modes: int, tolerance: float | None = None, method: str = "best", eigensolver: str = "truncated"
    ) -> dict[str, DistillationReport]:
        """Replace every long convolution by a fit with at most ``num_modes`` complex exponentials per head.

        Each learned kernel (its L_max regularized taps) is fitted in modal form
        (:func:`ssmhub.ops.modal.fit_modal_kernel` with ``method`` and ``eigensolver``: ``"truncated"``, the leading
        Hankel eigenvectors by an FFT-applied block Krylov method, or ``"dense"``, one eigh per head, the reference),
        a diagonal SSM whose decode state is
        O(num_modes) per channel, independent of the context length. Without ``tolerance`` every head gets
        ``num_modes`` modes; with one (relative L2 kernel error in (0, 1)) each head gets the smallest order
        within the budget that meets it, and a head that no order within the budget fits that well stays exact
        (decoded with its window of L_max − 1 inputs): error-aware distillation, the order chosen per filter as
        in LaughingHyena (arXiv 2310.18780, §3.2). The model then computes with these kernels everywhere (its
        perplexity is measured as usual), records ``config.decode_num_modes`` (the buffers' width; the order
        and exactness of each head are buffers) and saves and loads like any other.

        Returns: ``{module name: DistillationReport}`` (orders, errors, heads left exact, decode state bytes).

        Raises:
            ValueError, before any fitting: ``num_modes`` below 1 or above what L_max supports, a tolerance
            outside (0, 1), an unknown method, or a model with no long convolution.
        """
        mixers = self._long_conv_mixers()  # every layer checks the request before it fits (H3Mixer.distill)
        reports = {name: mixer.distill(num_modes, tolerance, method, eigensolver) for name, mixer in mixers.items()}
        self.config.decode_num_modes = num_modes
        return reports


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
