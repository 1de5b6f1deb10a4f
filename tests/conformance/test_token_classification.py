"""Token classification heads: a label per position, causal where the family is, loss with ignored labels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from comparisons import FP32_REL, same_values, scaled_close
from conftest import random_ids
from transformers import AutoModelForTokenClassification


def test_logits_shape_and_loss_ignores_minus_100(tagger):
    ids = random_ids(2, 9)
    labels = torch.randint(0, 3, (2, 9))
    labels[:, ::2] = -100
    out = tagger(ids, labels=labels)
    assert out.logits.shape == (2, 9, 3) and out.logits.dtype == torch.float32
    expected = F.cross_entropy(out.logits.reshape(-1, 3), labels.reshape(-1), ignore_index=-100)
    scaled_close(out.loss, expected, rel=FP32_REL)  # one op (a cross-entropy) on the same logits
    with pytest.raises(ValueError, match="labels must have shape"):
        tagger(ids, labels=labels[:, :5])


def test_tagger_sees_the_future_exactly_where_the_family_is_not_causal(tagger):
    """Changing tokens 7.. leaves positions 0..6 unchanged in a causal family, and changes them in a
    bidirectional DLR or a faithful SeRpEnt (which read ahead): a non-causal variant that silently
    lost its look-ahead (a dropped backward kernel, say) fails here."""
    config = tagger.config
    reads_ahead = getattr(config, "bidirectional", False) or getattr(config, "resampling_mode", "") == "faithful"
    ids = random_ids(1, 12)
    changed = ids.clone()
    changed[0, 7:] = (changed[0, 7:] % 63) + 1
    assert not torch.equal(ids, changed)  # token ids
    with torch.no_grad():
        a, b = tagger(ids).logits, tagger(changed).logits
    if not reads_ahead:  # another input (an FFT convolution mixes all positions' round-off): within MODEL_REL
        same_values(a[:, :7], b[:, :7], what="positions before the change")
    else:  # position 6 moves by far more than float32 round-off (measured: 0.3 - 2.5 relative in the
        # bidirectional DLR, 2.1e-4 in faithful SeRpEnt, whose compressed branches are small at init)
        assert (a[0, 6] - b[0, 6]).abs().max() > 1e-5 * a[0, 6].abs().max()


def test_tagger_ignores_left_padding(tagger):
    ids = random_ids(1, 8)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 8, dtype=torch.long)], dim=1)
    with torch.no_grad():
        alone, with_pads = tagger(ids).logits, tagger(padded, attention_mask=mask).logits
    same_values(with_pads[:, 3:], alone, what="logits after the padding")


def test_tagger_round_trip_through_auto_class(tagger, tmp_path):
    tagger.save_pretrained(tmp_path)
    loaded = AutoModelForTokenClassification.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(tagger)
    ids = random_ids(2, 6)
    with torch.no_grad():
        # the same weights, but the reloaded model's forward is a computation of its own: within float32 round-off
        same_values(loaded(ids).logits, tagger(ids).logits, what="logits of the reloaded tagger")


def test_mlp_head(family):
    if family.token_classification is None:
        pytest.skip(f"{family.name} has no token classifier")
    model = family.token_classification(family.config(num_labels=4, classifier_intermediate_size=12))
    assert isinstance(model.classifier, torch.nn.Sequential)
    assert model(random_ids(1, 5)).logits.shape == (1, 5, 4)
