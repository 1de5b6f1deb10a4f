"""How a transformers Mamba checkpoint maps onto a SeRpEnt with only its base branch (exactly Mamba).

SeRpEnt's base branch is a full Mamba mixer over the whole sequence (SeRpEnt, arXiv 2501.11729, §4.3,
App. B.1); with no resampling branch, ``h ← h + Mamba(RMSNorm(h))`` blocks and a final RMSNorm make a
SeRpEnt causal LM the same function as transformers' ``MambaForCausalLM``. This module holds the mapping
(config, weight names, recognising a Mamba folder), :func:`serpent_from_mamba`, which builds any given
SeRpEnt model class from a Mamba model, and :func:`serpent_with_branches_from_mamba`, which adds resampling branches
(additive layout) that start out contributing nothing. It imports no SeRpEnt model class, so that
:mod:`.modeling_serpent` (``from_pretrained`` of a Mamba folder) and :mod:`.convert_mamba` (the public
converter) both import it and nothing imports back.

Weight names (transformers → ssmhub):
    backbone.layers.{i}.norm.weight            → backbone.layers.{i}.mixer_norm.weight
    backbone.layers.{i}.mixer.A_log / .D       → backbone.layers.{i}.mixer.base.ssm.A_log / .D
    backbone.layers.{i}.mixer.{other}          → backbone.layers.{i}.mixer.base.{other}
    backbone.embeddings, backbone.norm_f, lm_head: unchanged (old ``backbone.embedding`` accepted).
"""

from __future__ import annotations

import re
from dataclasses import fields

import torch
from transformers import MambaConfig, MambaForCausalLM, PretrainedConfig

from ...layers.mamba_options import MambaOptions
from .configuration_serpent import SerpentConfig

__all__ = [
    "BRANCH_OPTIONS",
    "is_mamba_checkpoint",
    "mamba_state_dict_to_serpent",
    "serpent_config_from_mamba",
    "serpent_from_mamba",
    "serpent_with_branches_from_mamba",
]

# the SerpentOptions fields that describe resampling branches (what a Mamba checkpoint has none of)
BRANCH_OPTIONS = (
    "resampling_rates",
    "resampling_window",
    "num_distance_features",
    "resampling_mode",
    "branch_layout",
    "resampling_branch_size",
    "branch_output_init_std",
)

# from_pretrained keyword arguments that locate a checkpoint (passed on when reading its config)
_HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder", "proxies")

# MambaOptions are named as MambaConfig's fields; only the scan algorithm is ours
_OURS_ONLY = ("scan",)
# the block stack's fields that MambaConfig spells as RecurrentLMConfig does
_SHARED_STACK_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "layer_norm_epsilon",
    "initializer_range",
    "tie_word_embeddings",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
)

_LAYER_KEY = re.compile(r"^backbone\.layers\.(\d+)\.(norm|mixer)\.(.+)$")


def serpent_config_from_mamba(mamba_config: MambaConfig, **overrides) -> SerpentConfig:
    """The :class:`SerpentConfig` of a base-branch-only SeRpEnt equal to ``mamba_config``'s model."""
    if mamba_config.hidden_act != "silu":
        raise ValueError(f"only Mamba with hidden_act='silu' converts; got {mamba_config.hidden_act!r}")
    if mamba_config.intermediate_size != mamba_config.expand * mamba_config.hidden_size:
        raise ValueError(
            f"MambaConfig.intermediate_size ({mamba_config.intermediate_size}) must equal expand × hidden_size "
            f"({mamba_config.expand} × {mamba_config.hidden_size})"
        )
    mixer_fields = {f.name: getattr(mamba_config, f.name) for f in fields(MambaOptions) if f.name not in _OURS_ONLY}
    stack_fields = {name: getattr(mamba_config, name) for name in _SHARED_STACK_FIELDS}
    config_fields = {
        **stack_fields,
        **mixer_fields,
        "time_step_rank": int(mamba_config.time_step_rank),  # MambaConfig resolves "auto" to an int
        "norm_type": "rmsnorm",
        "resampling_rates": [],
    }
    config_fields.update(overrides)
    return SerpentConfig(**config_fields)


