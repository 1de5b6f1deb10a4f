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
    "RecurrentCache",
    "__version__",
]
