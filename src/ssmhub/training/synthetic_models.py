"""Models for the synthetic tasks: any registered family, or GPT-2 as the attention baseline.

A "registered family" is any ``model_type`` that ``transformers.AutoConfig`` knows: the ssmhub families
(``dlr``, ``h3``, ``serpent``, ``bdlrnn``) and transformers' own models with ``hidden_size`` and
``num_hidden_layers`` fields, such as ``mamba`` (transformers' ``MambaModel``, the peer of SeRpEnt).

Both wrappers take the backbone from ``transformers.AutoModel.from_config``, as a user would:

- :class:`SyntheticRegressionModel` (the DLR paper's §A.6 setup for Table 1): a linear input
  projection ``x W ∈ R^{T×H}`` fed to the backbone as ``inputs_embeds``, and a linear readout
  ``o W' ∈ R^{T×D'}`` whose rightmost ``L'`` positions are the prediction;
- :class:`SyntheticTokenModel`: the backbone's own token embeddings and a linear classifier over the
  vocabulary evaluated *only at the labelled positions* (cross entropy there; all other positions
  are -100). This is the token-classification loss without computing ``B × L × V`` logits that the
  loss would drop anyway (MQAR labels P of L positions).

``model_type="attention"`` is transformers' GPT-2 (``GPT2Model``: pre-norm blocks of 4-head causal
attention and a 4H MLP, learned absolute positions, no dropout). The paper's attention block is a
4-head rotary attention without the MLP (its "Attention + 2×FF" variant, Table 6, has one); GPT-2
is the standard peer the other ssmhub benchmarks measure against. Its MLP uses the exact GELU (one
fused op) rather than GPT-2's ``gelu_new``, which transformers computes as several elementwise ops
that took a quarter of a training step at L = 512 on the CPU; the MLP is not part of the paper's block.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..preflight import check_model_config_keys, make_model_config, model_config_class
from .param_groups import param_groups

__all__ = [
    "ATTENTION_FAMILY",
    "SyntheticRegressionModel",
    "SyntheticTokenModel",
    "backbone_config",
    "family_defaults",
]

ATTENTION_FAMILY = "attention"
ATTENTION_HEADS = 4  # the paper's attention block (§3.3): 4 heads
# --model_config keys the run sets from its own flags (GPT-2's names included): key -> flag.
_SET_BY_FLAGS = {
    "hidden_size": "--hidden_size",
    "n_embd": "--hidden_size",
    "num_hidden_layers": "--num_layers",
    "n_layer": "--num_layers",
    "vocab_size": "--vocab_size (token tasks; regression backbones take no tokens)",
    "use_cache": "the run (no cache in training)",
}


def family_defaults(model_type: str, input_length: int) -> dict[str, Any]:
    """Config fields every synthetic run of ``model_type`` starts from (``model_config`` overrides them).

    - ``dlr``: the paper's Table 1 / Table 7 layer: post-norm, N = 4096, dt-min = dt-max = 1e-5;
    - ``h3``: pure H3 layers (no attention layers, no MLP, as the DLR stack) with kernels as long as
      the input;
    - ``serpent``: one resampling branch (κ = 0.5) beside the base one, so that the power-of-two widths of
      the benchmarks divide into the branches (the config default, 1 + 2 branches, needs multiples of 3);
    - other families (``bdlrnn``; transformers' ``mamba``): their config defaults;
    - ``attention`` (GPT-2): learned positions up to the input length, no dropout, exact GELU.
    """
    if model_type == "dlr":
        return {"prenorm": False, "state_size": 4096, "dt_min": 1e-5, "dt_max": 1e-5}
    if model_type == "h3":
        return {"attention_layers": [], "intermediate_size": 0, "max_kernel_length": input_length}
    if model_type == "serpent":
        return {"resampling_rates": [0.5]}
    if model_type == ATTENTION_FAMILY:
        return {
            "n_positions": input_length,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "classifier_dropout": 0.0,
            "activation_function": "gelu",
        }
    return {}


def backbone_config(
    model_type: str,
    hidden_size: int,
    num_layers: int,
    input_length: int,
    vocab_size: int = 1,
    overrides: dict[str, Any] | None = None,
):
    """The backbone config: family defaults, then ``overrides`` (the run's ``--model_config``), then the run's
    width, depth and vocabulary.

    ``vocab_size`` is 1 for regression backbones (fed ``inputs_embeds``; the embedding is unused).
    Raises ValueError for an unknown ``model_type``, an ``overrides`` key that is not a field of the family's
    config or that a flag sets (the shared :func:`ssmhub.preflight.check_model_config_keys`), or a value the
    config rejects.
    """
    from transformers import AutoModel, GPT2Config

    if model_type == ATTENTION_FAMILY:
        config_class = GPT2Config
    else:
        config_class = model_config_class(model_type, AutoModel, "a base model", extra_types=(ATTENTION_FAMILY,))
    check_model_config_keys(config_class, overrides or {}, set_by=_SET_BY_FLAGS)
    fields = {**family_defaults(model_type, input_length), **(overrides or {})}
    run = {"vocab_size": vocab_size, "hidden_size": hidden_size, "num_hidden_layers": num_layers, "use_cache": False}
    if model_type == ATTENTION_FAMILY:
        if hidden_size % ATTENTION_HEADS:
            raise ValueError(
                f"hidden_size must be a multiple of {ATTENTION_HEADS} (the attention heads), got {hidden_size}"
            )
        fields = {"n_head": ATTENTION_HEADS, **fields}
        run = {"n_embd": hidden_size, "n_layer": num_layers, "vocab_size": vocab_size, "use_cache": False}
        run |= {"bos_token_id": None, "eos_token_id": None}
    return make_model_config(config_class, {**fields, **run})


def _backbone(config) -> nn.Module:
    from transformers import AutoModel

    return AutoModel.from_config(config)


class _SyntheticModel(nn.Module):
    """A backbone with task heads around it; the heads are every child but ``backbone``."""

    backbone: nn.Module

    def optimizer_param_groups(self, weight_decay: float = 0.0, lr: float | None = None) -> list[dict]:
        """Parameter groups for a torch optimizer: the backbone's own, then the heads'.

        An ssmhub backbone gives its own groups
        (:meth:`~ssmhub.models.modeling_recurrent.RecurrentPreTrainedModel.optimizer_param_groups`): no
        weight decay on biases, norms, embeddings and recurrence parameters, the recurrence parameters at
        ``config.recurrence_learning_rate`` (which a run sets through its ``model_config``). GPT-2 gives one
        group, decayed. The heads' matrices are decayed, their biases not. With ``weight_decay=0`` and no
        recurrence learning rate every parameter is updated as by one AdamW over ``parameters()``.
        """
        groups = param_groups(self.backbone, weight_decay, lr)
        heads = [module for name, module in self.named_children() if name != "backbone"]
        matrices = [p for head in heads for p in head.parameters() if p.dim() > 1]
        vectors = [p for head in heads for p in head.parameters() if p.dim() <= 1]
        groups += [{"params": matrices, "weight_decay": weight_decay}, {"params": vectors, "weight_decay": 0.0}]
        if lr is not None:
            for group in groups:
                group.setdefault("lr", lr)
        return [group for group in groups if group["params"]]


class SyntheticRegressionModel(_SyntheticModel):
    """``inputs (B, T, D_in) -> predictions (B, L', D_out)``: projection, backbone, readout at the last L'."""

    def __init__(self, config, input_dim: int, output_dim: int, output_length: int):
        super().__init__()
        hidden = config.hidden_size
        self.output_length = output_length
        self.input_proj = nn.Linear(input_dim, hidden)
        self.backbone = _backbone(config)
        self.readout = nn.Linear(hidden, output_dim)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(inputs_embeds=self.input_proj(inputs), use_cache=False).last_hidden_state  # (B, T, H)
        return self.readout(hidden[:, -self.output_length :])  # (B, L', D_out)


class SyntheticTokenModel(_SyntheticModel):
    """``input_ids (B, L)`` -> logits over the vocabulary at the labelled positions, and their cross entropy."""

    def __init__(self, config, num_labels: int):
        super().__init__()
        self.backbone = _backbone(config)
        self.classifier = nn.Linear(config.hidden_size, num_labels)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns ``(loss, logits)``; ``logits`` is (number of labelled positions, num_labels) in row-major order."""
        hidden = self.backbone(input_ids=input_ids, use_cache=False).last_hidden_state  # (B, L, H)
        labelled = labels != -100
        logits = self.classifier(hidden[labelled]).float()  # (K, V)
        return nn.functional.cross_entropy(logits, labels[labelled]), logits
