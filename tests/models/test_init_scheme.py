"""``init_scheme="pytorch"``: torch.nn's own initialisation (the regular-language LRNN code's), kept on load."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import ssmhub


def tiny_bdlrnn(**overrides):
    options = {"vocab_size": 40, "hidden_size": 64, "num_hidden_layers": 1, "num_labels": 5}
    options["classifier_intermediate_size"] = 64
    return ssmhub.BDLRNNConfig(**{**options, **overrides})


def test_linear_maps_and_embeddings_follow_torch_nn_defaults():
    torch.manual_seed(0)
    model = ssmhub.BDLRNNForTokenClassification(tiny_bdlrnn(init_scheme="pytorch"))
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 6  # transition MLP, input MLP, classifier MLP
    for linear in linears:
        bound = 1 / math.sqrt(linear.in_features)  # Kaiming-uniform with a = √5 is U(±1/√fan_in)
        weight = linear.weight.detach()
        assert weight.abs().max() <= bound and weight.abs().max() > 0.9 * bound
        assert weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)
        assert linear.bias.abs().max() <= bound and linear.bias.abs().max() > 0.5 * bound  # not zeroed
    embedding = model.get_input_embeddings().weight.detach()
    assert embedding.std().item() == pytest.approx(1.0, rel=0.1)
    # the normal scheme, for contrast: N(0, 0.02) weights and zero biases
    torch.manual_seed(0)
    normal = ssmhub.BDLRNNForTokenClassification(tiny_bdlrnn())
    first = next(m for m in normal.modules() if isinstance(m, nn.Linear))
    assert first.weight.std().item() == pytest.approx(0.02, rel=0.1) and not first.bias.any()


def test_recurrence_parameters_keep_their_family_init():
    torch.manual_seed(0)
    model = ssmhub.BDLRNNModel(tiny_bdlrnn(init_scheme="pytorch", hidden_size=256, block_size=8))
    x0 = model.layers[0].mixer.ssm.initial_state.detach()  # randn, as in the authors' code
    assert x0.shape == (1, 32, 8) and x0.std().item() == pytest.approx(1.0, rel=0.2)


def test_loading_a_checkpoint_keeps_its_weights(tmp_path):
    torch.manual_seed(0)
    model = ssmhub.BDLRNNForTokenClassification(tiny_bdlrnn(init_scheme="pytorch"))
    model.save_pretrained(tmp_path)
    loaded = ssmhub.BDLRNNForTokenClassification.from_pretrained(tmp_path)
    assert loaded.config.init_scheme == "pytorch"
    for (name, value), (_, again) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(value, again), name  # saved and loaded: a copy


def test_an_unknown_scheme_is_named():
    with pytest.raises(ValueError, match=r"init_scheme must be one of \('normal', 'pytorch'\); got 'xavier'"):
        tiny_bdlrnn(init_scheme="xavier")
