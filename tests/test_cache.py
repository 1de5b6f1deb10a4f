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


def _toy_layer(cache, inputs, mask, grow=False):
    """A one-layer model whose state after a token is that token's input (B, 2), plus, with ``grow``, a field
    that gains one column per token (like attention keys); it is its own replay."""
    state = cache.get(0)
    new = {"s": inputs[:, -1].clone()}
    if grow:
        before = state["k"] if state else inputs.new_zeros(inputs.shape[0], 0)
        new["k"] = torch.cat([before, inputs.new_ones(inputs.shape[0], inputs.shape[1])], dim=1)
    cache.update(0, new)


def _forward(cache, values, grow=False, rows=1):
    """A recording forward of tokens whose inputs are ``values``."""
    inputs = torch.tensor(values, dtype=torch.float32).view(1, -1, 1).expand(rows, -1, 2)  # (B, L, 2)
    replay = (lambda c, x, m: _toy_layer(c, x, m, grow=True)) if grow else _toy_layer
    cache.begin_record(inputs, None, replay)
    replay(cache, inputs, None)
    cache.advance(len(values))


def test_crop_returns_to_any_recorded_state_and_drops_the_rest():
    cache = RecurrentCache(1)
    cache.update(0, {"s": torch.zeros(1, 2)})
    cache.advance(3)
    cache.activate_past_recording()
    _forward(cache, [4, 5, 6])
    assert cache.rollback_lengths() == [3, 4, 5, 6] and cache.snapshot_bytes() > 0
    cache.crop(-2)  # the state before the forward, then its first input replayed
    assert cache.get_seq_length() == 4 and cache.get(0)["s"].eq(4).all() and cache.rollback_lengths() == [4]
    _forward(cache, [5, 6])
    cache.crop(5)  # the older convention: the number of tokens to keep
    assert cache.get(0)["s"].eq(5).all() and cache.get_seq_length() == 5
    cache.crop(0)  # transformers 5.24 calls this after every verification: nothing removed
    assert cache.get_seq_length() == 5 and cache.snapshot_bytes() == 0
    _forward(cache, [6, 7])
    cache.crop(torch.tensor(-1))  # transformers 5.17 passes a 0-dim integer tensor
    assert cache.get(0)["s"].eq(6).all() and cache.get_seq_length() == 6


def test_a_crop_reaches_back_across_several_recorded_forwards():
    """An assistant drafts one token per forward; a crop then goes back several of them."""
    cache = RecurrentCache(1)
    cache.update(0, {"s": torch.zeros(1, 2)})
    cache.advance(3)
    cache.activate_past_recording()
    for value in (4, 5, 6):
        _forward(cache, [value])
    assert cache.rollback_lengths() == [3, 4, 5, 6]
    cache.crop(-2)
    assert cache.get(0)["s"].eq(4).all() and cache.get_seq_length() == 4


def test_growing_fields_are_cut_not_copied():
    cache = RecurrentCache(1)
    cache.activate_past_recording()
    _forward(cache, [1, 2, 3], grow=True)
    assert cache.snapshot_bytes() == 3 * 2 * 4  # the inputs only: the incoming state was None
    cache.crop(-1)
    assert cache.get(0)["k"].shape == (1, 2) and cache.get(0)["s"].eq(2).all()
    _forward(cache, [7, 8], grow=True)
    assert cache.snapshot_bytes() == 2 * 4 + 2 * 2 * 4  # "s" copied, "k" kept as a prefix length; the inputs
    cache.crop(-2)
    assert cache.get(0)["k"].shape == (1, 2) and cache.get(0)["s"].eq(2).all()


def test_records_survive_in_place_updates_and_follow_beam_reordering():
    cache = RecurrentCache(1)
    cache.update(0, {"s": torch.tensor([[1.0, 1.0], [2.0, 2.0]])})
    cache.advance(1)
    cache.activate_past_recording()
    _forward(cache, [9], rows=2)
    cache.reorder_cache(torch.tensor([1, 1]))
    cache.crop(-1)
    assert cache.get(0)["s"][:, 0].tolist() == [2.0, 2.0]  # the recorded rows restored: a copy, exact


@pytest.mark.parametrize("bad", [-4, 7, 2.0, torch.tensor(-1.0), torch.tensor([-1, -1])])
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
    assert cache.states_to_record(5, 5) == 0  # ordinary forwards record nothing
    with pytest.raises(ValueError, match="activate_past_recording"):
        cache.begin_record(torch.zeros(1, 2, 2), None, _toy_layer)


def test_fork_is_independent():
    cache = RecurrentCache(1)
    cache.update(0, {"s": torch.zeros(1, 2)})
    cache.advance(2)
    copy = cache.fork()
    copy.update(0, {"s": torch.ones(1, 2)})
    copy.advance(1)
    assert cache.get(0)["s"].eq(0).all() and cache.get_seq_length() == 2 and copy.get_seq_length() == 3


def test_a_crop_leaves_its_replay_to_the_next_forward_or_the_next_read():
    """After a crop the kept inputs wait: a forward takes them (the count steps back so that it counts them again),
    or reading the states replays them first; printing the cache does neither."""
    for read_first in (False, True):
        cache = RecurrentCache(1)
        cache.update(0, {"s": torch.zeros(1, 2)})
        cache.advance(3)
        cache.activate_past_recording()
        _forward(cache, [4, 5, 6])
        cache.crop(-1)  # keeps 4 and 5
        assert "pending_replay=2" in repr(cache) and cache.get_seq_length() == 5
        if read_first:
            assert cache.layers[0]["s"].eq(5).all() and "pending_replay" not in repr(cache)
            assert cache.take_pending() is None and cache.get_seq_length() == 5
        else:
            inputs, mask = cache.take_pending()
            # the recorded inputs handed back: a copy, exact
            assert inputs[0, :, 0].tolist() == [4.0, 5.0] and mask is None and cache.get_seq_length() == 3
            assert cache.get(0)["s"].eq(0).all()  # the state before the recorded forward, not yet replayed
