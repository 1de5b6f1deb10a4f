"""A SeRpEnt with only its base branch is Mamba: transformers' MambaForCausalLM weights load into it
(convert_mamba_checkpoint, or from_pretrained of a Mamba folder) and give the same logits and text."""

from __future__ import annotations

import pytest
import torch
from transformers import MambaConfig, MambaForCausalLM

import ssmhub
from ssmhub.models.serpent.mamba_mapping import mamba_state_dict_to_serpent, serpent_config_from_mamba


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


def test_prompt_lookup_on_a_mamba_folder_gives_transformers_mamba_greedy_tokens(tmp_path):
    """ssmhub's loading of a transformers Mamba folder decodes with prompt lookup (its rollback,
    :mod:`ssmhub.rollback`) the tokens transformers' Mamba decodes greedily, and its own greedy ones. The prompt
    repeats itself, so that lookup proposes candidates from its second half on; the weights are spread (std 0.5) so
    that greedy decoding does not just repeat the last token.

    transformers' own Mamba with prompt lookup (5.25) is not the reference: its verification forward runs the
    tokens before its last ``recurrent_states_to_keep`` through a selective scan that does not read the cached state
    (``modeling_mamba.py``: "it is WRONG if the cache is not empty"), and leaves its greedy tokens here
    (benchmarks/results/speculative.md)."""
    torch.manual_seed(0)
    config = MambaConfig(vocab_size=64, hidden_size=32, state_size=8, num_hidden_layers=2, use_mambapy=False)
    mamba = MambaForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in mamba.parameters():
            if parameter.dim() == 2:
                parameter.normal_(std=0.5)
    mamba.save_pretrained(tmp_path / "mamba")
    serpent = ssmhub.SerpentForCausalLM.from_pretrained(tmp_path / "mamba")
    half = torch.randint(3, 64, (1, 9), generator=torch.Generator().manual_seed(1))
    prompt = torch.cat([half, half, half[:, :3]], dim=1)  # (1, 21)
    options = {"max_new_tokens": 16, "min_new_tokens": 16, "do_sample": False}
    with torch.no_grad():
        expected = mamba.generate(prompt, **options)
        got = serpent.generate(prompt, prompt_lookup_num_tokens=3, **options)
        greedy = serpent.generate(prompt, **options)
    assert torch.equal(got, expected) and torch.equal(got, greedy)  # greedy token ids


def test_convert_and_save(mamba, tmp_path):
    ssmhub.convert_mamba_checkpoint(mamba, save_directory=tmp_path / "out")
    config = ssmhub.SerpentConfig.from_pretrained(tmp_path / "out")
    assert config.model_type == "serpent" and config.num_branches == 1 and config.norm_type == "rmsnorm"


def test_unconvertible_configs_are_refused():
    with pytest.raises(ValueError, match="hidden_act"):
        serpent_config_from_mamba(MambaConfig(hidden_size=16, hidden_act="gelu"))


# ------------------------------------------------------------------------------------------------------------------
# SerpentForCausalLM.from_mamba: every Mamba weight kept, branches added that start out contributing nothing


def test_from_mamba_adds_branches_with_the_logits_of_transformers_mamba(mamba):
    serpent = ssmhub.SerpentForCausalLM.from_mamba(mamba, resampling_rates=[0.5, 0.1], resampling_window=4)
    assert serpent.config.resampling_rates == [0.5, 0.1] and serpent.config.branch_layout == "additive"
    ids = torch.randint(3, 64, (3, 40))
    with torch.no_grad():
        expected = mamba(ids).logits
        got = serpent(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    mamba_weights = mamba_state_dict_to_serpent(mamba.state_dict())
    state = serpent.state_dict()
    for name, value in mamba_weights.items():  # kept bit for bit
        torch.testing.assert_close(state[name], value, rtol=0, atol=0, msg=name)


def test_from_pretrained_of_a_mamba_folder_with_branch_options_does_what_from_mamba_does(mamba, tmp_path):
    mamba.save_pretrained(tmp_path / "mamba")
    serpent = ssmhub.SerpentForCausalLM.from_pretrained(tmp_path / "mamba", resampling_rates=[0.5])
    assert serpent.config.resampling_rates == [0.5]
    ids = torch.randint(3, 64, (2, 30))
    with torch.no_grad():
        torch.testing.assert_close(serpent(ids).logits, mamba(ids).logits, rtol=1e-5, atol=1e-5)


def test_gradients_reach_every_branch_weight_after_one_step(mamba):
    """The branches' output projections start at zero, so only they get a gradient at first; after one optimizer
    step every branch weight does."""
    serpent = ssmhub.SerpentForCausalLM.from_mamba(mamba, resampling_rates=[0.5], resampling_window=4).train()
    optimizer = torch.optim.SGD(serpent.parameters(), lr=0.1)
    ids = torch.randint(3, 64, (2, 24), generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        optimizer.zero_grad()
        serpent(ids, labels=ids).loss.backward()
        optimizer.step()
    branch_weights = {
        name: p for name, p in serpent.named_parameters() if ".resampled." in name or ".branch_mamba." in name
    }
    assert branch_weights
    for name, parameter in branch_weights.items():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_from_mamba_of_a_serpent_without_branches_and_after_saving(mamba, tmp_path):
    ssmhub.convert_mamba_checkpoint(mamba, save_directory=tmp_path / "base")
    serpent = ssmhub.SerpentForCausalLM.from_mamba(tmp_path / "base", resampling_rates=[0.25])
    serpent.save_pretrained(tmp_path / "branched")
    reloaded = ssmhub.SerpentForCausalLM.from_pretrained(tmp_path / "branched")
    ids = torch.randint(3, 64, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, mamba(ids).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "options, message",
    [
        ({}, "resampling_rates"),
        ({"resampling_rates": [0.5], "branch_layout": "concatenated"}, "branch_layout"),
    ],
)
def test_from_mamba_refuses_what_cannot_keep_the_mamba(mamba, options, message):
    with pytest.raises(ValueError, match=message):
        ssmhub.SerpentForCausalLM.from_mamba(mamba, **options)


def test_from_mamba_refuses_a_serpent_with_branches():
    config = ssmhub.SerpentConfig(vocab_size=32, hidden_size=12, num_hidden_layers=1, resampling_rates=[0.5])
    with pytest.raises(ValueError, match="source"):
        ssmhub.SerpentForCausalLM.from_mamba(ssmhub.SerpentForCausalLM(config), resampling_rates=[0.5])
