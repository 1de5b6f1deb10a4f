"""Rotary position embeddings in the hybrid attention layer (RoFormer, arXiv 2104.09864 §3.4.2, Eq. 34), as the
released H3 hybrids' attention (flash-attn's ``MHA(rotary_emb_dim=64)``) applies them.

The op is held to the rotation written out per frequency pair as an explicit 2×2 matrix in float64, in both
layouts (flash-attn's default pairs feature i with i + d/2, the interleaved layout 2i with 2i + 1); q·k after the
rotation depends only on the difference of the positions; the layer rotates q and k after the projection and before
attention, and every cached form (the growing state step by step, a prefill then steps, a static state, a sliding
window whose state drops keys, packed rows) gives the numbers of one forward over the whole sequence.

Tolerances: the angle m·θ is rounded in float32, an error of about m·u radians (u = 2^-24), so a rotated feature is
off by about m·u of the vector's size; ``_rotation_rel`` adds that to a few ulps of the products and sums. A layer's
output computed two ways (another length, another blocking of the softmax sums) agrees within ``LAYER_REL``."""

from __future__ import annotations

import math

import pytest
import torch
from comparisons import EPS32, same_values, scaled_close

import ssmhub
from ssmhub.layers.attention import AttentionOptions, CausalSelfAttention
from ssmhub.ops.rotary import apply_rotary, rotary_cos_sin, rotary_embedding

HIDDEN, HEADS = 16, 2  # head width 8
# one attention layer computed two ways: q/k/v projections over 16 terms (4 stages), a rotation (3), scores over 8
# terms (3), a softmax over ≤ 16 keys (≈ 8), the weighted sum (4) and the output projection (4): ≈ 30 rounded stages,
# × 2 ways × u, amplified by the softmax of scores of size ~10: 300 EPS32 of max|y|
LAYER_REL = 300 * EPS32


def _rotation_rel(max_position: int) -> float:
    """The float32 error of a rotation at positions ≤ ``max_position``, relative to the largest feature: the angle's
    rounding (≈ m·u radians, 2 roundings: θ and m·θ) and a few ulps of cos, sin, the products and the sum."""
    return (2 * max_position + 8) * EPS32


# ------------------------------------------------------------------------------------------- the op


def _reference_rotation(x, positions, rotary_dim, base, interleaved):
    """The rotation by its formula, in float64: for each position m and frequency pair i (features (2i, 2i + 1)
    interleaved, (i, i + d/2) otherwise), the 2×2 matrix [[cos mθ_i, −sin mθ_i], [sin mθ_i, cos mθ_i]] times the
    pair, θ_i = base^(−2i/d) (arXiv 2104.09864 Eqs. 13–15); features past ``rotary_dim`` unchanged."""
    x = x.double()
    out = x.clone()
    for t, m in enumerate(positions.tolist()):
        for i in range(rotary_dim // 2):
            a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + rotary_dim // 2)
            angle = m * base ** (-2 * i / rotary_dim)
            rotation = torch.tensor(
                [[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]], dtype=torch.float64
            )
            pair = torch.stack([x[..., t, a], x[..., t, b]], dim=-1)  # (..., 2)
            turned = pair @ rotation.T
            out[..., t, a], out[..., t, b] = turned[..., 0], turned[..., 1]
    return out


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [8, 4])  # the whole head, and part of it (the rest passes through)
def test_the_op_is_the_rotation_of_each_pair(interleaved, rotary_dim):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 6, 8, generator=gen)  # (B, heads, L, d_head)
    positions = torch.tensor([0, 1, 2, 5, 17, 40])
    got = rotary_embedding(x, positions, rotary_dim, base=10000.0, interleaved=interleaved)
    expected = _reference_rotation(x, positions, rotary_dim, 10000.0, interleaved)
    scaled_close(got.double(), expected, rel=_rotation_rel(40), what="rotated features")
    assert torch.equal(got[..., rotary_dim:], x[..., rotary_dim:])  # passed through: a copy, the same bits
    assert torch.equal(got[..., 0, :], x[..., 0, :])  # position 0: cos 1, sin 0, so x·1 − y·0 = x exactly


