"""Hugging Face wrappers: one folder per family, shared machinery in this package."""

from .auto import FAMILIES, register_family
from .dlr import DLRConfig, DLRForCausalLM, DLRForSequenceClassification, DLRModel, DLRPreTrainedModel

register_family(
    DLRConfig,
    AutoModel=DLRModel,
    AutoModelForCausalLM=DLRForCausalLM,
    AutoModelForSequenceClassification=DLRForSequenceClassification,
)

__all__ = [
    "FAMILIES",
    "DLRConfig",
    "DLRForCausalLM",
    "DLRForSequenceClassification",
    "DLRModel",
    "DLRPreTrainedModel",
    "register_family",
]
