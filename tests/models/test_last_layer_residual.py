"""The shared stack's ``last_layer_residual=False`` (the regular-language LRNN code's network)."""

from __future__ import annotations

import pytest
import torch

import ssmhub


def test_last_block_outputs_its_mixer_without_the_residual():
    torch.manual_seed(0)
    config = ssmhub.DLRConfig(
        vocab_size=11, hidden_size=8, num_hidden_layers=2, state_size=4, last_layer_residual=False
    )
    model = ssmhub.DLRModel(config).eval()
    assert [block.residual for block in model.layers] == [True, False]
    ids = torch.randint(0, 11, (2, 7))
    with torch.no_grad():
        hidden = model.embeddings(ids)
        first = model.layers[0]
        hidden = hidden + first.mixer(first.mixer_norm(hidden))[0]
        last = model.layers[1]
        expected = model.norm_f(last.mixer(last.mixer_norm(hidden))[0])
        torch.testing.assert_close(model(ids).last_hidden_state, expected)


def test_needs_prenorm():
    with pytest.raises(ValueError, match="last_layer_residual=False needs prenorm=True"):
        ssmhub.DLRConfig(last_layer_residual=False, prenorm=False)
