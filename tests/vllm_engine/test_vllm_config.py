"""ssmhub's vLLM config hook with prefix caching (no engine): a conversation's checkpoints are kept at every block
boundary unless the user asked for an interval, the cache and the scheduler share one block size; nothing changes
without prefix caching."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from ssmhub.serving.vllm_config import keep_decode_checkpoints, one_block_size


@pytest.mark.parametrize(
    "enabled, given, kept",
    [(True, 0, None), (True, 64, 64), (True, None, None), (False, 0, 0)],
    ids=["vLLM's default: every boundary", "an interval given: kept", "dense already", "no prefix caching"],
)
def test_decode_checkpoints_are_kept_at_every_block_boundary(enabled, given, kept):
    cache_config = SimpleNamespace(enable_prefix_caching=enabled, prefix_cache_retention_interval=given)
    keep_decode_checkpoints(cache_config)
    assert cache_config.prefix_cache_retention_interval == kept


@pytest.mark.parametrize(
    "enabled, chosen, block, mamba_block, expected",
    [(True, False, 16, None, (16, 16, True)), (True, False, 16, 32, (32, 32, True)),
     (True, True, 64, None, (64, 64, True)), (False, False, 16, None, (16, None, False))],
    ids=["the state block", "a mamba block given", "a block size given", "no prefix caching"],
)  # fmt: skip
def test_the_cache_and_the_scheduler_share_one_block_size(enabled, chosen, block, mamba_block, expected):
    """With prefix caching, ``block_size`` is ``mamba_block_size`` and marked as chosen (the CPU platform would raise
    an unchosen one to 128, the multiprocess scheduler cut chunks at it, and checkpoints held earlier states)."""
    cache_config = SimpleNamespace(enable_prefix_caching=enabled, user_specified_block_size=chosen, block_size=block,
                                   mamba_block_size=mamba_block)  # fmt: skip
    one_block_size(cache_config)
    got = (cache_config.block_size, cache_config.mamba_block_size, cache_config.user_specified_block_size)
    assert got == expected