def mamba_state_dict_to_serpent(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename a transformers ``MambaForCausalLM`` state dict to :class:`SerpentForCausalLM`'s names."""
    converted = {}
    for key, tensor in state_dict.items():
        key = key.replace("backbone.embedding.", "backbone.embeddings.")
        match = _LAYER_KEY.match(key)
        if match:
            layer, part, rest = match.groups()
            if part == "norm":
                key = f"backbone.layers.{layer}.mixer_norm.{rest}"
            elif rest in ("A_log", "D"):
                key = f"backbone.layers.{layer}.mixer.base.ssm.{rest}"
            else:
                key = f"backbone.layers.{layer}.mixer.base.{rest}"
        converted[key] = tensor
    return converted


def is_mamba_checkpoint(pretrained_model_name_or_path, **kwargs) -> bool:
    """True when the folder or Hub id holds a transformers Mamba model (``model_type == "mamba"``)."""
    if isinstance(pretrained_model_name_or_path, MambaForCausalLM):
        return True
    hub_kwargs = {name: kwargs[name] for name in _HUB_KWARGS if name in kwargs}
    try:
        config_dict, _ = PretrainedConfig.get_config_dict(pretrained_model_name_or_path, **hub_kwargs)
    except (OSError, ValueError):
        return False  # let the regular loader report what is missing
    return config_dict.get("model_type") == "mamba"


def serpent_from_mamba(model_class: type, source, **from_pretrained_kwargs):
    """A ``model_class`` (a SeRpEnt causal LM class) with the weights of a transformers Mamba language model.

    Args:
        model_class: the class to build, e.g. :class:`~ssmhub.SerpentForCausalLM`.
        source: a ``MambaForCausalLM`` instance, or a folder / Hub id that ``MambaForCausalLM.from_pretrained``
            loads (``from_pretrained_kwargs`` are passed to it: ``revision``, ``dtype``, ...).

    Returns:
        The converted model in eval mode, in the source's dtype (recurrence parameters stay float32).
    """
    if isinstance(source, MambaForCausalLM):
        mamba = source
    else:
        mamba = MambaForCausalLM.from_pretrained(source, **from_pretrained_kwargs)
    config = serpent_config_from_mamba(mamba.config)
    state_dict = mamba_state_dict_to_serpent(mamba.state_dict())
    model = model_class(config)
    model.load_state_dict(state_dict, strict=True)
    dtype = mamba.get_input_embeddings().weight.dtype
    if dtype != torch.float32:
        _to_dtype_keeping_recurrences(model, dtype)
    return model.eval()


def _mamba_as_serpent(model_class: type, source, **from_pretrained_kwargs):
    """``source`` as a ``model_class`` without branches: a transformers Mamba (instance, folder or Hub id), or a
    SeRpEnt without resampling branches (instance or folder)."""
    if isinstance(source, MambaForCausalLM) or (
        not isinstance(source, torch.nn.Module) and is_mamba_checkpoint(source, **from_pretrained_kwargs)
    ):
        return serpent_from_mamba(model_class, source, **from_pretrained_kwargs)
    model = (
        source if isinstance(source, torch.nn.Module) else model_class.from_pretrained(source, **from_pretrained_kwargs)
    )
    if getattr(model.config, "model_type", None) != "serpent" or model.config.resampling_rates:
        raise ValueError(
            "from_mamba(source): source must be a transformers MambaForCausalLM (instance, folder or Hub id) or a "
            f"SeRpEnt without resampling branches; got a {type(model).__name__} with model_type "
            f"{getattr(model.config, 'model_type', None)!r} and resampling_rates "
            f"{getattr(model.config, 'resampling_rates', None)!r}"
        )
    return model


def serpent_with_branches_from_mamba(model_class: type, source, branch_options: dict, **from_pretrained_kwargs):
    """A ``model_class`` holding every weight of a Mamba model, with resampling branches added in the additive
    layout (``branch_options``: :data:`BRANCH_OPTIONS` fields, ``resampling_rates`` among them) whose output
    projections start at zero, so that its logits equal the Mamba's until it is trained.

    Raises:
        ValueError: an unknown branch option, no ``resampling_rates``, or ``branch_layout="concatenated"`` (whose
            base branch is narrower than the Mamba and cannot keep its weights).
    """
    unknown = sorted(set(branch_options) - set(BRANCH_OPTIONS))
    if unknown:
        raise ValueError(f"from_mamba: unknown branch options {unknown}; expected some of {list(BRANCH_OPTIONS)}")
    if not branch_options.get("resampling_rates"):
        raise ValueError("from_mamba: resampling_rates must name at least one κ in (0, 1], e.g. [0.5]")
    if branch_options.get("branch_layout", "additive") != "additive":
        raise ValueError(
            "from_mamba: branch_layout must be 'additive' (the concatenated layout's base branch is narrower than "
            f"the Mamba, so it cannot keep its weights); got {branch_options['branch_layout']!r}"
        )
    mamba = _mamba_as_serpent(model_class, source, **from_pretrained_kwargs)
    config_dict = {**mamba.config.to_dict(), **branch_options, "branch_layout": "additive"}
    model = model_class(SerpentConfig.from_dict(config_dict))
    missing, unexpected = model.load_state_dict(mamba.state_dict(), strict=False)
    if unexpected or not all(_is_branch_weight(key) for key in missing):
        raise RuntimeError(f"from_mamba: weights that did not map: missing {missing}, unexpected {unexpected}")
    dtype = mamba.get_input_embeddings().weight.dtype
    if dtype != torch.float32:
        _to_dtype_keeping_recurrences(model, dtype)
    return model.eval()


def _is_branch_weight(key: str) -> bool:
    """Whether a SeRpEnt weight belongs to a resampling branch (or to the Mamba the branches share)."""
    return ".mixer.resampled." in key or ".mixer.branch_mamba." in key


def _to_dtype_keeping_recurrences(model, dtype: torch.dtype) -> None:
    """``model.to(dtype)``, the recurrence parameters (``*.ssm.*``) kept float32 (ssmhub's rule)."""
    model.to(dtype)
    for name, param in model.named_parameters():
        if ".ssm." in f".{name}":
            param.data = param.data.float()
