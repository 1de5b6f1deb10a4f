"""The model a serving engine builds from a folder (ssmhub.serving.servable.served_model) in bfloat16, vLLM's dtype
on a CPU without ``--dtype``: every parameter has the dtype ``from_pretrained(dtype=torch.bfloat16)`` gives it, the
recurrence's float32 (tests/conformance/test_precision.py holds that load to the float32 model), and the same
values once the folder's tensors are loaded."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "conformance"))
from families import FAMILIES

from ssmhub.serving.servable import served_model

CAUSAL = [f for f in FAMILIES if f.causal_lm is not None]


@pytest.mark.parametrize("family", CAUSAL, ids=lambda f: f.name)
def test_a_bfloat16_served_model_is_the_bfloat16_load(family, tmp_path):
    torch.manual_seed(0)
    family.causal_lm(family.config()).save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    served = served_model(loaded.config, torch.bfloat16)
    served.load_named_tensors(AutoModelForCausalLM.from_pretrained(tmp_path).state_dict().items())
    expected = {name: p.dtype for name, p in loaded.named_parameters()}
    assert {name: p.dtype for name, p in served.model.named_parameters()} == expected
    assert any(dtype == torch.float32 for dtype in expected.values()) or family.name == "bdlrnn-paper"
    for (name, p), q in zip(served.model.named_parameters(), loaded.parameters()):
        assert torch.equal(p, q), name  # the same float32 tensor rounded to the same dtype: exact
