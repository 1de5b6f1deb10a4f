"""Hugging Face wrappers: one folder per family, shared machinery in this package."""

from .auto import FAMILIES, register_family
from .bdlrnn import (
    BDLRNNConfig,
    BDLRNNForCausalLM,
    BDLRNNForSequenceClassification,
    BDLRNNForTokenClassification,
    BDLRNNModel,
    BDLRNNPreTrainedModel,
)
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
register_family(
    BDLRNNConfig,
    AutoModel=BDLRNNModel,
    AutoModelForCausalLM=BDLRNNForCausalLM,
    AutoModelForSequenceClassification=BDLRNNForSequenceClassification,
    AutoModelForTokenClassification=BDLRNNForTokenClassification,
)

__all__ = [
    "FAMILIES",
    "BDLRNNConfig",
    "BDLRNNForCausalLM",
    "BDLRNNForSequenceClassification",
    "BDLRNNForTokenClassification",
    "BDLRNNModel",
    "BDLRNNPreTrainedModel",
    "DLRConfig",
    "DLRForCausalLM",
    "DLRForSequenceClassification",
    "DLRForTokenClassification",
    "DLRModel",
    "DLRPreTrainedModel",
    "register_family",
]