def test_the_default_layout_pairs_the_two_halves_as_flash_attn_does():
    """Non-interleaved: [x1 cos − x2 sin, x1 sin + x2 cos] with x1, x2 the two halves; one pair, angle 1 rad."""
    x = torch.tensor([[1.0, 0.0]])  # (L=1, d=2): x1 = 1, x2 = 0
    cos, sin = rotary_cos_sin(torch.tensor([1]), 2, base=10000.0)  # θ_0 = 1: the angle is the position
    assert torch.equal(apply_rotary(x, cos, sin), torch.cat([cos, sin], -1))  # [cos 1, sin 1]: the same products
    halves = torch.tensor([[1.0, 2.0, 3.0, 4.0]])  # pairs (1, 3) and (2, 4) non-interleaved, (1, 2), (3, 4) else
    cos, sin = rotary_cos_sin(torch.tensor([1]), 4)
    flat = apply_rotary(halves, cos, sin)
    ref = _reference_rotation(halves, torch.tensor([1]), 4, 10000.0, interleaved=False)
    scaled_close(flat.double(), ref, rel=_rotation_rel(1))
    assert not torch.allclose(flat, apply_rotary(halves, cos, sin, interleaved=True))


def test_angles_are_float32_and_cast_at_the_end():
    """bfloat16 features at large positions: cos and sin are float32's, cast (the same op, the same bits), and
    position 1001 is not rounded to bfloat16's 1000 or 1002."""
    positions = torch.tensor([1000, 1001, 1002])
    cos16, sin16 = rotary_cos_sin(positions, 8, dtype=torch.bfloat16)
    cos32, sin32 = rotary_cos_sin(positions, 8)
    assert cos16.dtype == torch.bfloat16 and cos32.dtype == torch.float32
    assert torch.equal(cos16, cos32.to(torch.bfloat16)) and torch.equal(sin16, sin32.to(torch.bfloat16))
    angle = 1001.0  # pair 0: θ_0 = 1
    assert abs(cos32[1, 0].item() - math.cos(angle)) < _rotation_rel(1001)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [8, 6])
def test_scores_depend_only_on_the_difference_of_positions(interleaved, rotary_dim):
    """q at m and k at n score as q at m + s and k at n + s (arXiv 2104.09864 §3.2.2, Eq. 16)."""
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 3, 5, 8, generator=gen), torch.randn(2, 3, 7, 8, generator=gen)
    q_at, k_at = torch.tensor([0, 3, 4, 9, 12]), torch.tensor([0, 1, 2, 5, 8, 11, 12])
    rotate = {"rotary_dim": rotary_dim, "interleaved": interleaved}
    scores = rotary_embedding(q, q_at, **rotate) @ rotary_embedding(k, k_at, **rotate).transpose(-1, -2)
    norms = q.norm(dim=-1).max() * k.norm(dim=-1).max()  # the size of any score, and of its round-off
    for shift in (1, 7, 50):
        shifted = rotary_embedding(q, q_at + shift, **rotate) @ rotary_embedding(k, k_at + shift, **rotate).mT
        torch.testing.assert_close(shifted, scores, rtol=0, atol=4 * _rotation_rel(62) * norms.item())
    # and the rotation is not the identity: the scores do change with the difference
    plain = q @ k.transpose(-1, -2)
    assert (scores - plain).abs().max() > 0.1 * norms


# ------------------------------------------------------------------------------------------- the layer


def _layer(rotary_emb_dim=8, seed=0, **values):
    torch.manual_seed(seed)
    return CausalSelfAttention(HIDDEN, num_attention_heads=HEADS, rotary_emb_dim=rotary_emb_dim, **values).eval()


def _inputs(batch=2, length=11, pad=3, seed=1):
    gen = torch.Generator().manual_seed(seed)
    x = 2 * torch.randn(batch, length, HIDDEN, generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, :pad] = 0  # row 0 left-padded
    return x, mask


