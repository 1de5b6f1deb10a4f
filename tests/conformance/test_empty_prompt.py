"""``generate`` with an empty prompt raises a ValueError naming ``input_ids``, not an IndexError from inside
transformers."""

import pytest
import torch


@pytest.mark.parametrize("batch", [1, 2])
def test_generate_refuses_an_empty_prompt(causal_lm, batch):
    empty = torch.zeros(batch, 0, dtype=torch.long)
    with pytest.raises(ValueError, match=r"input_ids has shape \(\d, 0\): a prompt needs at least one token"):
        causal_lm.generate(empty, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"input_ids .* at least one token"):
        causal_lm.generate(input_ids=empty, max_new_tokens=2)


def test_generate_refuses_empty_prompt_embeddings(causal_lm):
    embeds = torch.zeros(1, 0, causal_lm.config.hidden_size)
    with pytest.raises(ValueError, match=r"inputs_embeds .* at least one token"):
        causal_lm.generate(inputs_embeds=embeds, max_new_tokens=2)


def test_generate_still_runs_from_a_one_token_prompt(causal_lm):
    out = causal_lm.generate(torch.ones(2, 1, dtype=torch.long), max_new_tokens=2, min_new_tokens=2, do_sample=False)
    assert out.shape == (2, 3)
