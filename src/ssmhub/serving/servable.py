"""Which folders a serving engine can serve, and the ssmhub model it serves them with (no engine imported here).

:func:`served_model` builds the family's own causal LM from the config an engine read from a folder: an ssmhub
config, the same config loaded as remote code (``trust_remote_code=True``: another class, the same fields), or a
transformers ``MambaConfig`` (SeRpEnt with no resampling branches is Mamba, arXiv 2501.11729 §4.3). Every option
the engine adapter cannot serve is refused there, at engine start, with a ValueError that names it.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from transformers import MambaConfig, PretrainedConfig

from ..models.auto import FAMILIES
from ..models.serpent.mamba_mapping import mamba_state_dict_to_serpent, serpent_config_from_mamba
from .state_pages import StatePages

__all__ = [
    "SERVED_ARCHITECTURES",
    "ServedModel",
    "check_servable",
    "recurrent_state_pages",
    "served_model",
    "ssmhub_config",
]

# config.json's architectures[0] -> the ssmhub model_type it loads as
SERVED_ARCHITECTURES = {"DLRForCausalLM": "dlr", "BDLRNNForCausalLM": "bdlrnn", "H3ForCausalLM": "h3",
                        "SerpentForCausalLM": "serpent", "MambaForCausalLM": "mamba"}  # fmt: skip


class ServedModel:
    """The family's causal LM and how a folder's tensor names map onto its own (identity but for Mamba folders)."""

    def __init__(self, model: torch.nn.Module, from_mamba: bool):
        self.model = model
        self.from_mamba = from_mamba

    def load_named_tensors(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy the folder's tensors into the model by name; returns the model's parameter names that were set.
        A tensor the model has no place for, or a parameter left unset, is a ValueError naming it."""
        tensors = dict(weights)
        if self.from_mamba:
            tensors = mamba_state_dict_to_serpent(tensors)
        own = self.model.state_dict()
        unknown = sorted(set(tensors) - set(own))
        if unknown:
            raise ValueError(f"the folder holds tensors this model has no place for: {unknown[:5]}")
        tied = self.model.config.tie_word_embeddings and "lm_head.weight" not in tensors
        missing = sorted(set(own) - set(tensors) - ({"lm_head.weight"} if tied else set()))
        if missing:
            raise ValueError(f"the folder lacks the model's tensors {missing[:5]}")
        with torch.no_grad():
            for name, tensor in tensors.items():
                own[name].copy_(tensor.to(own[name].dtype))
        if tied:
            self.model.tie_weights()
        return {name for name, _ in self.model.named_parameters()}


def ssmhub_config(hf_config: PretrainedConfig) -> tuple[PretrainedConfig, bool]:
    """The ssmhub config of ``hf_config`` and whether it came from a transformers Mamba folder."""
    if isinstance(hf_config, MambaConfig) or hf_config.model_type == "mamba":
        return serpent_config_from_mamba(hf_config), True
    family = FAMILIES.get(hf_config.model_type)
    if family is None or "AutoModelForCausalLM" not in family:
        raise ValueError(
            f"model_type {hf_config.model_type!r} is not an ssmhub causal LM; expected one of {sorted(FAMILIES)}"
        )
    config_class = family["AutoConfig"]
    if type(hf_config) is config_class:
        return hf_config, False
    return config_class.from_dict(hf_config.to_dict()), False  # the remote-code class: the same fields


def check_servable(config: PretrainedConfig) -> None:
    """A ValueError naming the option when a config cannot be served through the engine adapter."""
    if getattr(config, "attention_layers", None) and getattr(config, "attention_window", None) is not None:
        raise ValueError(
            f"attention_window={config.attention_window}: a hybrid's sliding-window attention is not served yet "
            "(vLLM's paged attention runs with full causal attention); save the model with attention_window=None"
        )
    if getattr(config, "bidirectional", False):
        raise ValueError("bidirectional=True reads later tokens: a bidirectional DLR cannot decode or be served")
    if getattr(config, "resampling_mode", "causal") != "causal":
        raise ValueError(
            f"resampling_mode={config.resampling_mode!r} reads later tokens; only resampling_mode='causal' serves"
        )


def served_model(hf_config: PretrainedConfig, dtype: torch.dtype) -> ServedModel:
    """The family's causal LM for ``hf_config`` (randomly initialised; :meth:`ServedModel.load_named_tensors` fills
    it), in ``dtype`` with its recurrence parameters kept in float32, in inference mode."""
    config, from_mamba = ssmhub_config(hf_config)
    check_servable(config)
    model_class = FAMILIES[config.model_type]["AutoModelForCausalLM"]
    model = model_class(config).to(dtype).eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return ServedModel(model, from_mamba)


def recurrent_state_pages(hf_config: PretrainedConfig, dtype: torch.dtype) -> StatePages:
    """The state page of the config's first recurrent layer (a hybrid's recurrent layers all have one layout),
    from a model built on the meta device: no weights are allocated."""
    config, _ = ssmhub_config(hf_config)
    model_class = FAMILIES[config.model_type]["AutoModelForCausalLM"]
    kinds = getattr(config, "layers_block_type", ["mamba"] * config.num_hidden_layers)
    with torch.device("meta"):
        mixer = model_class.build_mixer(None, config, kinds.index("mamba"))
    return StatePages.of(mixer, dtype)
