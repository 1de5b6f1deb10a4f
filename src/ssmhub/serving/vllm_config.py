"""vLLM's per-architecture config hooks (``MODELS_CONFIG_MAP``) for ssmhub folders.

vLLM's own hooks give an attention-free model one state slot per request (``MambaModelConfig``) and page a hybrid's
attention and recurrent caches together (``HybridAttentionMambaModelConfig``). These subclasses add, when vLLM builds
its configs in the calling process (before any engine process starts):

- a check of the folder's config (:func:`ssmhub.serving.servable.check_servable`), so that an option the adapter
  cannot serve fails ``LLM(...)`` or ``vllm serve`` with a message naming it;
- with prefix caching on (vLLM's "align" mode: a request's state is checkpointed at every multiple of
  ``mamba_block_size`` tokens it reaches, and a later request whose tokens start with those copies the checkpoint
  into its slot and prefills only the rest), checkpoints kept at every block boundary, those reached while decoding
  included (:func:`keep_decode_checkpoints`): the next turn of a conversation, which repeats the last one's prompt
  and answer, then prefills at most one block of them again instead of the whole answer; and, for the attention-free
  families, one block size for the cache and the scheduler (:func:`one_block_size`).
"""

from __future__ import annotations

import logging

from vllm.model_executor.models.config import HybridAttentionMambaModelConfig, MambaModelConfig

from .servable import check_servable, ssmhub_config

__all__ = ["SsmhubHybridModelConfig", "SsmhubModelConfig", "keep_decode_checkpoints", "one_block_size"]

logger = logging.getLogger(__name__)


def _check(model_config) -> None:
    check_servable(ssmhub_config(model_config.hf_config)[0])


def keep_decode_checkpoints(cache_config) -> None:
    """With prefix caching on, vLLM's ``prefix_cache_retention_interval`` left at its default, 0, keeps a request's
    checkpoint only at the last block boundary of its prompt: a conversation's next turn would prefill the previous
    answer again. It is set to None here (a checkpoint at every block boundary; each one is a cached block vLLM evicts
    least-recently-used first, never a block a running request needs). A positive interval given by the user (a
    multiple of the block size: checkpoints that far apart) is kept."""
    if cache_config.enable_prefix_caching and cache_config.prefix_cache_retention_interval == 0:
        cache_config.prefix_cache_retention_interval = None
        logger.info("ssmhub: prefix_cache_retention_interval=None (a state checkpoint at every block boundary, "
                    "decoded tokens included); pass --prefix-cache-retention-interval N to keep fewer")  # fmt: skip


def one_block_size(cache_config) -> None:
    """With prefix caching on, an attention-free model's ``block_size`` made ``mamba_block_size`` and marked as
    chosen, before the CPU platform would raise an unchosen one to 128. The scheduler cuts prefill chunks at
    multiples of ``block_size`` so that each checkpoint holds the state after exactly its block's tokens; vLLM 0.32's
    multiprocess engine kept the raised 128 there while its state blocks were 16 tokens, so chunks ended inside
    blocks, a checkpoint held an earlier state than its tokens', and a request that found it decoded other tokens
    than the uncached model (tests/vllm_engine/test_vllm_tokens.py). A block size the user gave is kept."""
    if not cache_config.enable_prefix_caching:
        return
    if not cache_config.user_specified_block_size:
        cache_config.block_size = cache_config.mamba_block_size or cache_config.block_size
        cache_config.user_specified_block_size = True
    if cache_config.mamba_block_size is None:
        cache_config.mamba_block_size = cache_config.block_size


class SsmhubModelConfig(MambaModelConfig):
    @staticmethod
    def verify_and_update_model_config(model_config) -> None:
        _check(model_config)

    @classmethod
    def verify_and_update_config(cls, vllm_config) -> None:
        keep_decode_checkpoints(vllm_config.cache_config)
        one_block_size(vllm_config.cache_config)
        super().verify_and_update_config(vllm_config)


class SsmhubHybridModelConfig(HybridAttentionMambaModelConfig):
    @staticmethod
    def verify_and_update_model_config(model_config) -> None:
        _check(model_config)

    @classmethod
    def verify_and_update_config(cls, vllm_config) -> None:
        keep_decode_checkpoints(vllm_config.cache_config)
        super().verify_and_update_config(vllm_config)
