"""Habits a transformers user brings from GPT-2 and transformers' Mamba, every family: an empty row in a padded
classification batch, ``generate(inputs_embeds=...)``, the usual widths with default options, logits in the
model's dtype, a saved folder's tokenizer loaded without ssmhub."""

import json
import math
import subprocess
import sys
import textwrap

import pytest
import torch
from comparisons import same_values
from conftest import random_ids
from transformers import AutoModelForCausalLM

import ssmhub
from ssmhub.models import FAMILIES
from ssmhub.models.configuration_recurrent import POOLINGS

WIDTHS = (64, 128, 256, 512, 768)


@pytest.mark.parametrize("pooling", POOLINGS)
@torch.no_grad()
def test_a_row_of_padding_only_gets_finite_logits_and_the_heads_bias(family, pooling):
    """An empty text padded next to a real one (every position masked): the pooled features are zeros under every
    pooling, so its logits are the score's bias (``"max"`` gave about -3e38 before, hence logits of 1e37), and the
    real row is unchanged; labelled, the loss is finite."""
    if family.sequence_classification is None:
        pytest.skip(f"{family.name} has no sequence classifier")
    torch.manual_seed(0)
    model = family.sequence_classification(family.config(num_labels=3, classifier_pooling=pooling)).eval()
    ids = random_ids(2, 7)
    mask = torch.ones_like(ids)
    ids[0], mask[0] = 0, 0  # row 0: padding only (pad_token_id 0)
    out = model(ids, attention_mask=mask, labels=torch.tensor([1, 2]))
    assert torch.isfinite(out.logits).all() and math.isfinite(out.loss.item())
    # zeros through a linear map give its bias: the same op on the same bits (a matmul with a zero vector)
    torch.testing.assert_close(out.logits[0], model.score.bias, atol=0, rtol=0)
    alone = model(ids[1:], attention_mask=mask[1:]).logits
    same_values(out.logits[1:], alone, what="the real row next to an empty one")  # a batch vs the row alone


@torch.no_grad()
def test_generate_from_inputs_embeds_gives_the_tokens_of_the_ids_that_made_them(causal_lm):
    """``generate(inputs_embeds=E(ids), attention_mask=...)`` is accepted (transformers reads the signature of
    ``prepare_inputs_for_generation``) and decodes greedily the tokens ``generate(ids)`` adds; left padding too.
    Greedy tokens are the promised quantity: the first forward reads the same embedding rows either way."""
    ids = random_ids(2, 6)
    mask = torch.ones_like(ids)
    ids[0, :2], mask[0, :2] = 0, 0  # left padding in row 0
    options = {"max_new_tokens": 5, "do_sample": False, "attention_mask": mask}
    from_ids = causal_lm.generate(ids, **options)
    from_embeds = causal_lm.generate(inputs_embeds=causal_lm.get_input_embeddings()(ids), **options)
    assert torch.equal(from_embeds, from_ids[:, ids.shape[1] :])  # integer token ids


@torch.no_grad()
def test_generate_from_inputs_embeds_beside_empty_input_ids(causal_lm):
    """``generate(input_ids=<(B, 0) ids>, inputs_embeds=E(ids))``, as transformers' GPT-2 and Mamba take it: the
    embeddings are the prompt and the output holds only the new tokens, those of ``generate(ids)``. Rows that
    disagree are refused naming both arguments."""
    ids = random_ids(2, 6)
    embeds = causal_lm.get_input_embeddings()(ids)
    options = {"max_new_tokens": 4, "do_sample": False}
    beside_empty = causal_lm.generate(input_ids=ids[:, :0], inputs_embeds=embeds, **options)
    assert torch.equal(beside_empty, causal_lm.generate(ids, **options)[:, ids.shape[1] :])  # integer token ids
    with pytest.raises(ValueError, match=r"input_ids has shape \(1, 0\) and inputs_embeds .* same number of rows"):
        causal_lm.generate(input_ids=ids[:1, :0], inputs_embeds=embeds, **options)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("config_class", [classes["AutoConfig"] for classes in FAMILIES.values()], ids=str)
def test_every_usual_width_builds_with_the_default_options(config_class, width):
    """A user's first config names only a width: every family builds and runs a forward at 64 ... 768 (H3's
    attention keeps heads of width 64, SeRpEnt's base branch takes the remainder of the split)."""
    torch.manual_seed(0)
    config = config_class(hidden_size=width, num_hidden_layers=2, vocab_size=32)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        logits = model(random_ids(1, 3, vocab=32)).logits
    assert logits.shape == (1, 3, 32) and torch.isfinite(logits).all()


