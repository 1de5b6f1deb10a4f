"""Saving, loading (also as remote code, without ssmhub) and the Auto classes.

Every check runs on each family; one that holds for any head uses the family's causal LM or, where it has
none (``dlr-bidirectional``, ``serpent-faithful``), its sequence classifier. Half-precision loads: test_precision.py.
"""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from comparisons import MODEL_REL, same_values
from conftest import auto_class, auto_class_name, every_head, random_ids
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)


def test_registered_with_auto_classes(family):
    config = family.config()
    assert type(AutoConfig.for_model(config.model_type)) is family.config_class
    if family.causal_lm is not None:
        assert type(AutoModelForCausalLM.from_config(config)) is family.causal_lm
    else:  # the LM class of the config's family refuses a configuration that sees the future
        with pytest.raises(ValueError, match=r"causal|bidirectional"):
            AutoModelForCausalLM.from_config(config)
    assert type(AutoModelForSequenceClassification.from_config(family.config(num_labels=2))) is (
        family.sequence_classification
    )
    assert type(AutoModelForTokenClassification.from_config(family.config(num_labels=2))) is (
        family.token_classification
    )
    assert AutoModel.from_config(config).base_model_prefix == "backbone"


def test_save_load_round_trip(any_model, tmp_path):
    ids = random_ids(2, 11)
    any_model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and not list(tmp_path.glob("*.bin"))
    loaded = auto_class(any_model).from_pretrained(tmp_path)
    assert type(loaded) is type(any_model)
    assert list(loaded.state_dict()) == list(any_model.state_dict())
    for (name, a), (_, b) in zip(any_model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), f"{name} changed on load (re-initialized?)"  # a copy of the tensor: exact
    # the same weights, but the reloaded model's forward is a computation of its own: within float32 round-off
    same_values(loaded(ids).logits, any_model(ids).logits, what="logits of the reloaded model")


def test_config_round_trip(family, tmp_path):
    config = family.config(num_labels=4)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert type(loaded) is family.config_class
    # a copy: JSON writes a float's shortest repr, which reads back as the same float
    assert {**loaded.to_dict(), "_name_or_path": ""} == {**config.to_dict(), "_name_or_path": ""}


def test_folder_loads_as_remote_code_without_ssmhub(family, tmp_path):
    """The folder each head of the family saves with ``save_code=True`` carries its code: a Python where
    ``import ssmhub`` fails loads it through its Auto class with trust_remote_code=True and gets the same logits
    within float32 round-off (``MODEL_REL`` of the largest: another process, whose thread count and kernels may
    differ), and the causal LM generates."""
    ids = random_ids(2, 9)
    heads = every_head(family)
    for name, model in heads.items():
        model.save_pretrained(tmp_path / name, save_code=True)
        auto_map = json.loads((tmp_path / name / "config.json").read_text())["auto_map"]
        assert set(auto_map) >= {"AutoConfig", *heads}
    expected = {name: model(ids).logits for name, model in heads.items()}
    torch.save({"ids": ids, "logits": expected}, tmp_path / "expected.pt")
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["ssmhub"] = None  # any import of ssmhub now raises ImportError
        import torch
        import transformers
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        for name, logits in expected["logits"].items():
            model = getattr(transformers, name).from_pretrained({str(tmp_path)!r} + "/" + name, trust_remote_code=True)
            model = model.to(expected["ids"].device)  # the device the expected logits came from
            assert not type(model).__module__.startswith("ssmhub"), type(model).__module__
            scale = logits.abs().max().item() or 1.0
            torch.testing.assert_close(model(expected["ids"]).logits, logits, atol={MODEL_REL} * scale, rtol=0)
            if name == "AutoModelForCausalLM":
                out = model.generate(expected["ids"], max_new_tokens=3, do_sample=False, pad_token_id=0)
                assert out.shape == (2, 12)
            print("remote code OK", name, type(model).__module__)
        assert not any(name == "ssmhub" or name.startswith("ssmhub.") for name, m in sys.modules.items() if m)
        """
    )
    env_home = {"HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env_home, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("remote code OK") == len(heads), result.stdout


def test_resize_token_embeddings(any_model):
    """Resizing grows the embeddings (and keeps an LM head tied to them); a new token id is accepted."""
    any_model.resize_token_embeddings(70, mean_resizing=False)
    assert any_model.config.vocab_size == 70
    assert any_model.get_input_embeddings().weight.shape[0] == 70
    if any_model.get_output_embeddings() is not None:
        assert any_model.get_output_embeddings().weight is any_model.get_input_embeddings().weight
    ids = random_ids(1, 6, vocab=70)
    ids[0, -1] = 69  # a new token id is accepted now
    is_lm = auto_class_name(any_model) == "AutoModelForCausalLM"
    assert any_model(ids).logits.shape == ((1, 6, 70) if is_lm else (1, 3))
