"""RecurrentCache: in-place updates, beam reordering, fixed memory. The states here are small integers, stored,
copied and reordered (no arithmetic that rounds), so they are compared exactly."""

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


def test_a_state_is_stored_row_major_whatever_layout_the_forward_left():
    """The cache's buffers are contiguous (each row's block in one piece: what the one-pass decode kernels read in
    place), with the state's values, even where a forward returned its state with the batch innermost."""
    cache = RecurrentCache(1)
    batch_innermost = torch.arange(24.0).reshape(3, 4, 2).movedim(-1, 0)  # (2, 3, 4), strides (1, 8, 2)
    cache.update(0, {"s": batch_innermost})
    stored = cache.get(0)["s"]
    assert stored.is_contiguous() and torch.equal(stored, batch_innermost)


def test_reorder_and_repeat_rows():
    cache = RecurrentCache(1)
    cache.update(0, {"s": torch.arange(3.0)[:, None].repeat(1, 2), "c": torch.arange(3)[:, None] * (1 + 1j)})
    cache.reorder_cache(torch.tensor([2, 2, 0]))
    # reordering and repeating rows copy them: the stored values, exactly
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


def test_fork_is_independent():
    cache = RecurrentCache(1)
    cache.update(0, {"s": torch.zeros(1, 2)})
    cache.advance(2)
    copy = cache.fork()
    copy.update(0, {"s": torch.ones(1, 2)})
    copy.advance(1)
    assert cache.get(0)["s"].eq(0).all() and cache.get_seq_length() == 2 and copy.get_seq_length() == 3


def test_state_dict_round_trips_and_names_a_bad_key():
    """``state_dict`` is the one flat format (``layers.<i>.<field>``, ``seen_tokens``); ``from_state_dict`` reads it
    back into the same states (copies: the same bits) and refuses a key it cannot place, naming it."""
    cache = RecurrentCache(3)
    cache.update(0, {"h": torch.randn(2, 4)})
    cache.update(2, {"h": torch.randn(2, 4), "window": torch.randn(2, 3, 4)})
    cache.advance(5)
    state = cache.state_dict()
    assert sorted(state) == ["layers.0.h", "layers.2.h", "layers.2.window", "seen_tokens"]
    loaded = RecurrentCache.from_state_dict(state, 3)
    assert loaded.seen_tokens == 5 and loaded.layers[1] is None
    assert all(torch.equal(loaded.layers[i][k], cache.layers[i][k]) for i in (0, 2) for k in cache.layers[i])
    with pytest.raises(ValueError, match=r"'layers\.3\.h'"):
        RecurrentCache.from_state_dict({"layers.3.h": torch.zeros(1)}, 3)
