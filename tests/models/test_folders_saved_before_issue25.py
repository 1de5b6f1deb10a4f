"""Folders saved before the mixer-protocol refactor (issue 25) still load, weight for weight.

``data/saved_before_issue25.json`` holds, per conformance family, the ``config.json`` and the safetensors
layout (names, shapes, dtypes) that ``save_pretrained`` wrote at commit 65db3c4. The test rebuilds such a folder
with random weights and loads it with today's code: every tensor must land in a parameter or buffer of the same
name, none may be missing or left over, and the values must be the saved ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

import ssmhub  # noqa: F401  (registers the families)

SAVED = json.loads((Path(__file__).parent / "data" / "saved_before_issue25.json").read_text())
DTYPES = {"F32": torch.float32, "F64": torch.float64}


def _write_old_folder(folder: Path, saved: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tensors = {
        name: torch.randn(shape, generator=generator).to(DTYPES[dtype]) for name, (shape, dtype) in saved.items()
    }
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return tensors


@pytest.mark.parametrize("name", sorted(SAVED))
def test_a_folder_saved_before_the_refactor_loads_every_tensor(name, tmp_path):
    entry = SAVED[name]
    (tmp_path / "config.json").write_text(json.dumps(entry["config"]))
    written = _write_old_folder(tmp_path, entry["tensors"])
    architecture = entry["config"]["architectures"][0]
    auto = AutoModelForCausalLM if architecture.endswith("ForCausalLM") else AutoModelForSequenceClassification
    model, info = auto.from_pretrained(tmp_path, output_loading_info=True)
    assert type(model).__name__ == architecture
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    state = model.state_dict()
    for key, value in written.items():
        torch.testing.assert_close(state[key], value, atol=0, rtol=0, msg=key)  # loaded as written: a copy
