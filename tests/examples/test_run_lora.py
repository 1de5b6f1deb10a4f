"""examples/peft/run_lora.py: LoRA on the family's projections (or all-linear) trains, and the merged folder is
a plain ssmhub model with the adapted model's logits."""

from __future__ import annotations

import pytest
import torch
from comparisons import same_values
from example_helpers import load_example
from transformers import AutoModelForCausalLM


def _run(tmp_path, tiny_lm, tiny_corpus, *extra):
    argv = ["--model_name_or_path", str(tiny_lm), "--output_dir", str(tmp_path / "lora"), "--do_train",
            "--train_file", str(tiny_corpus["train"]), "--block_size", "16", "--max_steps", "3",
            "--cache_dir", str(tmp_path / "cache"), "--learning_rate", "0.05",
            "--per_device_train_batch_size", "4", "--report_to", "none", *extra]  # fmt: skip
    return load_example("peft/run_lora.py").main(argv)


@pytest.mark.parametrize("targets", ["family", "all-linear"])
def test_merged_model_has_the_adapted_logits_and_differs_from_the_base(tmp_path, tiny_lm, tiny_corpus, targets):
    merged = _run(tmp_path, tiny_lm, tiny_corpus, "--target_modules", targets).eval()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "lora" / "merged").eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_lm).eval()
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        same_values(reloaded(ids).logits, merged(ids).logits, what="logits")  # a reloaded model: to MODEL_REL
        assert (reloaded(ids).logits - base(ids).logits).abs().max() > 1e-4  # the adapters learned something
    assert (tmp_path / "lora" / "adapter_config.json").is_file()


def test_family_targets_are_the_families_projections(tiny_lm):
    lora = load_example("peft/run_lora.py")
    base = AutoModelForCausalLM.from_pretrained(tiny_lm)
    names = lora.family_target_modules(base)
    assert names and all(name.split(".")[-1] in {"output_linear", "up_proj", "down_proj"} for name in names)
    assert "lm_head" not in names


@pytest.mark.parametrize("config_class", ["H3Config", "SerpentConfig", "BDLRNNConfig"])
def test_every_family_has_default_targets(config_class):
    import ssmhub

    lora = load_example("peft/run_lora.py")
    config = getattr(ssmhub, config_class)(vocab_size=32, hidden_size=24, num_hidden_layers=1)
    names = lora.family_target_modules(AutoModelForCausalLM.from_config(config))
    assert names and "lm_head" not in names
