"""H3's default attention placement: the paper's [1, 8] of 12 layers, scaled so that it is valid at any depth,
while a saved explicit list loads unchanged."""

import json

import pytest

import ssmhub
from ssmhub.models.h3.configuration_h3 import default_attention_layers

SMALL = {"vocab_size": 64, "hidden_size": 24, "num_attention_heads": 2, "intermediate_size": 0}


def test_the_paper_placement_and_its_scaling():
    assert default_attention_layers(12) == [1, 8]
    table = {1: [], 2: [1], 3: [1, 2], 4: [1, 3], 6: [1, 4], 24: [1, 16]}
    assert {depth: default_attention_layers(depth) for depth in table} == table
    for depth in range(1, 49):
        assert all(0 <= index < depth for index in default_attention_layers(depth))


def test_the_default_config_keeps_attention_at_layers_1_and_8():
    assert ssmhub.H3Config().attention_layers == [1, 8]


@pytest.mark.parametrize("depth", [1, 2, 3, 5])
def test_a_default_placement_builds_at_any_depth(depth):
    config = ssmhub.H3Config(num_hidden_layers=depth, **SMALL)
    assert config.attention_layers == default_attention_layers(depth)
    model = ssmhub.H3ForCausalLM(config)
    kinds = [type(block.mixer).__name__ for block in model.backbone.layers]
    assert [i for i, kind in enumerate(kinds) if kind == "CausalSelfAttention"] == config.attention_layers


@pytest.mark.parametrize(("depth", "saved"), [(24, [1, 8]), (12, [1, 8]), (3, [0, 2]), (4, [])])
def test_an_explicit_saved_list_loads_unchanged(tmp_path, depth, saved):
    ssmhub.H3Config(num_hidden_layers=depth, attention_layers=saved, **SMALL).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["attention_layers"] == saved
    assert ssmhub.H3Config.from_pretrained(tmp_path).attention_layers == saved


def test_a_saved_null_gets_the_placement_of_its_depth(tmp_path):
    ssmhub.H3Config(num_hidden_layers=6, **SMALL).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "attention_layers": None}))
    assert ssmhub.H3Config.from_pretrained(tmp_path).attention_layers == [1, 4]


def test_none_assigned_after_construction_is_refused_when_a_model_is_built():
    config = ssmhub.H3Config(num_hidden_layers=2, **SMALL)
    config.attention_layers = None
    with pytest.raises(ValueError, match=r"H3Config.attention_layers must be a list .* \(for 2 layers: \[1\]\)"):
        ssmhub.H3ForCausalLM(config)
