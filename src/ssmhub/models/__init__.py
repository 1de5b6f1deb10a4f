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
from .h3 import (
    H3Config,
    H3ForCausalLM,
    H3ForSequenceClassification,
    H3ForTokenClassification,
    H3Model,
    H3PreTrainedModel,
)
from .serpent import (
    SerpentConfig,
    SerpentForCausalLM,
    SerpentForSequenceClassification,
    SerpentForTokenClassification,
    SerpentModel,
    SerpentPreTrainedModel,
    convert_mamba_checkpoint,
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
register_family(
    H3Config,
    AutoModel=H3Model,
    AutoModelForCausalLM=H3ForCausalLM,
    AutoModelForSequenceClassification=H3ForSequenceClassification,
    AutoModelForTokenClassification=H3ForTokenClassification,
)
register_family(
    SerpentConfig,
    AutoModel=SerpentModel,
    AutoModelForCausalLM=SerpentForCausalLM,
    AutoModelForSequenceClassification=SerpentForSequenceClassification,
    AutoModelForTokenClassification=SerpentForTokenClassification,
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
    "H3Config",
    "H3ForCausalLM",
    "H3ForSequenceClassification",
    "H3ForTokenClassification",
    "H3Model",
    "H3PreTrainedModel",
    "SerpentConfig",
    "SerpentForCausalLM",
    "SerpentForSequenceClassification",
    "SerpentForTokenClassification",
    "SerpentModel",
    "SerpentPreTrainedModel",
    "convert_mamba_checkpoint",
    "register_family",
]
