"""H3 distillation: long kernels fitted in modal form, decoded with a state independent of the context."""

from __future__ import annotations

import pytest
import torch

import ssmhub
from ssmhub.layers.h3 import H3Mixer


def tiny_config(**overrides):
    base = {
        "vocab_size": 40,
        "hidden_size": 8,
        "num_hidden_layers": 2,
        "intermediate_size": 16,
        "max_kernel_length": 48,
        "attention_layers": [1],
        "num_attention_heads": 2,
        "squash_lambda": 0.0,
    }
    return ssmhub.H3Config(**{**base, **overrides})


def test_distilled_layer_decodes_like_its_forward():
    torch.manual_seed(0)
    mixer = H3Mixer(8, max_kernel_length=32, ssm_num_heads=4, squash_lambda=0.0).eval()
    errors = mixer.distill(6)
    assert errors.shape == (4,) and torch.all(errors >= 0)
    x = torch.randn(2, 20, 8)
    full, _ = mixer(x)
    # prefill 7 tokens, then one token at a time: equals the full forward
    y, state = mixer(x[:, :7], return_state=True)
    assert state["kv_state"].shape == (2, 2, 2, 4, 6) and state["kv_state"].is_complex()
    steps = [y]
    for t in range(7, 20):
        y_t, state = mixer.step(x[:, t], state)
        steps.append(y_t.unsqueeze(1))
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-4)
    # the effective kernel is the modal one, and it matches the learned kernel to the reported error
    learned, fitted = mixer.long_conv(32), mixer.kernel(32)
    recomputed = (learned - fitted).norm(dim=-1) / learned.norm(dim=-1)
    torch.testing.assert_close(recomputed, errors, atol=1e-4, rtol=1e-3)


def test_more_modes_fit_better_and_outputs_approach_the_exact_model():
    torch.manual_seed(0)
    model = ssmhub.H3ForCausalLM(tiny_config()).eval()
    ids = torch.randint(0, 40, (2, 40))
    with torch.no_grad():
        exact = model(ids).logits
    gaps, errors = [], []
    for modes in (2, 8):
        distilled = ssmhub.H3ForCausalLM(tiny_config()).eval()
        distilled.load_state_dict(model.state_dict())
        report = distilled.distill_for_decoding(modes)
        assert list(report) == ["backbone.layers.0.mixer"]
        errors.append(report["backbone.layers.0.mixer"].mean().item())
        with torch.no_grad():
            gaps.append((distilled(ids).logits - exact).abs().max().item())
    assert errors[1] < errors[0] and gaps[1] < gaps[0]


def test_distilled_model_saves_loads_and_generates(tmp_path):
    torch.manual_seed(0)
    model = ssmhub.H3ForCausalLM(tiny_config()).eval()
    model.distill_for_decoding(4)
    assert model.config.decode_num_modes == 4
    model.save_pretrained(tmp_path)
    loaded = ssmhub.H3ForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 40, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=0, rtol=0)
    out = loaded.generate(ids, max_new_tokens=6, do_sample=False)
    # greedy decoding through the modal state equals re-running the full forward each step
    manual = ids
    with torch.no_grad():
        for _ in range(6):
            next_id = loaded(manual).logits[:, -1].argmax(-1, keepdim=True)
            manual = torch.cat([manual, next_id], 1)
    assert torch.equal(out, manual)
    bf16 = ssmhub.H3ForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert bf16.backbone.layers[0].mixer.ssm.log_modulus.dtype == torch.float32


def test_bad_requests():
    only_attention = ssmhub.H3ForCausalLM(tiny_config(num_hidden_layers=1, attention_layers=[0]))
    with pytest.raises(ValueError, match="no long convolutions to distill"):
        only_attention.distill_for_decoding(4)
    with pytest.raises(ValueError, match="num_modes must be an integer >= 1"):
        ssmhub.H3ForCausalLM(tiny_config()).distill_for_decoding(0)
    with pytest.raises(ValueError, match="attention_layers holds 5"):
        tiny_config(attention_layers=[5])
    with pytest.raises(ValueError, match="max_kernel_length must be an integer >= 1"):
        tiny_config(max_kernel_length=0)
    with pytest.raises(ValueError, match="squash_lambda must be a non-negative number"):
        tiny_config(squash_lambda=-0.1)
