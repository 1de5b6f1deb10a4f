"""Registration of every family with transformers' Auto classes (done by ``import ssmhub``)."""

from __future__ import annotations

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

__all__ = ["FAMILIES", "register_family"]

AUTO_CLASSES = {
    "AutoModel": AutoModel,
    "AutoModelForCausalLM": AutoModelForCausalLM,
    "AutoModelForSequenceClassification": AutoModelForSequenceClassification,
    "AutoModelForTokenClassification": AutoModelForTokenClassification,
}

# model_type -> {"AutoConfig": config class, "AutoModel...": model class}; read by remote_code.py
FAMILIES: dict[str, dict[str, type]] = {}


def register_family(config_class: type, **models: type) -> None:
    """Register a family: ``register_family(XConfig, AutoModel=XModel, AutoModelForCausalLM=XForCausalLM, ...)``."""
    unknown = set(models) - set(AUTO_CLASSES)
    if unknown:
        raise ValueError(f"unknown auto classes {sorted(unknown)}; expected some of {sorted(AUTO_CLASSES)}")
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    for auto_name, model_class in models.items():
        AUTO_CLASSES[auto_name].register(config_class, model_class, exist_ok=True)
    FAMILIES[config_class.model_type] = {"AutoConfig": config_class, **models}
