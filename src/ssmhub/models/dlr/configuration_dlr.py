"""Configuration of DLR models (diagonal linear RNNs, arXiv 2212.00768)."""

# no `from __future__ import annotations` here: @strict checks field types only on real annotations
from huggingface_hub.dataclasses import strict

from ...layers.dlr_options import DLROptions
from ..configuration_recurrent import RecurrentLMConfig

__all__ = ["DLRConfig"]


@strict
class DLRConfig(RecurrentLMConfig, DLROptions):
    """A stack of DLR layers (seed paper §2.3) with an embedding, for language modelling and classification.

    Fields: those of :class:`~ssmhub.models.configuration_recurrent.RecurrentLMConfig` (the block stack and
    heads) and of :class:`~ssmhub.layers.dlr_options.DLROptions` (the DLR layer: ``state_size``,
    ``kernel_type``, ``bidirectional``, ``bidirectional_shared_lambda``, ``skip_connection``, ``use_glu``,
    ``dropout``, ``dt_min``, ``dt_max``, ``weight_std``; documented and checked there, once).
    """

    model_type = "dlr"
