"""Bad input gets a clear error that names the problem, before any work starts."""

import pytest
import torch
from conftest import random_ids
from huggingface_hub.errors import StrictDataclassError


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"hidden_size": 0}, "hidden_size"),
        ({"num_hidden_layers": -1}, "num_hidden_layers"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"intermediate_size": -4}, "intermediate_size"),
        ({"classifier_pooling": "median"}, "classifier_pooling"),
    ],
)
def test_bad_config_names_the_field(family, overrides, field):
    with pytest.raises(ValueError, match=f"{family.config_class.__name__}.{field} must be"):
        family.config(**overrides)


def test_wrong_type_names_the_field(family):
    with pytest.raises(StrictDataclassError, match=r"hidden_size.*expected int"):
        family.config(hidden_size=2.5)


def test_token_id_outside_vocabulary(any_model):
    ids = random_ids(1, 5)
    ids[0, 2] = 64
    with pytest.raises(ValueError, match=r"token id 64.*vocabulary \[0, 64\)"):
        any_model(ids)
    ids[0, 2] = -1
    with pytest.raises(ValueError, match="token id -1"):
        any_model(ids)


def test_attention_mask_shape_mismatch(any_model):
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 4\)"):
        any_model(random_ids(2, 5), attention_mask=torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="attention_mask"):
        any_model(random_ids(2, 5), attention_mask=torch.ones(5, dtype=torch.long))


def test_empty_input(any_model):
    with pytest.raises(ValueError, match="empty"):
        any_model(torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="empty"):
        any_model(torch.zeros(0, 3, dtype=torch.long))


def test_both_or_neither_inputs(any_model):
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        any_model()
    with pytest.raises(ValueError, match="inputs_embeds must have shape"):
        any_model(inputs_embeds=torch.zeros(1, 3, 5))


def test_float_token_ids(any_model):
    with pytest.raises(ValueError, match="integer token ids"):
        any_model(torch.zeros(1, 3))


def test_foreign_cache(causal_lm):
    from transformers import DynamicCache

    for name in ("cache", "past_key_values"):
        with pytest.raises(ValueError, match="RecurrentCache"):
            causal_lm(random_ids(1, 3), **{name: DynamicCache()})


def test_bidirectional_model_cannot_be_a_causal_lm():
    import ssmhub

    with pytest.raises(ValueError, match="bidirectional=False"):
        ssmhub.DLRForCausalLM(ssmhub.DLRConfig(vocab_size=8, hidden_size=4, state_size=2, bidirectional=True))
