"""SeRpEnt under weight-only int8 quantization (PyTorch's ``quantize_dynamic`` and torchao's ``quantize_``): the
forward runs, since SeRpEnt reads no ``nn.Linear``'s weight tensor directly (θ_Δ and θ_Γ are not ``nn.Linear``s
and stay float32), and its logits stay near the float model's (int8 rounding: a few % of their scale)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import ssmhub


@pytest.fixture(scope="module")
def model_and_logits():
    torch.manual_seed(0)
    config = ssmhub.SerpentConfig(
        vocab_size=64,
        hidden_size=64,
        num_hidden_layers=2,
        state_size=4,
        time_step_rank=4,  # torchao cannot quantize a Linear with one input feature (Mamba's Δ rank of ⌈H/16⌉)
        resampling_rates=[0.5, 0.25],
        resampling_window=3,
        resampling_branch_size=32,
    )
    model = ssmhub.SerpentForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "output_proj" in name:  # trained-looking branches (they start at zero)
                parameter.normal_(0, 0.1)
    ids = torch.randint(3, 64, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model, ids, model(ids).logits


def _assert_near(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert torch.isfinite(got).all()
    assert (got - expected).abs().max() <= 0.05 * expected.abs().max()


def test_quantize_dynamic_runs_the_forward(model_and_logits):
    model, ids, expected = model_and_logits
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation
        quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)
    with torch.no_grad():
        _assert_near(quantized(ids).logits, expected)


def test_torchao_int8_weight_only_runs_the_forward(model_and_logits):
    quantization = pytest.importorskip("torchao.quantization")
    model, ids, expected = model_and_logits
    quantized = copy.deepcopy(model)
    quantization.quantize_(quantized, quantization.Int8WeightOnlyConfig())
    with torch.no_grad():
        _assert_near(quantized(ids).logits, expected)
