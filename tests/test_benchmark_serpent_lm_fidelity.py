"""benchmarks/serpent_lm_fidelity.py: the symmetric SeRpEnt is built only inside the script's override, what a
branch output reads (r(l)) matches autograd, and the report warns that the symmetric model is no language model."""

import os
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from serpent_lm_fidelity import (
    SYMMETRIC,
    WARNING,
    SymmetricSerpentForCausalLM,
    branch_reach,
    parameter_split,
    reach_table,
    symmetric_resampling_allowed,
    verdict,
)

from ssmhub.layers.serpent import ResamplingBranch
from ssmhub.models.serpent import SerpentConfig
from ssmhub.models.serpent.modeling_serpent import SerpentForCausalLM


def _tiny_config(mode: str) -> SerpentConfig:
    return SerpentConfig(
        hidden_size=12, num_hidden_layers=1, vocab_size=32, resampling_rates=[0.5], resampling_window=3,
        resampling_mode=mode, branch_layout="concatenated",
    )  # fmt: skip


def test_symmetric_lm_only_inside_the_override_and_registration_restored():
    config = _tiny_config("faithful")
    with pytest.raises(ValueError, match="resampling_mode='causal'"):
        AutoModelForCausalLM.from_config(config)
    with symmetric_resampling_allowed():
        model = AutoModelForCausalLM.from_config(config)
        assert type(model) is SymmetricSerpentForCausalLM
        assert model(input_ids=torch.randint(0, 32, (1, 9)), use_cache=False).logits.shape == (1, 9, 32)
    with pytest.raises(ValueError, match="resampling_mode='causal'"):
        AutoModelForCausalLM.from_config(config)
    assert type(AutoModelForCausalLM.from_config(_tiny_config("causal"))) is SerpentForCausalLM


def _latest_input_by_autograd(branch: ResamplingBranch, x: torch.Tensor) -> torch.Tensor:
    """Reference r(l): the last token k with ∂y_l/∂x_k ≠ 0 (−1 where y_l depends on no token)."""
    length = x.shape[1]
    latest = torch.full((length,), -1, dtype=torch.float64)
    for position in range(length):
        x_leaf = x.detach().clone().requires_grad_(True)
        y, _ = branch(x_leaf)
        (grad,) = torch.autograd.grad(y[0, position].sum(), x_leaf, allow_unused=True)
        touched = (grad[0].abs().sum(-1) > 0).nonzero() if grad is not None else torch.empty(0, 1)
        if len(touched):
            latest[position] = float(touched.max())
    return latest


@pytest.mark.parametrize("mode", ["causal", "faithful"])
def test_branch_reach_matches_autograd(mode):
    torch.manual_seed(0)
    branch = ResamplingBranch(8, 4, 0.3, resampling_window=4, resampling_mode=mode, branch_layout="concatenated")
    branch = branch.double()
    with torch.no_grad():
        branch.step_proj.weight.normal_(0.0, 2.0)  # varied steps Δ_l, so grid points fall unevenly
    x = torch.randn(1, 30, 8, dtype=torch.float64)
    reference = _latest_input_by_autograd(branch, x) - torch.arange(30, dtype=torch.float64)  # r(l) − l
    stats = branch_reach(branch, x)
    has_grid = reference > -torch.arange(30, dtype=torch.float64) - 1  # r(l) ≥ 0
    assert stats["no_grid_point"] == pytest.approx(float((~has_grid).double().mean()))
    assert stats["mean_offset"] == pytest.approx(float(reference[has_grid].mean()))
    assert stats["max_offset"] == pytest.approx(float(reference[has_grid].max()))
    assert stats["reads_later"] == pytest.approx(float((reference > 0).double().mean()))
    assert stats["reads_own_token"] == pytest.approx(float(((reference >= 0) & has_grid).double().mean()))
    if mode == "causal":
        assert stats["max_offset"] <= 0
    else:
        assert stats["reads_later"] > 0.5


def _record(name: str, perplexity: float) -> dict:
    score = {"loss": 1.0, "perplexity": perplexity, "top1": 0.3, "top5": 0.5}
    reach = {"0.5": {"compression": 0.7, "no_grid_point": 0.0, "reads_own_token": 1.0, "reads_later": 0.9,
                     "mean_offset": 4.5, "max_offset": 9.0}} if name == SYMMETRIC else {}  # fmt: skip
    return {"name": name, "scores": {"validation": score}, "reach": reach}


def test_verdict_and_tables():
    records = [_record("mamba", 60.0), _record("serpent-causal", 70.0), _record(SYMMETRIC, 20.0)]
    assert "consistent with its resampling reading later tokens" in verdict(records)
    assert "gains +0.0 top-1 points over Mamba here, where the paper reports +1.2" in verdict(records)
    records[2] = _record(SYMMETRIC, 65.0)
    assert "does not beat Mamba" in verdict(records)
    records.append(_record("serpent-causal-nocompress", 63.0))
    assert "Ablation `serpent-causal-nocompress`: 63.00 ppl / 30.00% top-1 (0.90× causal" in verdict(records)
    assert "| `serpent-symmetric` | 0.5 | 0.700 | 0.0 | 100.0 | 90.0 | +4.50 | +9 |" in reach_table(records)
    assert "is not a language model" in WARNING


def test_parameter_split_counts_every_parameter_once():
    config = _tiny_config("causal")  # H = 12 in 2 branches of 6, K = 3, G = 8
    model = AutoModelForCausalLM.from_config(config)
    split = parameter_split(model)
    assert sum(split.values()) == sum(p.numel() for p in model.parameters())
    assert split["window maps θ_Γ"] == 3 * (12 + 8) * 6 + 6  # θ_Γ of Eq. 12: K·(H + G) → H_b, with its bias
    mamba = AutoModelForCausalLM.from_config(SerpentConfig(hidden_size=12, num_hidden_layers=1, vocab_size=32,
                                                           resampling_rates=[]))  # fmt: skip
    assert parameter_split(mamba)["window maps θ_Γ"] == parameter_split(mamba)["branch Mambas"] == 0
