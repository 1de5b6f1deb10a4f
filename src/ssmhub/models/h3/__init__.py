from .configuration_h3 import H3Config
from .modeling_h3 import (
    H3ForCausalLM,
    H3ForSequenceClassification,
    H3ForTokenClassification,
    H3Model,
    H3PreTrainedModel,
)

__all__ = [
    "H3Config",
    "H3ForCausalLM",
    "H3ForSequenceClassification",
    "H3ForTokenClassification",
    "H3Model",
    "H3PreTrainedModel",
]
