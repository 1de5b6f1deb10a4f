"""int8 weights as transformers users quantize: which layers stay float32, and the two routes in one call each.

Two routes, both standard:

- torchao through transformers: ``AutoModelForCausalLM.from_pretrained(folder, quantization_config=
  torchao_config())`` (``TorchAoConfig`` with ``Int8WeightOnlyConfig`` by default, the output head float32); the
  quantized model saves and loads with ``save_pretrained`` / ``from_pretrained`` (safetensors);
- PyTorch's dynamic quantization: :func:`quantize_dynamic_int8` (``torch.ao.quantization.quantize_dynamic`` on
  every plain ``nn.Linear``), in memory only.

What quantizes: the weights of ``nn.Linear`` projections (in/out projections, MLPs, attention; the output head
on the dynamic route unless ``quantize_lm_head=False``). What stays float32:

- every recurrence parameter (DLR's Λ and kernel weights, H3's long kernels and S4D parameters, Mamba's
  ``A_log`` and ``D``, BD-LRNN's initial state): they sit in the ``ssm`` submodules, which hold plain
  parameters, not ``nn.Linear`` layers, so neither route touches them;
- the FFT convolutions, the scans and the recurrent states: both routes change only how a projection
  multiplies, and its output is float32 again (int8 weight-only dequantizes the weight; dynamic quantization
  rounds the activation to int8 inside the matmul only);
- the linear layers whose output sets a recurrence or a discrete decision (:data:`FLOAT32_LINEAR_NAMES`):
  BD-LRNN's ``transition`` MLP, whose output is the block transition matrix A(x) itself (arXiv 2309.07412
  Eq. 5-6: it multiplies the state at every step, and the column normalisation of the authors' code amplifies
  its rounding: one layer's transition in int8 moves a tiny model's logits by up to 12%); Mamba's time-step
  projection ``dt_proj`` (Δ of ``exp(Δ A)``, arXiv 2312.00752 §3.5: an error in Δ is an error in the exponent
  of every decay); SeRpEnt's resampling step ``step_proj`` (θ_Δ of Eq. 13, arXiv 2501.11729 §4: it decides
  which tokens are merged, and a decision flipped by rounding is not a small change of the output).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = [
    "FLOAT32_LINEAR_NAMES",
    "dynamic_qconfig_spec",
    "is_kept_float32",
    "modules_to_not_convert",
    "quantize_dynamic_int8",
    "torchao_config",
]

FLOAT32_LINEAR_NAMES = ("transition", "dt_proj", "step_proj")  # module names: these and the linear layers in them
LM_HEAD_NAME = "lm_head"


def is_kept_float32(module_name: str) -> bool:
    """Whether the linear layer named ``module_name`` (``backbone.layers.0.mixer.base.dt_proj``,
    ``backbone.layers.0.mixer.transition.2``) stays float32: a part of its name is in :data:`FLOAT32_LINEAR_NAMES`."""
    return not set(module_name.split(".")).isdisjoint(FLOAT32_LINEAR_NAMES)


def modules_to_not_convert() -> list[str]:
    """The ``modules_to_not_convert`` of a ``TorchAoConfig`` for an ssmhub model: a pattern per name of
    :data:`FLOAT32_LINEAR_NAMES` (transformers matches each as a regular expression from the start of a module's
    name, up to a ``.``: ``.*\\.transition`` covers ``backbone.layers.0.mixer.transition.2``), and the output head,
    which transformers' own default keeps float32 too (a list passed in replaces that default). The head stays
    float32 on this route: it is tied to the input embedding, and transformers' ``untie_embedding_weights``
    quantizes the embedding, not the head; :func:`quantize_dynamic_int8` quantizes it."""
    return [*(rf".*\.{name}" for name in FLOAT32_LINEAR_NAMES), LM_HEAD_NAME]


def torchao_config(quant_type=None):
    """A transformers ``TorchAoConfig`` for an ssmhub model: ``quant_type`` (a torchao config; default
    ``Int8WeightOnlyConfig()``, symmetric int8 weights with a scale per output row) with
    :func:`modules_to_not_convert`. Needs torchao (``pip install 'ssmhub[quantization]'``)."""
    from transformers import TorchAoConfig

    try:
        from torchao.quantization import Int8WeightOnlyConfig
    except ImportError as error:
        raise ImportError("torchao_config needs torchao: pip install 'ssmhub[quantization]'") from error
    quant_type = Int8WeightOnlyConfig() if quant_type is None else quant_type
    return TorchAoConfig(quant_type, modules_to_not_convert=modules_to_not_convert())


def dynamic_qconfig_spec(model: nn.Module, quantize_lm_head: bool = True) -> dict:
    """The ``qconfig_spec`` of ``torch.ao.quantization.quantize_dynamic`` for ``model``: every plain ``nn.Linear``
    gets the default int8 dynamic qconfig, except the layers named in :data:`FLOAT32_LINEAR_NAMES` and, unless
    ``quantize_lm_head``, the output head (named modules mapped to None stay float32)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(quantize_lm_head, bool):
        raise TypeError(f"quantize_lm_head must be a bool, got {quantize_lm_head!r}")
    spec: dict = {nn.Linear: torch.ao.quantization.default_dynamic_qconfig}
    for name, module in model.named_modules():
        head = name.rpartition(".")[2] == LM_HEAD_NAME and not quantize_lm_head
        if isinstance(module, nn.Linear) and (is_kept_float32(name) or head):
            spec[name] = None
    return spec


def quantize_dynamic_int8(model: nn.Module, quantize_lm_head: bool = True) -> nn.Module:
    """``torch.ao.quantization.quantize_dynamic`` with int8 weights (per-tensor, fbgemm) on ``model``'s
    projections, per :func:`dynamic_qconfig_spec`; returns a quantized copy (``model`` is left as it was).
    Inference only: the copy has no gradients and does not save with ``save_pretrained``."""
    spec = dynamic_qconfig_spec(model, quantize_lm_head)
    return torch.ao.quantization.quantize_dynamic(model, spec, dtype=torch.qint8, inplace=False)
