"""H3 distillation: long kernels fitted in modal form, decoded with a state independent of the context."""

from __future__ import annotations

import pytest
import torch
from comparisons import MODEL_REL, same_values

import ssmhub
from ssmhub.layers.h3 import H3Mixer
from ssmhub.ops.longconv import causal_conv_ref
from ssmhub.ops.modal import fit_modal_kernel


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
    errors = mixer.distill(6).errors
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
        errors.append(report["backbone.layers.0.mixer"].errors.mean().item())
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
    with torch.no_grad():  # a reloaded model: the same function to float32 round-off (comparisons.py)
        same_values(loaded(ids).logits, model(ids).logits, MODEL_REL, "reloaded logits")
    out = loaded.generate(ids, max_new_tokens=6, do_sample=False)
    # greedy decoding through the modal state equals re-running the full forward each step: greedy tokens are
    # integers, compared exactly (comparisons.py)
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


def _mixed_mixer(seed=0, hidden=8, heads=4, modes=6):
    """A layer whose heads' fits straddle the tolerance: some distilled, some left exact."""
    torch.manual_seed(seed)
    mixer = H3Mixer(hidden, max_kernel_length=32, ssm_num_heads=heads, squash_lambda=0.0).eval()
    report = mixer.distill(modes, tolerance=0.3)
    assert 0 < len(report.exact_heads) < heads
    return mixer, report


# (seed, hidden, heads, modes): one order for every distilled head; three orders (2, 4, 8) and one exact head
MIXED_LAYERS = [(0, 8, 4, 6), (1, 16, 8, 8)]


def test_tolerance_is_honoured_head_by_head():
    torch.manual_seed(0)
    mixer = H3Mixer(8, max_kernel_length=32, ssm_num_heads=4, squash_lambda=0.0).eval()
    learned = mixer.long_conv(32).detach()
    report = mixer.distill(6, tolerance=0.3)
    effective = (learned - mixer.kernel(32)).norm(dim=-1) / learned.norm(dim=-1)  # (H,): what the layer computes
    ladder = [1, 2, 4, 6]
    fits = {n: fit_modal_kernel(learned, n, method="best").relative_error for n in ladder}
    for head in range(4):
        if head in report.exact_heads:
            assert report.orders[head] == 0 and report.fit_errors[head] > 0.3
            assert effective[head] == 0  # the learned kernel itself: the same op on the same parameters, copied
            assert all(fits[n][head] > 0.3 for n in ladder)
        else:
            order = int(report.orders[head])
            assert effective[head] <= 0.3 + 1e-5 and abs(effective[head] - report.errors[head]) < 1e-4
            assert all(fits[n][head] > 0.3 for n in ladder if n < order)  # the smallest order that meets it
    assert report.state_bytes < report.exact_state_bytes
    assert report.state_bytes == mixer.kv_state_bytes()
    # a loose tolerance: every head meets it, each at the smallest order of the ladder that does
    loose = mixer.distill(6, tolerance=0.6)
    expected = [next(n for n in ladder if fits[n][head] <= 0.6) for head in range(4)]
    assert loose.orders.tolist() == expected and min(expected) < 6


@pytest.mark.parametrize("layer", MIXED_LAYERS)
def test_mixed_exact_and_distilled_decoding_equals_the_full_forward(layer):
    mixer, report = _mixed_mixer(*layer)
    hidden, dh = mixer.hidden_size, mixer.head_dim
    layout = mixer.state_layout(2)
    # one modal state per order, each exactly that wide (no head padded to the layer's largest order)
    orders = sorted(set(report.orders.tolist()) - {0})
    names = ["kv_state"] if len(orders) == 1 else [f"kv_state_{n}" for n in orders]
    for name, order in zip(names, orders):
        assert layout[name] == ((2, dh, dh, int((report.orders == order).sum()), order), torch.complex64)
    assert layout["kv_window"][0] == (2, dh, dh, len(report.exact_heads), 31)
    assert set(layout) == {"shift_state", "kv_window", *names}
    modal_bytes = 8 * dh * dh * int(report.orders.sum())  # complex64 per mode actually used
    assert report.state_bytes == modal_bytes + 4 * dh * dh * 31 * len(report.exact_heads)
    x = torch.randn(2, 40, hidden)  # longer than L_max: the exact heads' windows roll
    full, _ = mixer(x)
    # oracle: the convolution with the mixed kernel (learned for exact heads, modal for the rest)
    kernel = mixer.kernel(40)
    exact = torch.tensor(report.exact_heads)
    torch.testing.assert_close(kernel[exact], mixer.long_conv(40)[exact].detach())
    # the full forward against the reference convolution (double loop) with that mixed kernel
    q, k, v = mixer.in_proj(x).chunk(3, dim=-1)
    k_shift, _ = mixer._shift(k.float(), None, False)
    skip = mixer.long_conv.skip

    def reference_conv(kv):
        return causal_conv_ref(kv, kernel, skip).float(), None

    o, _ = mixer._mix(q.transpose(1, 2).float(), k_shift, v.transpose(1, 2).float(), reference_conv)
    torch.testing.assert_close(full, mixer.out_proj(o.transpose(1, 2)), atol=1e-5, rtol=1e-4)
    y, state = mixer(x[:, :9], return_state=True)
    steps = [y]
    for t in range(9, 40):
        y_t, state = mixer.step(x[:, t], state)
        steps.append(y_t.unsqueeze(1))
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-4)
    y2, _ = mixer(x[:, 20:], state=mixer(x[:, :20], return_state=True)[1])  # prefill continued by a forward
    torch.testing.assert_close(y2, full[:, 20:], atol=1e-5, rtol=1e-4)


