"""Load transformers' Mamba checkpoints as SeRpEnt models with only the base branch (exactly Mamba).

SeRpEnt's base branch is a full Mamba mixer over the whole sequence (§4.3, App. B.1); with no resampling
branch, ``h ← h + Mamba(RMSNorm(h))`` blocks and a final RMSNorm make a :class:`SerpentForCausalLM` the
same function as transformers' ``MambaForCausalLM``. Existing Mamba checkpoints thus become a starting
point for SeRpEnt: convert, then add resampling branches (``resampling_rates``) and fine-tune.

The mapping itself (config, weight names, recognising a Mamba folder) lives in :mod:`.mamba_mapping`,
which :mod:`.modeling_serpent` also uses; its public functions are importable from here too.
"""

from __future__ import annotations

from .mamba_mapping import (
    is_mamba_checkpoint,
    mamba_state_dict_to_serpent,
    serpent_config_from_mamba,
    serpent_from_mamba,
)
from .modeling_serpent import SerpentForCausalLM

__all__ = [
    "convert_mamba_checkpoint",
    "is_mamba_checkpoint",
    "mamba_state_dict_to_serpent",
    "serpent_config_from_mamba",
]


def convert_mamba_checkpoint(source, save_directory=None, **from_pretrained_kwargs):
    """A :class:`~ssmhub.SerpentForCausalLM` with the weights of a transformers Mamba language model.

    Args:
        source: a ``MambaForCausalLM`` instance, or a folder / Hub id that ``MambaForCausalLM.from_pretrained``
            loads (``from_pretrained_kwargs`` are passed to it: ``revision``, ``dtype``, ...).
        save_directory: if given, the converted model is also saved there (safetensors, config and code).

    Returns:
        The converted model in eval mode, in the source's dtype. Its logits equal the source's.
    """
    model = serpent_from_mamba(SerpentForCausalLM, source, **from_pretrained_kwargs)
    if save_directory is not None:
        model.save_pretrained(save_directory)
    return model
