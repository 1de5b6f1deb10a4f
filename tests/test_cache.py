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


def _recording_forward(cache, states, grow=False):
    """What a recording forward hands the cache: per layer the states after each new token (a counter)."""
    history = [{"s": torch.full((1, 2), float(v)), **({"k": torch.zeros(1, v)} if grow else {})} for v in states]
    cache.update(0, history[-1], history=history)
    cache.advance(len(states))


def test_crop_returns_to_any_recorded_state_and_drops_the_rest():
    cache = RecurrentCache(1)
    cache.update(0, {"s": torch.zeros(1, 2)})
    cache.advance(3)
    cache.activate_past_recording()
    _recording_forward(cache, [4, 5, 6])
    assert cache.rollback_lengths() == [3, 4, 5, 6] and cache.snapshot_bytes() > 0
    cache.crop(-2)
    assert cache.get_seq_length() == 4 and cache.get(0)["s"].eq(4).all() and cache.rollback_lengths() == [4]
    _recording_forward(cache, [5, 6])
    cache.crop(5)  # the older convention: the number of tokens to keep
    assert cache.get(0)["s"].eq(5).all() and cache.get_seq_length() == 5
    cache.crop(0)  # transformers 5.24 calls this after every verification: nothing removed
    assert cache.get_seq_length() == 5


def test_growing_fields_are_cut_not_copied():
    cache = RecurrentCache(1)
    cache.activate_past_recording()
    _recording_forward(cache, [1, 2, 3], grow=True)
    assert cache.snapshot_bytes() == 2 * 8  # the fixed field after tokens 1 and 2 (the incoming state was None)
    cache.crop(-1)
    assert cache.get(0)["k"].shape == (1, 2) and cache.get(0)["s"].eq(2).all()


def test_snapshots_survive_in_place_updates_and_follow_beam_reordering():
    cache = RecurrentCache(1)
    cache.update(0, {"s": torch.tensor([[1.0, 1.0], [2.0, 2.0]])})
    cache.advance(1)
    cache.activate_past_recording()
    cache.update(0, {"s": torch.full((2, 2), 9.0)}, history=[{"s": torch.full((2, 2), 9.0)}])
    cache.advance(1)
    cache.reorder_cache(torch.tensor([1, 1]))
    cache.crop(-1)
    assert cache.get(0)["s"][:, 0].tolist() == [2.0, 2.0]


@pytest.mark.parametrize("bad", [-4, 7, 2.0])
def test_crop_beyond_what_was_absorbed_or_kept_names_the_argument(bad):
    cache = RecurrentCache(1)
    cache.update(0, {"s": torch.zeros(1, 2)})
    cache.advance(3)
    with pytest.raises(ValueError, match="tokens_to_remove"):
        cache.crop(bad)


def test_crop_without_recording_says_how_to_record():
    cache = RecurrentCache(1)
    cache.update(0, {"s": torch.zeros(1, 2)})
    cache.advance(3)
    with pytest.raises(ValueError, match=r"tokens_to_remove=-1.*activate_past_recording"):
        cache.crop(-1)
    assert cache.states_to_record(5, 5) == 0  # ordinary forwards hand over no history
    with pytest.raises(ValueError, match="history"):
        cache.update(0, {"s": torch.zeros(1, 2)}, history=[{"s": torch.zeros(1, 2)}])


def test_fork_is_independent():
    cache = RecurrentCache(1)
    cache.update(0, {"s": torch.zeros(1, 2)})
    cache.advance(2)
    copy = cache.fork()
    copy.update(0, {"s": torch.ones(1, 2)})
    copy.advance(1)
    assert cache.get(0)["s"].eq(0).all() and cache.get_seq_length() == 2 and copy.get_seq_length() == 3
