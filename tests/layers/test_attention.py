"""Causal self-attention (the attention layers of H3 hybrids, arXiv 2212.14052 §3.4): held to softmax attention
written out per head (Vaswani et al. 2017, arXiv 1706.03762 §3.2.1) in float64, on outputs and gradients, with
left padding and with keys and values carried in the recurrent cache."""

from __future__ import annotations

import math

import pytest
import torch
from comparisons import scaled_close

from ssmhub.layers.attention import CausalSelfAttention

HIDDEN, HEADS = 16, 4  # head size 4: 1/√d_h and 1/d_h differ by a factor of 2


def _attention(seed=0):
    torch.manual_seed(seed)
    return CausalSelfAttention(HIDDEN, num_attention_heads=HEADS).eval()


def _inputs(batch=2, length=11, pad=3, seed=1):
    """x (B, L, d) scaled so that the scores are far from uniform, and a mask that left-pads row 0 by ``pad``."""
    gen = torch.Generator().manual_seed(seed)
    x = 2 * torch.randn(batch, length, HIDDEN, generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, :pad] = 0
    return x, mask


def _projections(attn, x):
    """q, k, v (B, heads, L, d_h) in float64 from the fused projection (rows q, then k, then v)."""
    w, b = attn.qkv_proj.weight.double(), attn.qkv_proj.bias.double()
    q, k, v = (x.double() @ w.T + b).chunk(3, dim=-1)
    return [t.unflatten(-1, (HEADS, HIDDEN // HEADS)).transpose(1, 2) for t in (q, k, v)]


def _naive_attention(attn, x, mask=None, window=None):
    """Softmax attention by its formula, in float64: per batch row and head, scores ``q_t·k_s / √d_h`` for the
    keys s ≤ t that are real tokens (a query's own key always counts, so a padded query attends to itself) and,
    with a ``window`` W, t − W < s; softmax over those keys, the weighted sum of the values, the heads
    concatenated, the output Linear."""
    q, k, v = _projections(attn, x)
    batch, heads, length, head_dim = q.shape
    keep = torch.ones(batch, length, dtype=torch.bool) if mask is None else mask.bool()
    reach = length if window is None else window
    rows = []
    for b in range(batch):
        allowed = torch.tensor(
            [[t - reach < s <= t and (bool(keep[b, s]) or s == t) for s in range(length)] for t in range(length)]
        )
        heads_out = []
        for h in range(heads):
            scores = q[b, h] @ k[b, h].T / math.sqrt(head_dim)  # (L, L): query t, key s
            weights = torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1)
            heads_out.append(weights @ v[b, h])  # (L, d_h)
        rows.append(torch.cat(heads_out, dim=-1))  # (L, d): channel h·d_h + j
    return torch.stack(rows) @ attn.out_proj.weight.double().T + attn.out_proj.bias.double()


def _grads(attn, x, y, weight):
    """Gradients of ``Σ weight·y`` with respect to x and every parameter."""
    return torch.autograd.grad((y * weight).sum(), [x, *attn.parameters()])


@pytest.mark.parametrize("padded", [False, True], ids=["no_mask", "left_padded"])
def test_forward_and_gradients_match_naive_softmax_attention(padded):
    """Outputs of the real tokens and the gradients (x, q/k/v and output projections) of a loss on them; the
    padded positions' outputs stay finite and, as no real token attends to them, their inputs get no gradient."""
    attn = _attention()
    x, mask = _inputs()
    mask = mask if padded else None
    real = (torch.ones(x.shape[:2]) if mask is None else mask.float())[..., None]  # (B, L, 1)
    weight = torch.randn(x.shape, generator=torch.Generator().manual_seed(2)) * real  # a loss on real tokens only
    x_run, x_ref = x.clone().requires_grad_(), x.double().requires_grad_()
    y, state = attn(x_run, mask=mask)
    y_ref = _naive_attention(attn, x_ref, mask)
    assert state is None and torch.isfinite(y).all()
    scaled_close(y * real, (y_ref * real).detach(), 1e-5, "y")
    names = ["x", *(name for name, _ in attn.named_parameters())]
    grads = _grads(attn, x_run, y, weight)
    for name, grad, grad_ref in zip(names, grads, _grads(attn, x_ref, y_ref, weight)):
        scaled_close(grad, grad_ref, 1e-5, f"grad {name}")
    if padded:
        assert (grads[0][0, :3] == 0).all()  # the padded inputs of row 0: zeroed by the mask, so x·0 gives 0


def test_left_padding_gives_the_numbers_of_the_row_alone():
    attn = _attention()
    x, mask = _inputs(batch=1, pad=4)
    with torch.no_grad():
        y_padded, _ = attn(x, mask=mask)
        y_alone, _ = attn(x[:, 4:])
    scaled_close(y_padded[:, 4:], y_alone, 1e-5, "left-padded row")


def test_prefill_steps_and_chunks_equal_the_full_forward():
    """From an empty cache: a left-padded prefill, single tokens through ``step`` and a last chunk through
    ``forward``. Outputs and gradients equal the full forward's; the cache holds every token's key and value (the
    fused projection's k and v rows, per head, of the inputs with padding zeroed) and the padding mask."""
    attn = _attention()
    x, mask = _inputs(length=12)
    weight = torch.randn(x.shape, generator=torch.Generator().manual_seed(2)) * mask[..., None]
    x_full, x_split = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_full, state_full = attn(x_full, mask=mask, return_state=True)

    y_a, state = attn(x_split[:, :5], mask=mask[:, :5], state=attn.init_state(2), return_state=True)
    outs = [y_a]
    for t in range(5, 8):
        y_t, state = attn.step(x_split[:, t], state)
        assert state["key"].shape == (2, HEADS, t + 1, HIDDEN // HEADS)
        outs.append(y_t.unsqueeze(1))
    y_b, state = attn(x_split[:, 8:], mask=mask[:, 8:], state=state, return_state=True)
    y_split = torch.cat([*outs, y_b], dim=1)

    real = mask[..., None].bool()
    scaled_close(y_split * real, (y_full * real).detach(), 1e-5, "y split")
    scaled_close(y_full * real, (_naive_attention(attn, x, mask) * real).detach(), 1e-5, "y vs naive")
    for grad_split, grad_full in zip(_grads(attn, x_split, y_split, weight), _grads(attn, x_full, y_full, weight)):
        scaled_close(grad_split, grad_full, 1e-5, "grad split")  # summation order varies with the thread count

    _, k_expected, v_expected = _projections(attn, x * mask[..., None])  # the protocol zeroes padded inputs
    for cache in (state, state_full):
        scaled_close(cache["key"].detach(), k_expected.detach(), 1e-5, "cached keys")
        scaled_close(cache["value"].detach(), v_expected.detach(), 1e-5, "cached values")
        assert torch.equal(cache["key_mask"], mask.bool())


def test_init_state_is_empty_and_bad_arguments_are_named():
    state = _attention().init_state(3)
    assert state["key"].shape == (3, HEADS, 0, HIDDEN // HEADS) and state["key_mask"].shape == (3, 0)
    with pytest.raises(ValueError, match="num_attention_heads"):
        CausalSelfAttention(HIDDEN, num_attention_heads=3)
    with pytest.raises(ValueError, match="attention_dropout"):
        CausalSelfAttention(HIDDEN, num_attention_heads=HEADS, attention_dropout=1.0)


@pytest.mark.parametrize("window", [1, 3, 5])
def test_sliding_window_matches_its_formula_and_carries_only_w_minus_1_keys(window):
    """``attention_window=W``: a query attends to its last W positions in the full forward, and a cached run
    in uneven chunks (a left-padded prefill, steps, a chunk) gives the same outputs while its state never
    holds more than W − 1 keys and values (memory flat in the context)."""
    torch.manual_seed(0)
    attn = CausalSelfAttention(HIDDEN, num_attention_heads=HEADS, attention_window=window).eval()
    x, mask = _inputs(length=12)
    with torch.no_grad():
        y_full, _ = attn(x, mask=mask)
        state, outs = attn.init_state(2), []
        for begin, end in [(0, 4), (4, 5), (5, 6), (6, 12)]:
            y, state = attn(x[:, begin:end], mask=mask[:, begin:end], state=state, return_state=True)
            assert state["key"].shape[2] == min(end, window - 1) == state["key_mask"].shape[1]
            outs.append(y)
    real = mask[..., None].bool()
    scaled_close(y_full * real, _naive_attention(attn, x, mask, window) * real, 1e-5, "windowed vs naive")
    scaled_close(torch.cat(outs, 1) * real, y_full * real, 1e-5, "windowed, cached in chunks")
    if window < 12:  # the window changes the numbers once a sequence is longer than it
        assert not torch.allclose(y_full[1], _naive_attention(attn, x, mask)[1].float(), atol=1e-4)


def test_attention_window_is_checked():
    with pytest.raises(ValueError, match=r"AttentionOptions\.attention_window must be an integer >= 1"):
        CausalSelfAttention(HIDDEN, num_attention_heads=HEADS, attention_window=0)
