"""SeRpEnt models for transformers: Mamba with selective resampling branches (Rando et al., arXiv 2501.11729).

All shared machinery (block stack, cache, heads, init, remote code) lives in
:mod:`ssmhub.models.modeling_recurrent`; this file says only what is SeRpEnt's own: its mixer,
:class:`~ssmhub.layers.serpent.SerpentMixer` (§4, Eq. 11-15), the rule that a causal LM needs the causal
resampling mode, and loading transformers' Mamba checkpoints (a SeRpEnt with only its base branch is
exactly Mamba).
"""

from __future__ import annotations

from ...layers.serpent import SerpentMixer
from ..modeling_recurrent import (
    RecurrentForCausalLM,
    RecurrentForSequenceClassification,
    RecurrentForTokenClassification,
    RecurrentModel,
    RecurrentPreTrainedModel,
)
from .configuration_serpent import SerpentConfig
from .mamba_mapping import BRANCH_OPTIONS, is_mamba_checkpoint, serpent_from_mamba, serpent_with_branches_from_mamba

__all__ = [
    "SerpentForCausalLM",
    "SerpentForSequenceClassification",
    "SerpentForTokenClassification",
    "SerpentModel",
    "SerpentPreTrainedModel",
]


class SerpentPreTrainedModel(RecurrentPreTrainedModel):
    config_class = SerpentConfig

    def build_mixer(self, config: SerpentConfig, layer_idx: int) -> SerpentMixer:
        return SerpentMixer(config.hidden_size, config)


class SerpentModel(RecurrentModel, SerpentPreTrainedModel):
    """Token embeddings and a stack of SeRpEnt blocks; returns the last hidden states."""


class SerpentForCausalLM(RecurrentForCausalLM, SerpentPreTrainedModel):
    """SeRpEnt language model. ``generate`` decodes in O(1) per token: each branch keeps its clock, grid
    counter, a window of its last K tokens and its Mamba state (the causal mode of :mod:`ssmhub.ops.resampling`).

    ``from_pretrained`` also takes a transformers ``MambaForCausalLM`` folder or Hub id (``model_type``
    ``"mamba"``): it is converted with :func:`~ssmhub.models.serpent.convert_mamba_checkpoint` into a
    SeRpEnt with only the base branch, whose logits equal Mamba's; given branch options (``resampling_rates=...``)
    it does what :meth:`from_mamba` does.
    """

    backbone_class = SerpentModel

    def __init__(self, config: SerpentConfig):
        if config.resampling_mode != "causal" and config.resampling_rates:
            raise ValueError(
                f"SerpentForCausalLM needs SerpentConfig.resampling_mode='causal'; got {config.resampling_mode!r} "
                "(the paper's faithful resampling, Eq. 12 and 14b, reads up to ~1/(2κ) + K/2 future tokens; "
                "use it for classification)"
            )
        super().__init__(config)

    @classmethod
    def from_mamba(cls, source, **kwargs) -> SerpentForCausalLM:
        """A SeRpEnt that keeps every weight of a Mamba language model and adds resampling branches that start out
        contributing nothing: its logits equal the Mamba's until it is fine-tuned.

        The branches take the additive layout (:class:`~ssmhub.layers.serpent_options.SerpentOptions`): the Mamba
        is the base branch, whole, and each branch adds its output through a projection initialised to zero, so
        gradients reach it from the first step::

            model = SerpentForCausalLM.from_mamba("state-spaces/mamba-130m-hf", resampling_rates=[0.5, 0.1])

        Args:
            source: a transformers ``MambaForCausalLM`` (instance, folder or Hub id), or a SeRpEnt without
                resampling branches (instance or folder).
            **kwargs: the branch options (``resampling_rates``, required; ``resampling_window``,
                ``num_distance_features``, ``resampling_mode``, ``resampling_branch_size``); the rest go to the
                source's ``from_pretrained`` (``revision``, ``dtype``, ...).
        """
        branch_options = {name: kwargs.pop(name) for name in BRANCH_OPTIONS if name in kwargs}
        return serpent_with_branches_from_mamba(cls, source, branch_options, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        if kwargs.get("config") is None and is_mamba_checkpoint(pretrained_model_name_or_path, **kwargs):
            if model_args:
                raise ValueError("converting a Mamba checkpoint takes no positional model arguments")
            if any(name in kwargs for name in BRANCH_OPTIONS):  # a Mamba with branches: what from_mamba does
                return cls.from_mamba(pretrained_model_name_or_path, **kwargs)
            return serpent_from_mamba(cls, pretrained_model_name_or_path, **kwargs)
        return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)


class SerpentForSequenceClassification(RecurrentForSequenceClassification, SerpentPreTrainedModel):
    """SeRpEnt sequence classifier: pooled hidden states (``classifier_pooling``) and a linear map; either
    resampling mode (the paper's LRA experiments use the faithful one)."""

    backbone_class = SerpentModel


class SerpentForTokenClassification(RecurrentForTokenClassification, SerpentPreTrainedModel):
    """A label per position; causal (position t sees tokens 0..t) in the causal resampling mode."""

    backbone_class = SerpentModel