def test_a_users_own_heads_that_do_not_divide_the_width_are_refused_by_name():
    with pytest.raises(ValueError, match=r"H3Config.num_attention_heads \(12\) must divide H3Config.hidden_size"):
        ssmhub.H3Config(hidden_size=256, num_attention_heads=12)
    with pytest.raises(ValueError, match=r"SerpentConfig.hidden_size .* at least the number of branches"):
        ssmhub.SerpentConfig(hidden_size=2, resampling_rates=[0.5, 0.1], branch_layout="concatenated")


def test_default_heads_and_branch_widths_follow_the_width():
    assert [ssmhub.H3Config(hidden_size=w).num_attention_heads for w in WIDTHS] == [1, 2, 4, 8, 12]
    config = ssmhub.SerpentConfig(hidden_size=256, branch_layout="concatenated")  # 3 branches: 86 + 85 + 85
    assert config.branch_widths(256) == (86, 85) and config.branch_size == 85
    config = ssmhub.SerpentConfig(hidden_size=256)  # additive: the whole base, branches of H / 8
    assert config.branch_widths(256) == (256, 32) and config.branch_size == 32


@torch.no_grad()
def test_a_bfloat16_model_returns_bfloat16_logits(family):
    """As GPT-2: logits in the model's dtype (a float32 copy of a 50K-vocabulary output costs 0.8 GB per row at
    4K tokens); the loss is still computed in float32 by transformers' loss functions."""
    torch.manual_seed(0)
    heads = [family.causal_lm, family.sequence_classification, family.token_classification]
    for head in [h for h in heads if h is not None]:
        model = head(family.config(num_labels=3)).to(torch.bfloat16).eval()
        out = model(random_ids(2, 5))
        assert out.logits.dtype == torch.bfloat16, head.__name__


def test_a_saved_folders_tokenizer_loads_without_ssmhub_and_without_a_prompt(tmp_path):
    """As any transformers folder: ``AutoTokenizer.from_pretrained(folder)`` in a Python that never imports ssmhub
    loads the tokenizer with no remote-code prompt and no warning about the config (transformers reads
    ``config.json`` first; a folder whose ``auto_map`` names code would ask for approval, so code is opt-in)."""
    from ssmhub.tokenization import train_bpe_tokenizer

    lines = ["the river runs to the sea", "a tokenizer of a saved folder", "loads as transformers loads it"] * 4
    tokenizer = train_bpe_tokenizer(lines, vocab_size=280, min_frequency=1)
    tokenizer.save_pretrained(tmp_path)
    ssmhub.DLRForCausalLM(
        ssmhub.DLRConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, state_size=4)
    ).save_pretrained(tmp_path)
    expected = tokenizer("the river runs")["input_ids"]
    script = textwrap.dedent(f"""
        import sys
        sys.modules["ssmhub"] = None  # any import of ssmhub now raises ImportError
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained({str(tmp_path)!r})
        assert tokenizer("the river runs")["input_ids"] == {expected!r}
        print("tokenizer OK")
        """)
    env = {"HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120, stdin=subprocess.DEVNULL
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "tokenizer OK", result.stdout  # no "Do you wish to run the custom code?"
    # transformers, not knowing model_type "dlr" without ssmhub, still logs that it reads config.json as a plain
    # PreTrainedConfig ("You are using a model of type `dlr` to instantiate a model of type ``"); nothing else
    assert "custom code" not in result.stderr and "trust_remote_code" not in result.stderr, result.stderr[-3000:]
    assert "auto_map" not in json.loads((tmp_path / "config.json").read_text())


def test_registering_for_an_auto_class_saves_the_code_as_transformers_does(tmp_path, monkeypatch):
    """transformers' habit for custom models: ``register_for_auto_class`` makes ``save_pretrained`` (and so
    ``push_to_hub``) write the code and ``auto_map``; ``save_code=True`` does it for one save."""
    model = ssmhub.DLRForCausalLM(ssmhub.DLRConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, state_size=4))
    monkeypatch.setattr(ssmhub.DLRForCausalLM, "_saves_code", False)  # put back after the test
    ssmhub.DLRForCausalLM.register_for_auto_class("AutoModelForCausalLM")
    model.save_pretrained(tmp_path / "registered")
    model.save_pretrained(tmp_path / "opted-out", save_code=False)
    monkeypatch.setattr(ssmhub.DLRForCausalLM, "_saves_code", False)
    model.save_pretrained(tmp_path / "one-save", save_code=True)
    for name, has_code in [("registered", True), ("opted-out", False), ("one-save", True)]:
        auto_map = json.loads((tmp_path / name / "config.json").read_text()).get("auto_map", {})
        assert ("AutoModelForCausalLM" in auto_map) is has_code, name
        assert (tmp_path / name / "modeling_dlr.py").exists() is has_code, name
