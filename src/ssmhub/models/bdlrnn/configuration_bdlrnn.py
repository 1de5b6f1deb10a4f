"""Configuration of block-diagonal input-dependent LRNN models (arXiv 2309.07412)."""

# no `from __future__ import annotations` here: @strict checks field types only on real annotations
from huggingface_hub.dataclasses import strict

from ...layers.bdlrnn_options import BDLRNNOptions
from ..configuration_recurrent import RecurrentLMConfig

__all__ = ["BDLRNNConfig"]


@strict
class BDLRNNConfig(RecurrentLMConfig, BDLRNNOptions):
    """A stack of block-diagonal input-dependent LRNN layers (Eq. 5-6, §3.3) with an embedding.

    The regular-language reproduction (§4.4) uses ``hidden_size=64``, ``block_size=8``
    (h = 8 blocks), ``p_norm=1.2`` and 1 layer (3 for ModArith); those are set by the caller, the other
    fields keep their defaults.

    Fields: those of :class:`~ssmhub.models.configuration_recurrent.RecurrentLMConfig` (the block stack and
    heads) and of :class:`~ssmhub.layers.bdlrnn_options.BDLRNNOptions` (the layer: ``block_size``,
    ``p_norm``, ``norm_mode``, ``norm_eps``, ``transition_hidden_size``, ``input_map``,
    ``learned_initial_state``, ``scan``; documented and checked there, once).
    """

    model_type = "bdlrnn"
