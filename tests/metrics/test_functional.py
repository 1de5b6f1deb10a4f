"""ssmhub.metrics.functional: the one implementation of each metric, on hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from ssmhub.metrics.functional import (
    accuracy_counts,
    last_token_accuracy,
    perplexity,
    token_nll,
    top_k_hit_counts,
    top_k_ids,
)


def test_perplexity_from_summed_nll():
    assert perplexity(6.0, 3) == pytest.approx(math.exp(2.0))
    assert math.isnan(perplexity(1.0, 0))
    assert perplexity(1.0, None) is None
    with pytest.raises(ValueError, match="count"):
        perplexity(1.0, -1)


def test_top_k_hits_by_hand():
    logits = torch.tensor([[0.1, 0.9, 0.0, 0.5], [0.8, 0.1, 0.3, 0.2], [0.0, 0.0, 1.0, 0.0]])
    ranked = top_k_ids(logits, 2)
    assert ranked[:2].tolist() == [[1, 3], [0, 2]] and ranked[2, 0] == 2
    # targets: 3 is second at row 0, 1 is not in row 1's top 2, row 2 is not scored
    assert top_k_hit_counts(ranked, torch.tensor([3, 1, -100]), ks=(1, 2)) == {1: 0, 2: 1}
    assert top_k_hit_counts(ranked, [1, 0, 2], ks=(1, 5)) == {1: 3, 5: 3}  # k past the ranked ids: all of them
    with pytest.raises(ValueError, match="ks"):
        top_k_hit_counts(ranked, [1, 0, 2], ks=(0,))
    with pytest.raises(ValueError, match="targets"):
        top_k_hit_counts(ranked, [1, 0], ks=(1,))


def test_accuracy_counts_skip_ignored_positions():
    assert accuracy_counts([3, 9, 4], [3, 1, 4]) == (2, 3)
    assert accuracy_counts([[1, 2, 3], [0, 0, 7]], [[-100, 2, 0], [-100, -100, 7]]) == (2, 3)
    with pytest.raises(ValueError, match="predictions and references"):
        accuracy_counts([1, 2], [1])


def test_last_token_accuracy_uses_each_rows_last_label():
    labels = torch.tensor([[1, 2, -100], [-100, 5, -100], [4, 4, 4]])
    predictions = torch.tensor([[0, 2, 9], [5, 5, 5], [4, 4, 3]])
    assert last_token_accuracy(predictions, labels) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="predictions and labels"):
        last_token_accuracy(predictions[:, :2], labels)


def test_token_nll_by_hand_and_ignored_targets():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]))
    nll = token_nll(logits, torch.tensor([1, -100]))
    torch.testing.assert_close(nll, torch.tensor([math.log(4.0), 0.0]))
