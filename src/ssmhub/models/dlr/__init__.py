from .configuration_dlr import DLRConfig
from .modeling_dlr import (
    DLRForCausalLM,
    DLRForSequenceClassification,
    DLRForTokenClassification,
    DLRModel,
    DLRPreTrainedModel,
)

__all__ = [
    "DLRConfig",
    "DLRForCausalLM",
    "DLRForSequenceClassification",
    "DLRForTokenClassification",
    "DLRModel",
    "DLRPreTrainedModel",
]
