"""examples/convert/convert_mamba_to_serpent.py writes a SeRpEnt folder whose logits are Mamba's, and fails
when they are not."""

from __future__ import annotations

import pytest
import torch
from example_helpers import load_example
from transformers import AutoModelForCausalLM, MambaConfig, MambaForCausalLM


@pytest.fixture(scope="module")
def mamba_folder(tmp_path_factory):
    torch.manual_seed(0)
    config = MambaConfig(vocab_size=64, hidden_size=32, state_size=8, num_hidden_layers=2, use_mambapy=False)
    folder = tmp_path_factory.mktemp("mamba")
    MambaForCausalLM(config).save_pretrained(folder)
    return folder


def test_converted_folder_loads_as_serpent_with_mambas_logits(mamba_folder, tmp_path):
    convert = load_example("convert/convert_mamba_to_serpent.py")
    difference = convert.main(["--mamba_path", str(mamba_folder), "--output_dir", str(tmp_path / "serpent")])
    assert difference <= 1e-4
    serpent = AutoModelForCausalLM.from_pretrained(tmp_path / "serpent")
    assert serpent.config.model_type == "serpent"


def test_the_check_fails_on_different_logits(mamba_folder, tmp_path, monkeypatch):
    convert = load_example("convert/convert_mamba_to_serpent.py")
    real = convert.max_logit_difference
    monkeypatch.setattr(convert, "max_logit_difference", lambda *args, **kwargs: real(*args, **kwargs) + 1.0)
    with pytest.raises(SystemExit) as exit_info:
        convert.main(["--mamba_path", str(mamba_folder), "--output_dir", str(tmp_path / "serpent")])
    assert exit_info.value.code == 1