def _naive_rotary_attention(attn, x, rotary_dim, interleaved=False):
    """Causal softmax attention in float64 (no padding) with q and k rotated by :func:`_reference_rotation` right
    after the fused projection (rows q, then k, then v), as flash-attn's MHA applies rotary embeddings."""
    w, b = attn.qkv_proj.weight.double(), attn.qkv_proj.bias.double()
    q, k, v = (x.double() @ w.T + b).chunk(3, dim=-1)
    q, k, v = [t.unflatten(-1, (HEADS, HIDDEN // HEADS)).transpose(1, 2) for t in (q, k, v)]  # (B, heads, L, d_h)
    positions = torch.arange(x.shape[1])
    q = _reference_rotation(q, positions, rotary_dim, attn.rotary_emb_base, interleaved)
    k = _reference_rotation(k, positions, rotary_dim, attn.rotary_emb_base, interleaved)
    scores = q @ k.mT / math.sqrt(q.shape[-1])
    causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
    y = torch.softmax(scores.masked_fill(~causal, -math.inf), dim=-1) @ v
    return y.transpose(1, 2).flatten(2) @ attn.out_proj.weight.double().T + attn.out_proj.bias.double()


@pytest.mark.parametrize(("rotary_dim", "interleaved"), [(8, False), (4, False), (6, True)])
def test_the_layer_rotates_queries_and_keys_after_the_projection(rotary_dim, interleaved):
    attn = _layer(rotary_dim, rotary_emb_interleaved=interleaved)
    x, _ = _inputs(length=9)
    with torch.no_grad():
        y, _ = attn(x)
    same_values(y.double(), _naive_rotary_attention(attn, x, rotary_dim, interleaved), rel=LAYER_REL)
    with torch.no_grad():
        plain, _ = _layer(0)(x)
    assert (y - plain).abs().max() > 0.01 * plain.abs().max()  # same weights (seed 0): the rotation matters


def _step_by_step(attn, x, mask, state):
    outputs = []
    for t in range(x.shape[1]):
        y_t, state = attn(x[:, t : t + 1], mask[:, t : t + 1], state, return_state=True)
        outputs.append(y_t)
    return torch.cat(outputs, 1), state


@pytest.mark.parametrize("interleaved", [False, True])
def test_cached_decoding_token_by_token_equals_one_forward(interleaved):
    attn = _layer(6, rotary_emb_interleaved=interleaved)
    x, mask = _inputs()
    with torch.no_grad():
        full, final = attn(x, mask, return_state=True)
        stepped, state = _step_by_step(attn, x, mask, attn.init_state(2))
    same_values(stepped, full, rel=LAYER_REL, what="token-by-token outputs")
    assert state.keys() == {"key", "value", "key_mask", "position"}
    assert state["position"].tolist() == [11, 11] == final["position"].tolist()  # padded positions counted
    same_values(state["key"], final["key"], rel=LAYER_REL, what="cached (rotated) keys")


def test_prefill_then_steps_and_a_chunk_continue_at_the_state_position():
    attn = _layer(8)
    x, mask = _inputs(length=12)
    with torch.no_grad():
        full, _ = attn(x, mask)
        head, state = attn(x[:, :5], mask[:, :5], return_state=True)
        assert state["position"].tolist() == [5, 5]
        middle, state = _step_by_step(attn, x[:, 5:8], mask[:, 5:8], state)
        tail, state = attn(x[:, 8:], mask[:, 8:], state, return_state=True)  # a cached forward of 4 tokens
    same_values(torch.cat([head, middle, tail], 1), full, rel=LAYER_REL, what="prefill, steps, chunk")
    assert state["position"].tolist() == [12, 12]


def test_a_static_state_rotates_at_its_length():
    attn = _layer(8)
    x, mask = _inputs(length=10)
    with torch.no_grad():
        full, _ = attn(x, mask)
        static = attn.static_state(2, max_length=16)
        assert static.keys() == {"key", "value", "key_mask", "length"}  # the static layout is unchanged
        head, static = attn(x[:, :4], mask[:, :4], static, return_state=True)
        tail, static = _step_by_step(attn, x[:, 4:], mask[:, 4:], static)
    same_values(torch.cat([head, tail], 1), full, rel=LAYER_REL, what="static state")
    assert static["length"].tolist() == [10, 10]


@pytest.mark.parametrize("window", [1, 3, 5])
def test_a_windowed_state_drops_keys_and_keeps_counting_positions(window):
    attn = _layer(8, attention_window=window)
    x, mask = _inputs(length=13)
    with torch.no_grad():
        full, _ = attn(x, mask)
        head, state = attn(x[:, :6], mask[:, :6], return_state=True)
        assert state["key"].shape[2] == window - 1 and state["position"].tolist() == [6, 6]
        tail, state = _step_by_step(attn, x[:, 6:], mask[:, 6:], state)
        stepped, _ = _step_by_step(attn, x, mask, attn.init_state(2))
    same_values(torch.cat([head, tail], 1), full, rel=LAYER_REL, what=f"window {window}: prefill then steps")
    same_values(stepped, full, rel=LAYER_REL, what=f"window {window}: token by token")
    assert state["key"].shape[2] == window - 1 and state["position"].tolist() == [13, 13]
    # a windowed static state (slots are positions) gives the same numbers
    with torch.no_grad():
        static_out, _ = _step_by_step(attn, x, mask, attn.static_state(2, max_length=13))
    same_values(static_out, full, rel=LAYER_REL, what=f"window {window}: static state")


def test_a_left_padded_row_equals_the_row_alone():
    """Left padding shifts a row's positions by its pad; rotary scores only see differences."""
    attn = _layer(8)
    x, mask = _inputs(pad=4)
    with torch.no_grad():
        padded, _ = attn(x, mask)
        alone, _ = attn(x[:1, 4:])
    same_values(padded[0, 4:], alone[0], rel=LAYER_REL, what="left-padded row")


def test_packed_rows_equal_each_document_alone_and_the_stepwise_oracle():
    """Positions run along a packed row (absolute); a query sees only its own document's keys, so each document
    gets what it gets alone at positions 0 .. n − 1."""
    attn = _layer(8)
    x, _ = _inputs(batch=1, length=12)
    lengths = [5, 3, 4]
    starts = torch.zeros(1, 12, dtype=torch.bool)
    starts[0, [0, 5, 8]] = True
    with torch.no_grad():
        packed, state = attn(x, document_starts=starts, return_state=True)
        alone, begin = [], 0
        for n in lengths:
            alone.append(attn(x[:, begin : begin + n])[0])
            begin += n
        stepwise, _ = attn._forward_documents_stepwise(x, None, None, False, starts)
        # the state after the row continues its last document
        more, _ = attn(x[:, :2], state=state)
        last_alone, _ = attn(torch.cat([x[:, 8:], x[:, :2]], 1))
    same_values(packed, torch.cat(alone, 1), rel=LAYER_REL, what="packed vs alone")
    same_values(packed, stepwise, rel=LAYER_REL, what="packed vs stepwise oracle")
    same_values(more, last_alone[:, 4:], rel=LAYER_REL, what="continuing the last document")


def test_no_rotary_is_the_same_op_as_before():
    """rotary_emb_dim=0 (the default): the layer without the option, bit for bit (the same op on the same inputs),
    and the state layout of an attention layer without rotary embeddings (serving and saved caches read it)."""
    x, mask = _inputs()
    torch.manual_seed(0)
    default = CausalSelfAttention(HIDDEN, num_attention_heads=HEADS).eval()
    zero = _layer(0)
    with torch.no_grad():
        y0, s0 = default(x, mask, return_state=True)
        y1, s1 = zero(x, mask, return_state=True)
        t0, _ = default(x[:, :1], mask[:, :1], s0, return_state=True)
        t1, _ = zero(x[:, :1], mask[:, :1], s1, return_state=True)
    assert torch.equal(y0, y1) and torch.equal(t0, t1)  # the same op on the same inputs
    assert s1.keys() == {"key", "value", "key_mask"} == set(zero.state_layout(2))
    assert all(torch.equal(s0[name], s1[name]) for name in s0)
    assert zero.static_state(2, 4).keys() == {"key", "value", "key_mask", "length"}
    assert AttentionOptions().rotary_emb_dim == 0 and ssmhub.H3Config().rotary_emb_dim == 0


def test_gradients_flow_through_the_rotation():
    attn = _layer(8).train()
    x, mask = _inputs()
    x.requires_grad_()
    y, _ = attn(x, mask)
    (grad,) = torch.autograd.grad(y.square().sum(), x)
    assert torch.isfinite(grad).all() and grad.abs().max() > 0


# ------------------------------------------------------------------------------------------- bad values

BAD = [
    ({"rotary_emb_dim": 3}, r"rotary_emb_dim must be even"),
    ({"rotary_emb_dim": 10}, r"rotary_emb_dim \(10\) must be at most the head width 8"),
    ({"rotary_emb_dim": -2}, r"rotary_emb_dim must be an integer >= 0"),
    ({"rotary_emb_base": 0.0}, r"rotary_emb_base must be a positive number"),
    ({"rotary_emb_base": -10.0}, r"rotary_emb_base must be a positive number"),
    ({"rotary_emb_base": math.inf}, r"rotary_emb_base must be a positive number"),
    ({"rotary_emb_base": math.nan}, r"rotary_emb_base must be a positive number"),
]


@pytest.mark.parametrize(("values", "message"), BAD)
def test_bad_values_are_refused_naming_the_field(values, message):
    with pytest.raises(ValueError, match=rf"AttentionOptions\.{message}"):
        CausalSelfAttention(HIDDEN, num_attention_heads=HEADS, **values)
    with pytest.raises(ValueError, match=rf"H3Config\.{message}"):
        ssmhub.H3Config(
            vocab_size=32, hidden_size=HIDDEN, num_hidden_layers=2, attention_layers=[1], num_attention_heads=HEADS,
            **values,
        )  # fmt: skip


def test_the_head_width_bound_follows_the_heads():
    CausalSelfAttention(HIDDEN, num_attention_heads=1, rotary_emb_dim=16)  # one head of 16 features: fits
    with pytest.raises(ValueError, match=r"AttentionOptions\.rotary_emb_dim \(6\) must be at most the head width 4"):
        CausalSelfAttention(HIDDEN, num_attention_heads=4, rotary_emb_dim=6)
    # a config without attention layers builds no attention layer: the head bound does not apply
    assert ssmhub.H3Config(vocab_size=32, hidden_size=HIDDEN, num_hidden_layers=1, rotary_emb_dim=32).rotary_emb_dim