def test_mixed_model_saves_loads_and_generates(tmp_path):
    torch.manual_seed(1)
    model = ssmhub.H3ForCausalLM(tiny_config(attention_layers=[], squash_lambda=0.0)).eval()
    reports = model.distill_for_decoding(8, tolerance=0.3)
    exact = {name: r.exact_heads for name, r in reports.items()}
    assert any(exact.values()) and any(len(e) < 8 for e in exact.values())
    model.save_pretrained(tmp_path)
    loaded = ssmhub.H3ForCausalLM.from_pretrained(tmp_path).eval()
    for name, mixer in loaded.named_modules():
        if name in exact:
            assert mixer.ssm.exact_heads.nonzero().flatten().tolist() == exact[name]
    ids = torch.randint(0, 40, (1, 12))
    with torch.no_grad():  # a reloaded model: the same function to float32 round-off (comparisons.py)
        same_values(loaded(ids).logits, model(ids).logits, MODEL_REL, "reloaded logits")
    out = loaded.generate(ids, max_new_tokens=6, do_sample=False)
    manual = ids  # greedy tokens: integers, compared exactly (comparisons.py)
    with torch.no_grad():
        for _ in range(6):
            manual = torch.cat([manual, loaded(manual).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, manual)


def test_hankel_singular_values_per_layer_and_head():
    model = ssmhub.H3ForCausalLM(tiny_config())
    values = model.hankel_singular_values()
    sigma = values["backbone.layers.0.mixer"]
    assert list(values) == ["backbone.layers.0.mixer"] and sigma.shape == (8, 47)
    assert torch.all(sigma[:, 1:] <= sigma[:, :-1])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_modes": 4, "tolerance": 0.0}, "tolerance must be"),
        ({"num_modes": 4, "tolerance": 1.0}, "tolerance must be"),
        ({"num_modes": 4, "tolerance": -0.5}, "tolerance must be"),
        ({"num_modes": 4, "tolerance": True}, "tolerance must be"),
        ({"num_modes": 0, "tolerance": 0.1}, "num_modes must be an integer >= 1"),
        ({"num_modes": 24}, "too large for L_max 48"),
        ({"num_modes": 4, "method": "prony"}, "method must be one of"),
    ],
)
def test_bad_distillation_requests_fail_before_any_fitting(kwargs, message, monkeypatch):
    import ssmhub.layers.h3_distillation as distillation

    def no_fitting(*args, **kwargs):
        raise AssertionError("fitted before checking the request")

    monkeypatch.setattr(distillation, "fit_modal_kernels_threaded", no_fitting)
    model = ssmhub.H3ForCausalLM(tiny_config(num_hidden_layers=3, attention_layers=[1]))
    with pytest.raises(ValueError, match=message):
        model.distill_for_decoding(**kwargs)
    assert model.config.decode_num_modes is None


def test_head_fits_with_the_truncated_eigensolver_stay_within_one_percent_of_the_dense_ones():
    from ssmhub.layers.h3_distillation import HeadFits
    from ssmhub.ops.hankel import uses_krylov

    # trained-like kernels (smoothed noise under decays of 10 to 80 taps: Hankel singular values that fall off);
    # on noise-like kernels (a random init) the truncated basis is looser, see docs/families/h3.md
    gen = torch.Generator().manual_seed(0)
    noise = torch.nn.functional.avg_pool1d(torch.randn(8, 1, 322, generator=gen, dtype=torch.float64), 3, stride=1)
    tau = torch.linspace(10.0, 80.0, 8, dtype=torch.float64)[:, None]
    kernels = (noise[:, 0] * torch.exp(-torch.arange(320, dtype=torch.float64) / tau)).float()  # (8, 320)
    assert uses_krylov(2 * 4, 319)  # long enough for the Krylov route at N = 4
    for tolerance in (None, 0.05):
        fast = HeadFits.fit(kernels, 4, tolerance, "best")  # the default eigensolver: truncated
        dense = HeadFits.fit(kernels, 4, tolerance, "best", eigensolver="dense")
        assert (fast.errors <= 1.01 * dense.errors + 1e-6).all()  # the bound, per head and order
