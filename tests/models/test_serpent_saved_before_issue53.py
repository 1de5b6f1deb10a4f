"""A SeRpEnt saved before the additive branch layout (issue 53) loads to the logits it gave then.

``data/serpent_saved_before_issue53.json`` holds a tiny causal SeRpEnt (two resampling branches) written with the
code of commit 61de9e4: its ``config.json`` (no ``branch_layout`` field then), every weight, input ids and the
logits that code computed. Its config selects the layout it was written with (``"concatenated"``), every tensor
lands in a parameter of the same name, and the logits agree to float32 round-off (another CPU code path or thread
count may round the matmuls differently).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

import ssmhub

SAVED = json.loads((Path(__file__).parent / "data" / "serpent_saved_before_issue53.json").read_text())


def _write_folder(folder: Path) -> dict[str, torch.Tensor]:
    tensors = {
        name: torch.tensor(entry["values"], dtype=torch.float32).reshape(entry["shape"])
        for name, entry in SAVED["tensors"].items()
    }
    (folder / "config.json").write_text(json.dumps(SAVED["config"]))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return tensors


def test_an_old_config_selects_the_concatenated_layout(tmp_path):
    _write_folder(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    assert "branch_layout" not in SAVED["config"] and config.branch_layout == "concatenated"
    assert ssmhub.SerpentConfig().branch_layout == "additive"  # what a new config gets
    resaved = tmp_path / "resaved"
    config.save_pretrained(resaved)
    assert json.loads((resaved / "config.json").read_text())["branch_layout"] == "concatenated"


def test_an_old_folder_loads_every_tensor_and_gives_its_logits(tmp_path):
    written = _write_folder(tmp_path)
    model, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    state = model.state_dict()
    for name, value in written.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=0, msg=name)
    ids = torch.tensor(SAVED["input_ids"])
    with torch.no_grad():
        logits = model.eval()(ids).logits
    expected = torch.tensor(SAVED["logits"]).reshape(logits.shape)
    scale = expected.abs().max().item()
    assert (logits - expected).abs().max().item() <= 64 * torch.finfo(torch.float32).eps * max(scale, 1.0)


def test_an_old_model_decays_the_weights_it_decayed_then(tmp_path):
    """θ_Δ and θ_Γ were ``nn.Linear`` maps when the folder was written and are modules of their own now: weight
    decay (``optimizer_param_groups``) still takes every matrix of a linear map, theirs included, and no bias."""
    _write_folder(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    decayed = {id(p) for p in model.optimizer_param_groups(weight_decay=0.1)[0]["params"]}
    names = {name for name, p in model.named_parameters() if id(p) in decayed}
    assert {name.rsplit(".", 2)[-2] for name in names if ".resampled." in name} >= {"step_proj", "compress"}
    assert all(name.endswith(".weight") for name in names)
