"""vLLM's per-architecture config hooks (``MODELS_CONFIG_MAP``) for ssmhub folders.

vLLM's own hooks give an attention-free model one state slot per request (``MambaModelConfig``) and page a hybrid's
attention and recurrent caches together (``HybridAttentionMambaModelConfig``). These subclasses add checks made when
vLLM builds its configs in the calling process, so that an option the adapter cannot serve fails ``LLM(...)`` or
``vllm serve`` with a message naming it, before any engine process starts: the folder's config
(:func:`ssmhub.serving.servable.check_servable`), and, for the attention-free families, prefix caching (vLLM's
"align" mode checkpoints a state per block through hooks the adapter does not implement yet: without this check the
engine started and its worker died at the first request).
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

    @classmethod
    def verify_and_update_config(cls, vllm_config) -> None:
        if vllm_config.cache_config.enable_prefix_caching:
            raise ValueError(
                "enable_prefix_caching=True (--enable-prefix-caching): ssmhub's attention-free models are not served "
                "from vLLM's prefix cache yet (their states are not checkpointed per block); serve without it"
            )
        super().verify_and_update_config(vllm_config)


class SsmhubHybridModelConfig(HybridAttentionMambaModelConfig):
    @staticmethod
    def verify_and_update_model_config(model_config) -> None:
        _check(model_config)
