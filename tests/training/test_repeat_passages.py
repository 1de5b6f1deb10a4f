"""Copying practice (``--repeat_passage_probability``): chosen windows end with a passage of their own."""

import torch

from ssmhub.training.batches import repeat_passages


def test_a_chosen_row_keeps_its_start_and_repeats_an_earlier_passage():
    ids = torch.arange(64 * 32).reshape(64, 32)  # every token distinct, so a repeat is unambiguous
    out = repeat_passages(ids, 1.0, torch.Generator().manual_seed(0))
    span = 32 // 4
    assert torch.equal(out[:, :-span], ids[:, :-span])
    starts = set()
    for row in range(64):
        start = int(out[row, -span]) - int(ids[row, 0])
        assert 0 <= start <= 32 - 2 * span
        assert torch.equal(out[row, -span:], ids[row, start : start + span])
        starts.add(start)
    assert len(starts) > 8  # positions are drawn, not fixed


def test_the_probability_chooses_rows_and_the_generator_fixes_the_choice():
    ids = torch.arange(400 * 16).reshape(400, 16)
    assert torch.equal(repeat_passages(ids, 0.0, torch.Generator().manual_seed(0)), ids)
    once = repeat_passages(ids, 0.3, torch.Generator().manual_seed(1))
    again = repeat_passages(ids, 0.3, torch.Generator().manual_seed(1))
    assert torch.equal(once, again)
    changed = (once != ids).any(1).float().mean()
    assert 0.2 < changed < 0.4


def test_a_shuffled_passage_is_reordered_in_place_and_repeated_in_that_order():
    ids = torch.arange(64 * 32).reshape(64, 32)
    out = repeat_passages(ids, 1.0, torch.Generator().manual_seed(0), shuffle=True)
    span = 32 // 4
    reordered = 0
    for row in range(64):
        changed = (out[row, :-span] != ids[row, :-span]).nonzero().flatten()
        start = int(out[row, -span:].min()) - int(ids[row, 0])  # the passage's first position
        assert 0 <= start <= 32 - 2 * span
        assert set(changed.tolist()) <= set(range(start, start + span))  # only the passage moved
        assert torch.equal(out[row, start : start + span], out[row, -span:])  # the repeat copies it as placed
        assert torch.equal(out[row, -span:].sort().values, ids[row, start : start + span])  # same tokens
        reordered += len(changed) > 0
    assert reordered > 60  # the order is drawn (8! orders: almost never the original)


def test_without_shuffling_the_draws_are_unchanged():
    ids = torch.arange(50 * 24).reshape(50, 24)
    plain = repeat_passages(ids, 0.5, torch.Generator().manual_seed(3))
    assert torch.equal(plain, repeat_passages(ids, 0.5, torch.Generator().manual_seed(3), shuffle=False))
    shuffled = repeat_passages(ids, 0.5, torch.Generator().manual_seed(3), shuffle=True)
    assert torch.equal((plain != ids).any(1), (shuffled != ids).any(1))  # the same rows chosen
