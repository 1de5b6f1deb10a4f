"""ssmhub: linear-recurrent and long-convolution sequence models as first-class transformers models.

``import ssmhub`` registers every family with transformers' Auto classes.
"""

from .cache import RecurrentCache
from .models import (
    BDLRNNConfig,
    BDLRNNForCausalLM,
    BDLRNNForSequenceClassification,
    BDLRNNForTokenClassification,
    BDLRNNModel,
    BDLRNNPreTrainedModel,
    DLRConfig,
    DLRForCausalLM,
    DLRForSequenceClassification,
    DLRForTokenClassification,
    DLRModel,
    DLRPreTrainedModel,
    H3Config,
    H3ForCausalLM,
    H3ForSequenceClassification,
    H3ForTokenClassification,
    H3Model,
    H3PreTrainedModel,
    SerpentConfig,
    SerpentForCausalLM,
    SerpentForSequenceClassification,
    SerpentForTokenClassification,
    SerpentModel,
    SerpentPreTrainedModel,
    convert_mamba_checkpoint,
)

__version__ = "0.1.0"

__all__ = [
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
    "RecurrentCache",
    "SerpentConfig",
    "SerpentForCausalLM",
    "SerpentForSequenceClassification",
    "SerpentForTokenClassification",
    "SerpentModel",
    "SerpentPreTrainedModel",
    "__version__",
    "convert_mamba_checkpoint",
]
