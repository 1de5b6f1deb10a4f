"""A SeRpEnt with only its base branch is Mamba: transformers' MambaForCausalLM weights load into it
(convert_mamba_checkpoint, or from_pretrained of a Mamba folder) and give the same logits and text."""

from __future__ import annotations

import pytest
import torch
from transformers import MambaConfig, MambaForCausalLM

import ssmhub
from ssmhub.models.serpent import serpent_config_from_mamba


@pytest.fixture(scope="module")
def mamba():
    torch.manual_seed(0)
    config = MambaConfig(
        vocab_size=64,
        hidden_size=32,
        state_size=8,
        num_hidden_layers=2,
        expand=2,
        use_mambapy=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = MambaForCausalLM(config).eval()
    with torch.no_grad():  # trained-looking Δ and D, so that the state carries history
        for layer in model.backbone.layers:
            layer.mixer.dt_proj.bias.add_(2.0)
            layer.mixer.D.normal_()
    return model


def test_converted_logits_equal_transformers_mamba(mamba):
    serpent = ssmhub.convert_mamba_checkpoint(mamba)
    assert isinstance(serpent, ssmhub.SerpentForCausalLM) and serpent.config.resampling_rates == []
    ids = torch.randint(3, 64, (3, 40))
    with torch.no_grad():
        expected = mamba(ids).logits
        got = serpent(ids).logits
    assert (got - expected).abs().max() < 1e-4
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_from_pretrained_of_a_mamba_folder_and_greedy_text(mamba, tmp_path):
    mamba.save_pretrained(tmp_path / "mamba")
    serpent = ssmhub.SerpentForCausalLM.from_pretrained(tmp_path / "mamba")
    prompt = torch.randint(3, 64, (2, 7))
    with torch.no_grad():
        expected = mamba.generate(prompt, max_new_tokens=12, do_sample=False, min_new_tokens=12)
        got = serpent.generate(prompt, max_new_tokens=12, do_sample=False, min_new_tokens=12)
    torch.testing.assert_close(got, expected)
    # the converted model saves and loads as a SeRpEnt like any other
    serpent.save_pretrained(tmp_path / "serpent")
    reloaded = ssmhub.SerpentForCausalLM.from_pretrained(tmp_path / "serpent")
    with torch.no_grad():
        torch.testing.assert_close(reloaded(prompt).logits, serpent(prompt).logits)


def test_convert_and_save(mamba, tmp_path):
    ssmhub.convert_mamba_checkpoint(mamba, save_directory=tmp_path / "out")
    config = ssmhub.SerpentConfig.from_pretrained(tmp_path / "out")
    assert config.model_type == "serpent" and config.num_branches == 1 and config.norm_type == "rmsnorm"


def test_unconvertible_configs_are_refused():
    with pytest.raises(ValueError, match="hidden_act"):
        serpent_config_from_mamba(MambaConfig(hidden_size=16, hidden_act="gelu"))
