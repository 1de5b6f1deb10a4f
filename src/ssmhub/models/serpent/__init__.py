from .configuration_serpent import SerpentConfig
from .convert_mamba import convert_mamba_checkpoint, serpent_config_from_mamba
from .modeling_serpent import (
    SerpentForCausalLM,
    SerpentForSequenceClassification,
    SerpentForTokenClassification,
    SerpentModel,
    SerpentPreTrainedModel,
)

__all__ = [
    "SerpentConfig",
    "SerpentForCausalLM",
    "SerpentForSequenceClassification",
    "SerpentForTokenClassification",
    "SerpentModel",
    "SerpentPreTrainedModel",
    "convert_mamba_checkpoint",
    "serpent_config_from_mamba",
]
