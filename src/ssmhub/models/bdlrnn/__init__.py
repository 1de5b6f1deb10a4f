from .configuration_bdlrnn import BDLRNNConfig
from .modeling_bdlrnn import (
    BDLRNNForCausalLM,
    BDLRNNForSequenceClassification,
    BDLRNNForTokenClassification,
    BDLRNNModel,
    BDLRNNPreTrainedModel,
)

__all__ = [
    "BDLRNNConfig",
    "BDLRNNForCausalLM",
    "BDLRNNForSequenceClassification",
    "BDLRNNForTokenClassification",
    "BDLRNNModel",
    "BDLRNNPreTrainedModel",
]
