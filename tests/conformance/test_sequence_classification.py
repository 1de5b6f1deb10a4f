"""A sequence classifier given a padded batch without ``attention_mask`` finds the padding from
``config.pad_token_id``, as transformers' classifiers do, for every family and every pooling.

Before, ``DLRForSequenceClassification(...)(input_ids)`` pooled over the padding of a right-padded batch
(a logit of -0.129 against -0.116 with the mask).
"""

import logging

import pytest
import torch
from comparisons import same_values
from conftest import random_ids
from transformers.testing_utils import CaptureLogger

from ssmhub.models import inputs

POOLINGS = ["max", "mean", "last"]
LENGTHS = [7, 4, 5]  # random_ids draws from 1..63: the pad id 0 only appears as padding


def classifier_with(family, pooling, **overrides):
    if family.sequence_classification is None:
        pytest.skip(f"{family.name} has no sequence classifier")
    torch.manual_seed(0)
    config = family.config(num_labels=3, classifier_pooling=pooling, **overrides)
    return family.sequence_classification(config).eval()


def padded_batch(side: str) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Rows of LENGTHS, padded with id 0 on ``side``: (rows, ids, attention_mask)."""
    rows = [random_ids(1, n, seed=n)[0] for n in LENGTHS]
    width = max(LENGTHS)
    ids, mask = torch.zeros(len(rows), width, dtype=torch.long), torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        where = slice(0, len(row)) if side == "right" else slice(width - len(row), width)
        ids[i, where], mask[i, where] = row, 1
    return rows, ids, mask


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("pooling", POOLINGS)
def test_padded_batch_without_mask_gives_the_masked_logits(family, pooling, side):
    model = classifier_with(family, pooling)
    rows, ids, mask = padded_batch(side)
    with torch.no_grad():
        unmasked, masked = model(ids).logits, model(ids, attention_mask=mask).logits
        alone = torch.cat([model(row[None]).logits for row in rows])
    # two computations each (another forward; a batch and its rows alone): within float32 round-off
    same_values(unmasked, masked, what="logits without the mask")
    same_values(unmasked, alone, what="logits of each row alone")


def test_pad_id_between_real_tokens_stays_a_token(family):
    """Only the runs of pad id at the ends of a row are padding: a tokenizer whose pad token is also its EOS
    (ssmhub folders saved before the distinct pad token) may have it inside the text."""
    model = classifier_with(family, "mean")
    ids = random_ids(1, 8)
    ids[0, 3] = 0
    padded = torch.cat([ids, torch.zeros(1, 2, dtype=torch.long)], 1)
    with torch.no_grad():
        expected = model(ids, attention_mask=torch.ones_like(ids)).logits
        same_values(model(padded).logits, expected, what="logits with a pad id inside")


@pytest.fixture
def fresh_warnings():
    """Forget transformers' warn-once cache, so that a warning already given elsewhere is given again."""
    logging.Logger.warning_once.cache_clear()
    yield
    logging.Logger.warning_once.cache_clear()


def test_warns_where_padding_cannot_be_found(fresh_warnings):
    """As transformers does: without pad_token_id a batch of several rows, and inputs_embeds without
    attention_mask, pool every position, with a warning (given once)."""
    from families import FAMILIES

    family = FAMILIES[0]
    model = classifier_with(family, "mean", pad_token_id=None)
    _, ids, _ = padded_batch("right")
    with CaptureLogger(inputs.logger) as captured, torch.no_grad():
        model(ids)
        model(ids)
        model(ids[:1])  # one row: nothing to warn about
    assert captured.out.count("config.pad_token_id is None") == 1
    with CaptureLogger(inputs.logger) as captured, torch.no_grad():
        model(inputs_embeds=model.get_input_embeddings()(ids))
    assert "inputs_embeds without attention_mask cannot detect padding" in captured.out
