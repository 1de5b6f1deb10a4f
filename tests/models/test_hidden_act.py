"""``hidden_act``: the MLP's GELU, exact (erf, the default) or its tanh approximation (``"gelu_pytorch_tanh"``, GPT-2's
and the released H3 models' MLP), each held to its formula in float64 (Hendrycks & Gimpel, arXiv 1606.08415 §2)."""

from __future__ import annotations

import math

import pytest
import torch

import ssmhub
from ssmhub.models.modeling_recurrent import MLP


def _exact_gelu(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def _tanh_gelu(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize(("hidden_act", "formula"), [("gelu", _exact_gelu), ("gelu_pytorch_tanh", _tanh_gelu)])
def test_the_mlp_applies_the_named_gelu(hidden_act, formula):
    torch.manual_seed(0)
    mlp = MLP(8, 32, hidden_act).double()
    x = 3 * torch.randn(4, 8, dtype=torch.float64)
    expected = formula(x @ mlp.up_proj.weight.T + mlp.up_proj.bias) @ mlp.down_proj.weight.T + mlp.down_proj.bias
    torch.testing.assert_close(mlp(x), expected, rtol=1e-12, atol=1e-12)
    hidden = mlp.up_proj(x)  # the two GELUs differ by up to ~1e-3 here: the test tells them apart
    assert (_exact_gelu(hidden) - _tanh_gelu(hidden)).abs().max() > 1e-5


def test_a_model_builds_its_mlp_with_the_config_activation():
    config = ssmhub.DLRConfig(
        vocab_size=16, hidden_size=8, num_hidden_layers=1, intermediate_size=16, hidden_act="gelu_pytorch_tanh"
    )
    model = ssmhub.DLRForCausalLM(config)
    assert model.backbone.layers[0].mlp.approximate == "tanh"
    assert ssmhub.DLRConfig().hidden_act == "gelu"


def test_an_unknown_activation_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"H3Config\.hidden_act must be one of .*gelu_pytorch_tanh.*; got 'relu'"):
        ssmhub.H3Config(hidden_act="relu")
