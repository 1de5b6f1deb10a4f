"""Saving, loading (also as remote code, without ssmhub) and the Auto classes."""

import json
import subprocess
import sys
import textwrap

import torch
from conftest import random_ids
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification


def test_registered_with_auto_classes(family):
    config = family.config()
    assert type(AutoConfig.for_model(config.model_type)) is family.config_class
    if family.causal_lm is not None:
        assert type(AutoModelForCausalLM.from_config(config)) is family.causal_lm
    assert type(AutoModelForSequenceClassification.from_config(family.config(num_labels=2))) is (
        family.sequence_classification
    )
    assert AutoModel.from_config(config).base_model_prefix == "backbone"


def test_save_load_round_trip(causal_lm, tmp_path):
    ids = random_ids(2, 11)
    causal_lm.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and not list(tmp_path.glob("*.bin"))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded) is type(causal_lm)
    for (name, a), (_, b) in zip(causal_lm.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), f"{name} changed on load (re-initialized?)"
    torch.testing.assert_close(loaded(ids).logits, causal_lm(ids).logits, atol=0, rtol=0)


def test_half_precision_load_keeps_recurrence_in_fp32(causal_lm, tmp_path):
    causal_lm.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    dtypes = {name: p.dtype for name, p in loaded.named_parameters()}
    assert all(d == torch.float32 for n, d in dtypes.items() if ".ssm." in n)
    assert dtypes["backbone.embeddings.weight"] == torch.bfloat16 and loaded.lm_head.weight.dtype == torch.bfloat16
    out = loaded(random_ids(2, 40))
    assert torch.isfinite(out.logits).all()


def test_config_round_trip(family, tmp_path):
    config = family.config(num_labels=4)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert type(loaded) is family.config_class
    assert {**loaded.to_dict(), "_name_or_path": ""} == {**config.to_dict(), "_name_or_path": ""}


def test_folder_loads_as_remote_code_without_ssmhub(causal_lm, classifier, tmp_path):
    """The saved folder carries its code: a Python where ``import ssmhub`` fails loads it with
    trust_remote_code=True and gets the same logits."""
    ids = random_ids(2, 9)
    lm_dir, cls_dir = tmp_path / "lm", tmp_path / "cls"
    causal_lm.save_pretrained(lm_dir)
    classifier.save_pretrained(cls_dir)
    auto_map = json.loads((lm_dir / "config.json").read_text())["auto_map"]
    assert set(auto_map) >= {"AutoConfig", "AutoModelForCausalLM", "AutoModelForSequenceClassification"}
    torch.save({"ids": ids, "lm": causal_lm(ids).logits, "cls": classifier(ids).logits}, tmp_path / "expected.pt")
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["ssmhub"] = None  # any import of ssmhub now raises ImportError
        import torch
        from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        lm = AutoModelForCausalLM.from_pretrained({str(lm_dir)!r}, trust_remote_code=True)
        cls = AutoModelForSequenceClassification.from_pretrained({str(cls_dir)!r}, trust_remote_code=True)
        assert not type(lm).__module__.startswith("ssmhub"), type(lm).__module__
        assert not any(name == "ssmhub" or name.startswith("ssmhub.") for name, m in sys.modules.items() if m)
        torch.testing.assert_close(lm(expected["ids"]).logits, expected["lm"], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(cls(expected["ids"]).logits, expected["cls"], atol=1e-6, rtol=1e-6)
        out = lm.generate(expected["ids"], max_new_tokens=3, do_sample=False, pad_token_id=0)
        assert out.shape == (2, 12)
        print("remote code OK", type(lm).__module__)
        """
    )
    env_home = {"HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env_home, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "remote code OK" in result.stdout


def test_resize_token_embeddings_keeps_the_head_tied(causal_lm):
    causal_lm.resize_token_embeddings(70, mean_resizing=False)
    assert causal_lm.config.vocab_size == 70
    assert causal_lm.lm_head.weight is causal_lm.get_input_embeddings().weight
    ids = random_ids(1, 6, vocab=70)
    ids[0, -1] = 69  # a new token id is accepted now
    assert causal_lm(ids).logits.shape == (1, 6, 70)
