from .configuration_dlr import DLRConfig
from .modeling_dlr import DLRForCausalLM, DLRForSequenceClassification, DLRModel, DLRPreTrainedModel

__all__ = ["DLRConfig", "DLRForCausalLM", "DLRForSequenceClassification", "DLRModel", "DLRPreTrainedModel"]
