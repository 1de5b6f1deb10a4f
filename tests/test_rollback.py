"""ssmhub.rollback on a toy one-layer model whose state after a token is that token's input: records, crops,
deferred replays, batch rows and refusals. The states are small integers, stored, copied and reordered (no
arithmetic that rounds), so they are compared exactly."""

from functools import partial

import pytest
import torch

from ssmhub.cache import RecurrentCache
from ssmhub.rollback import run_with_rollback


def _toy_layers(inputs, mask, cache, grow=False, seen=None):
    """A layer pass of one layer whose state is the last token's input (B, 2), plus, with ``grow``, a field that
    gains one column per token (like attention keys); ``seen`` collects the inputs it ran on."""
    if seen is not None:
        seen.append(inputs[0, :, 0].tolist())
    state = cache.get(0)
    new = {"s": inputs[:, -1].clone()}
    if grow:
        before = state["k"] if state else inputs.new_zeros(inputs.shape[0], 0)
        new["k"] = torch.cat([before, inputs.new_ones(inputs.shape[0], inputs.shape[1])], dim=1)
    cache.update(0, new)
    return inputs, ()


def _forward(cache, values, rows=1, reach=None, **toy):
    """A forward of tokens whose inputs are ``values`` that may remove its last ``reach`` (default: all)."""
    inputs = torch.tensor(values, dtype=torch.float32).view(1, -1, 1).expand(rows, -1, 2)  # (B, L, 2)
    reach = len(values) if reach is None else reach
    layers = partial(_toy_layers, **toy)
    run_with_rollback(layers, inputs, None, cache, use_cache=True, packed=False, reach=reach)
    cache.advance(len(values))


def _after(tokens, defer_replay=False):
    """A recording cache (state 0) that has absorbed ``tokens`` tokens."""
    cache = RecurrentCache(1)
    cache.update(0, {"s": torch.zeros(1, 2)})
    cache.advance(tokens)
    cache.activate_past_recording()
    cache.rollback.defer_replay = defer_replay
    return cache


def test_crop_returns_to_any_recorded_state_and_drops_the_rest():
    cache = _after(3)
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
    cache = _after(3)
    for value in (4, 5, 6):
        _forward(cache, [value])
    assert cache.rollback_lengths() == [3, 4, 5, 6]
    cache.crop(-2)
    assert cache.get(0)["s"].eq(4).all() and cache.get_seq_length() == 4


def test_a_long_head_runs_unrecorded_and_a_short_one_joins_the_record():
    """A first forward (prompt and drafts) records only its last ``reach`` tokens; a head no longer than them joins
    the record, so the pass stays one call of the layers."""
    for values, calls, lengths in (([1, 2, 3, 4, 5, 6], 2, [4, 5, 6]), ([5, 6, 7], 1, [0, 1, 2, 3])):
        cache, seen = _after(0), []
        _forward(cache, values, reach=2, seen=seen)
        assert len(seen) == calls and cache.rollback_lengths() == lengths


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
    _forward(cache, [4, 5])  # ordinary forwards record nothing
    assert not cache.record_past and cache.rollback_lengths() == [5] and cache.snapshot_bytes() == 0
    with pytest.raises(ValueError, match=r"tokens_to_remove=-1.*activate_past_recording"):
        cache.crop(-1)


def test_a_deferred_crop_leaves_its_replay_to_the_next_forward_or_settle():
    """With ``defer_replay`` the kept inputs wait: the next forward runs them ahead of its own in one pass, or
    ``settle`` replays them; until then the count includes them and the states are those before them."""
    for settle_first in (False, True):
        cache, seen = _after(3, defer_replay=True), []
        _forward(cache, [4, 5, 6])
        cache.crop(-1)  # keeps 4 and 5
        assert "pending_replay=2" in repr(cache) and cache.get_seq_length() == 5
        assert cache.get(0)["s"].eq(0).all()  # the state before the recorded forward, not yet replayed
        if settle_first:
            cache.rollback.settle(cache)
            assert cache.get(0)["s"].eq(5).all() and "pending_replay=0" in repr(cache)
        _forward(cache, [6], seen=seen)
        # the recorded inputs handed back: a copy, exact
        assert seen == ([[6.0]] if settle_first else [[4.0, 5.0, 6.0]])
        assert cache.get(0)["s"].eq(6).all() and cache.get_seq_length() == 6


def test_a_forward_that_does_not_update_the_cache_replays_a_deferred_crop_first():
    cache, seen = _after(3, defer_replay=True), []
    _forward(cache, [4, 5, 6])
    cache.crop(-1)

    def reader(inputs, mask, cache):  # a pass that reads the state and stores nothing (use_cache=False)
        seen.append(cache.get(0)["s"][0, 0].item())
        return inputs, ()

    run_with_rollback(reader, torch.zeros(1, 1, 2), None, cache, use_cache=False, packed=False, reach=1)
    assert seen == [5.0] and cache.get_seq_length() == 5  # the kept tokens were replayed before it


def test_packed_rows_and_a_bad_reach_are_refused_while_recording():
    cache = _after(3)
    inputs = torch.zeros(1, 2, 2)
    with pytest.raises(ValueError, match="packed rows"):
        run_with_rollback(_toy_layers, inputs, None, cache, use_cache=True, packed=True, reach=2)
    with pytest.raises(ValueError, match="rollback must be a non-negative integer"):
        run_with_rollback(_toy_layers, inputs, None, cache, use_cache=True, packed=False, reach=-1)
    assert cache.get(0)["s"].eq(0).all() and cache.rollback_lengths() == [3]


def test_deactivating_replays_a_deferred_crop_and_drops_the_records():
    cache = _after(3, defer_replay=True)
    _forward(cache, [4, 5, 6])
    cache.crop(-1)
    cache.deactivate_past_recording()
    assert not cache.record_past and cache.get(0)["s"].eq(5).all() and cache.get_seq_length() == 5


def test_transformers_protocol_recurrent_states_to_keep_widens_every_forwards_reach():
    """transformers 5.25 calls ``activate_past_recording(recurrent_states_to_keep=n)`` and reads
    ``get_recurrent_states_to_keep`` / ``is_recording_past``: a forward whose own reach is one token can then be
    cropped back n tokens; a later call without the number keeps it, and a bad one names the argument."""
    cache = RecurrentCache(1)
    assert cache.get_recurrent_states_to_keep() == 0 and not cache.is_recording_past(0)
    cache.update(0, {"s": torch.zeros(1, 2)})
    cache.activate_past_recording(recurrent_states_to_keep=3)
    cache.activate_past_recording()
    assert cache.get_recurrent_states_to_keep() == 3 and cache.get_recurrent_states_to_keep(0) == 3
    assert cache.is_recording_past(0)
    _forward(cache, [1, 2, 3, 4, 5, 6, 7, 8], reach=1)
    assert cache.rollback_lengths() == [5, 6, 7, 8]
    cache.crop(-3)
    assert cache.get(0)["s"].eq(5).all() and cache.get_seq_length() == 5
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError, match="recurrent_states_to_keep must be a non-negative integer"):
            cache.activate_past_recording(recurrent_states_to_keep=bad)
    cache.deactivate_past_recording()
    assert cache.get_recurrent_states_to_keep() == 0 and not cache.is_recording_past()
