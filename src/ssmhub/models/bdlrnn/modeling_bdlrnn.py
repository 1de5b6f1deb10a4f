"""Block-diagonal input-dependent LRNN models for transformers (Fan, Chi & Rudnicky, arXiv 2309.07412).

All shared machinery (block stack, cache, heads, init, remote code) lives in
:mod:`ssmhub.models.modeling_recurrent`; this file says only what is this family's own: its mixer,
:class:`~ssmhub.layers.bdlrnn.BDLRNNMixer` (Eq. 5-6, §3.3; parallel scan §3.4).

Differences from the authors' network (their code, github.com/tinghanf/RegluarLRNN; the paper, §4.4, says
only that each layer is a full LRNN pass): the shared block stack is
``x + mixer(LN(x))`` on every layer (optionally with an MLP) followed by a final LayerNorm, while the
code has no residual on its last layer; the token-classification head with
``classifier_intermediate_size=hidden_size`` is the code's ReLU MLP head. Linear maps and embeddings
are initialised with ``initializer_range`` (transformers' convention) instead of PyTorch defaults.
"""

from __future__ import annotations

from ...layers.bdlrnn import BDLRNNMixer
from ..modeling_recurrent import (
    RecurrentForCausalLM,
    RecurrentForSequenceClassification,
    RecurrentForTokenClassification,
    RecurrentModel,
    RecurrentPreTrainedModel,
)
from .configuration_bdlrnn import BDLRNNConfig

__all__ = [
    "BDLRNNForCausalLM",
    "BDLRNNForSequenceClassification",
    "BDLRNNForTokenClassification",
    "BDLRNNModel",
    "BDLRNNPreTrainedModel",
]


class BDLRNNPreTrainedModel(RecurrentPreTrainedModel):
    config_class = BDLRNNConfig

    def build_mixer(self, config: BDLRNNConfig, layer_idx: int) -> BDLRNNMixer:
        return BDLRNNMixer(config.hidden_size, config)


class BDLRNNModel(RecurrentModel, BDLRNNPreTrainedModel):
    """Token embeddings and a stack of block-diagonal LRNN layers; returns the last hidden states."""


class BDLRNNForCausalLM(RecurrentForCausalLM, BDLRNNPreTrainedModel):
    """Block-diagonal LRNN language model; ``generate`` decodes with one (h, b, b) matvec per layer per token."""

    backbone_class = BDLRNNModel


class BDLRNNForSequenceClassification(RecurrentForSequenceClassification, BDLRNNPreTrainedModel):
    """Block-diagonal LRNN sequence classifier: pooled hidden states (``classifier_pooling``) and a linear map."""

    backbone_class = BDLRNNModel


class BDLRNNForTokenClassification(RecurrentForTokenClassification, BDLRNNPreTrainedModel):
    """A label per position, from tokens 0..t only: the regular-language transductions (Sum, EvenPair,
    ModArith; §4.1) are per-prefix answers."""

    backbone_class = BDLRNNModel
