"""vLLM's per-architecture config hooks (``MODELS_CONFIG_MAP``) for ssmhub folders.

vLLM's own hooks give an attention-free model one state slot per request (``MambaModelConfig``) and page a hybrid's
attention and recurrent caches together (``HybridAttentionMambaModelConfig``). These subclasses add one thing: the
folder's config is checked (:func:`ssmhub.serving.servable.check_servable`) when vLLM builds its model config in the
calling process, so that an option the adapter cannot serve fails ``LLM(...)`` or ``vllm serve`` with a message
naming it, before any engine process starts.
"""

from __future__ import annotations

from vllm.model_executor.models.config import HybridAttentionMambaModelConfig, MambaModelConfig

from .servable import check_servable, ssmhub_config

__all__ = ["SsmhubHybridModelConfig", "SsmhubModelConfig"]


def _check(model_config) -> None:
    check_servable(ssmhub_config(model_config.hf_config)[0])


class SsmhubModelConfig(MambaModelConfig):
    @staticmethod
    def verify_and_update_model_config(model_config) -> None:
        _check(model_config)


class SsmhubHybridModelConfig(HybridAttentionMambaModelConfig):
    @staticmethod
    def verify_and_update_model_config(model_config) -> None:
        _check(model_config)
