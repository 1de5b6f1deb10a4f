"""DLR models for transformers: a backbone, a causal LM and a sequence classifier (arXiv 2212.00768).

All shared machinery (block stack, cache, heads, init, remote code) lives in
:mod:`ssmhub.models.modeling_recurrent`; this file says only what is DLR's own: its mixer.
"""

from __future__ import annotations

from ...layers.dlr import DLRMixer
from ..modeling_recurrent import (
    RecurrentForCausalLM,
    RecurrentForSequenceClassification,
    RecurrentForTokenClassification,
    RecurrentModel,
    RecurrentPreTrainedModel,
)
from .configuration_dlr import DLRConfig

__all__ = [
    "DLRForCausalLM",
    "DLRForSequenceClassification",
    "DLRForTokenClassification",
    "DLRModel",
    "DLRPreTrainedModel",
]


class DLRPreTrainedModel(RecurrentPreTrainedModel):
    config_class = DLRConfig

    def build_mixer(self, config: DLRConfig, layer_idx: int) -> DLRMixer:
        return DLRMixer(config.hidden_size, config)


class DLRModel(RecurrentModel, DLRPreTrainedModel):
    """Token embeddings and a stack of DLR layers; returns the last hidden states."""


class DLRForCausalLM(RecurrentForCausalLM, DLRPreTrainedModel):
    """DLR language model; ``generate`` decodes through the recurrence in O(1) time per token."""

    backbone_class = DLRModel

    def __init__(self, config: DLRConfig):
        if config.bidirectional:
            raise ValueError("DLRForCausalLM needs a causal model: set DLRConfig.bidirectional=False")
        super().__init__(config)


class DLRForSequenceClassification(RecurrentForSequenceClassification, DLRPreTrainedModel):
    """DLR sequence classifier: pooled hidden states (max-pool by default, as in the paper) and a linear map."""

    backbone_class = DLRModel


class DLRForTokenClassification(RecurrentForTokenClassification, DLRPreTrainedModel):
    """DLR with a label per position (causal unless ``bidirectional``)."""

    backbone_class = DLRModel
