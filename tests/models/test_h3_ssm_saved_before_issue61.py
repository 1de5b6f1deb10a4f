"""A diagonal-SSM H3 saved before the bilinear discretization (issue 61) loads to the logits it gave then.

``data/h3_ssm_saved_before_issue61.json`` holds a tiny causal H3 with diagonal SSMs (two layers, N = 6) written by
the code of commit 0437806, which had only the zero-order hold: its ``config.json`` (no ``ssm_discretization``
field then), every weight (moved off their init by 𝒩(0, 0.05²), the SSM's own excepted), input ids and the logits
that code computed. Its config selects the discretization it was written with (``"zoh"``), every tensor lands in
a parameter of the same name, and the logits agree to float32 round-off (another CPU code path or thread count may
round the matmuls and FFTs differently).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

import ssmhub

SAVED = json.loads((Path(__file__).parent / "data" / "h3_ssm_saved_before_issue61.json").read_text())


def _write_folder(folder: Path) -> dict[str, torch.Tensor]:
    tensors = {
        name: torch.tensor(entry["values"], dtype=torch.float32).reshape(entry["shape"])
        for name, entry in SAVED["tensors"].items()
    }
    (folder / "config.json").write_text(json.dumps(SAVED["config"]))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return tensors


def test_an_old_config_selects_the_zero_order_hold(tmp_path):
    _write_folder(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    assert "ssm_discretization" not in SAVED["config"] and config.ssm_discretization == "zoh"
    assert ssmhub.H3Config().ssm_discretization == "bilinear"  # what a new config gets
    resaved = tmp_path / "resaved"
    config.save_pretrained(resaved)
    assert json.loads((resaved / "config.json").read_text())["ssm_discretization"] == "zoh"


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
