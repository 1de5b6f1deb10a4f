"""Hugging Face wrappers: one folder per family, shared machinery in this package."""

from .auto import FAMILIES, register_family
from .dlr import (
    DLRConfig,
    DLRForCausalLM,
    DLRForSequenceClassification,
    DLRForTokenClassification,
    DLRModel,
    DLRPreTrainedModel,
)

register_family(
    DLRConfig,
    AutoModel=DLRModel,
    AutoModelForCausalLM=DLRForCausalLM,
    AutoModelForSequenceClassification=DLRForSequenceClassification,
    AutoModelForTokenClassification=DLRForTokenClassification,
)

__all__ = [
    "FAMILIES",
    "DLRConfig",
    "DLRForCausalLM",
    "DLRForSequenceClassification",
    "DLRForTokenClassification",
    "DLRModel",
    "DLRPreTrainedModel",
    "register_family",
]
