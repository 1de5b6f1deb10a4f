"""A config edited into an invalid state after construction fails when a model is built from it, and
``save_pretrained`` refuses it before writing anything: never a folder that ``from_pretrained`` refuses."""

import pytest
import torch

import ssmhub

EDITS = [("hidden_size", 0), ("num_hidden_layers", -1), ("vocab_size", 0)]


def heads(family):
    return [cls for cls in (family.causal_lm, family.sequence_classification, family.token_classification) if cls]


@pytest.mark.parametrize(("field", "value"), EDITS)
def test_model_construction_checks_an_edited_config(family, field, value):
    config = family.config(num_labels=3)
    setattr(config, field, value)
    for head in heads(family):
        with pytest.raises(ValueError, match=f"{family.config_class.__name__}.{field} must be"):
            head(config)


@pytest.mark.parametrize(("field", "value"), EDITS)
def test_save_pretrained_checks_an_edited_config_before_writing(family, field, value, tmp_path):
    torch.manual_seed(0)
    model = heads(family)[0](family.config(num_labels=3))
    setattr(model.config, field, value)
    target = tmp_path / "model"
    with pytest.raises(ValueError, match=f"{family.config_class.__name__}.{field} must be"):
        model.save_pretrained(target)
    assert not target.exists() or not any(target.iterdir())


def test_h3_depth_edited_below_its_attention_layers():
    """The issue's case: the default 12-layer placement [1, 8], then ``num_hidden_layers = 2``."""
    config = ssmhub.H3Config(vocab_size=64, hidden_size=24, num_hidden_layers=12, num_attention_heads=2)
    assert config.attention_layers == [1, 8]
    config.num_hidden_layers = 2
    with pytest.raises(ValueError, match=r"H3Config.attention_layers holds 8, outside the layers 0..1"):
        ssmhub.H3ForCausalLM(config)


def test_h3_save_refuses_a_depth_edited_after_construction(tmp_path):
    config = ssmhub.H3Config(vocab_size=64, hidden_size=24, num_hidden_layers=3, num_attention_heads=2)
    model = ssmhub.H3ForCausalLM(config)
    model.config.num_hidden_layers = 1
    with pytest.raises(ValueError, match=r"H3Config\.attention_layers holds"):
        model.save_pretrained(tmp_path / "model")
    assert not (tmp_path / "model").exists()
