"""RecurrentCache: in-place updates, beam reordering, fixed memory."""

import pytest
import torch

from ssmhub.cache import RecurrentCache


def test_update_is_in_place_and_counts_tokens():
    cache = RecurrentCache(2)
    assert not cache.has_previous_state(0) and cache.get_seq_length() == 0
    cache.update(0, {"s": torch.ones(2, 3)})
    buffer = cache.get(0)["s"]
    cache.update(0, {"s": torch.full((2, 3), 5.0)})
    assert cache.get(0)["s"] is buffer and buffer.eq(5).all()
    cache.advance(7)
    assert cache.get_seq_length() == 7 and cache.has_previous_state(0) and not cache.has_previous_state(1)


def test_reorder_and_repeat_rows():
    cache = RecurrentCache(1)
    cache.update(0, {"s": torch.arange(3.0)[:, None].repeat(1, 2), "c": torch.arange(3)[:, None] * (1 + 1j)})
    cache.reorder_cache(torch.tensor([2, 2, 0]))
    assert cache.get(0)["s"][:, 0].tolist() == [2.0, 2.0, 0.0]
    assert cache.get(0)["c"][:, 0].real.tolist() == [2.0, 2.0, 0.0]
    cache.batch_repeat_interleave(2)
    assert cache.get(0)["s"][:, 0].tolist() == [2.0, 2.0, 2.0, 2.0, 0.0, 0.0]


def test_memory_and_reset():
    cache = RecurrentCache(2)
    cache.update(0, {"s": torch.zeros(1, 4, dtype=torch.complex64)})
    cache.update(1, {"s": torch.zeros(1, 4, dtype=torch.complex64)})
    assert cache.memory_bytes() == 2 * 4 * 8
    cache.reset()
    assert cache.memory_bytes() == 0 and cache.get_seq_length() == 0


def test_needs_a_layer():
    with pytest.raises(ValueError, match="num_layers"):
        RecurrentCache(0)
