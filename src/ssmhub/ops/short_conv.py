"""Causal depthwise short convolution over time in the (batch, time, channels) layout, with its own backward.

Mamba's mixer (Gu & Dao 2023, arXiv 2312.00752 §3.4, Fig. 3) filters every inner channel with a causal
depthwise convolution of ``k`` taps (k = 4) before the selective scan:

    ``y[b, t, e] = bias[e] + Σ_{j<k} w[e, j] · x̃[b, t + j, e]``,  ``x̃ = [history ; x]`` along time,

where ``history`` (B, k − 1, E) holds the k − 1 inputs before ``x`` (zeros at the start of a sequence, the
cached window when a forward continues from a decode state), so tap ``k − 1`` meets the newest input. This
is ``F.conv1d`` with ``groups = E`` on the transposed input (the oracle in the tests), but computed as k
shifted multiply-adds on (B, T, E) tensors: the projections around it produce and consume (B, T, E), and
going through ``conv1d``'s (B, E, T) layout costs two transposed copies per direction plus strided
elementwise ops on everything downstream (benchmarks/results/selective_scan.md, "Kernel choices").

Packed rows (several documents back to back, ``starts`` (B, T) bool): no tap crosses a document start, as
if every document ran alone from zeros: the tap ``j`` (lag ``ℓ = k − 1 − j``) of output t is kept only if
the input it meets, ``t − ℓ``, is in t's document (:func:`tap_reach`). The oracle is the convolution of each
document alone (tests/ops/test_short_conv.py).

Padding (``mask`` (B, T), 0 at a pad; left padding and holes inside a row alike): a pad is no input at all, so the
taps of a real token meet the k − 1 real tokens before it, skipping pads, as in the row without its pads (the
mixer protocol: a masked position changes no state, so the decode window holds at a pad). The real tokens are
gathered to the front of the row in order (:func:`real_tokens_first`: indices from cumulative sums of the mask, no
host read), convolved there, and gathered back; a pad's output is 0.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["RealTokens", "causal_depthwise_conv", "conv_window", "real_tokens_first", "tap_reach"]


class RealTokens(NamedTuple):
    """A row's real tokens gathered to its front, in order (pads after them): ``order`` (B, T) int64, the position
    of x that slot s holds; ``slot`` (B, T) int64, the slot of each position (``order``'s inverse); ``count`` (B,)
    int64, the real tokens per row; ``starts`` (B, T) bool or None, the document starts in slot order."""

    order: torch.Tensor
    slot: torch.Tensor
    count: torch.Tensor
    starts: torch.Tensor | None

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, E) in slot order: the real tokens first."""
        return x.gather(1, self.order.unsqueeze(-1).expand_as(x))

    def scatter_back(self, y: torch.Tensor) -> torch.Tensor:
        """y (B, T, E) in slot order back to x's positions."""
        return y.gather(1, self.slot.unsqueeze(-1).expand_as(y))


def real_tokens_first(mask: torch.Tensor, starts: torch.Tensor | None = None) -> RealTokens:
    """The permutation that moves each row's real tokens (``mask`` (B, T) nonzero) to its front, in order, pads
    after them in order, from cumulative sums (no host read). ``starts`` (B, T) bool or None: a document start at a
    pad restarts the state, which the pads after it hold, so it moves to the next real token; a start after a row's
    last real token goes to the slot after it (``count``), where :func:`conv_window` finds it."""
    real = mask != 0  # (B, T)
    count = real.sum(1)  # (B,)
    real_rank = real.cumsum(1) - 1  # (B, T): a real token's slot
    pad_rank = (~real).cumsum(1) - 1  # (B, T): a pad's place among the pads
    slot = torch.where(real, real_rank, count[:, None] + pad_rank)  # (B, T): a permutation of 0..T − 1 per row
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(slot)  # (B, T)
    order = torch.empty_like(slot).scatter_(1, slot, positions)  # (B, T): order[b, slot[b, t]] = t
    if starts is None:
        return RealTokens(order, slot, count, None)
    seen = starts.long().cumsum(1)  # (B, T): document starts at or before t
    slots = torch.arange(mask.shape[1], device=mask.device)  # (T,)
    seen_at_slot = torch.where(slots < count[:, None], seen.gather(1, order), seen[:, -1:])  # (B, T), non-decreasing
    seen_before = torch.cat([seen.new_zeros(seen.shape[0], 1), seen_at_slot[:, :-1]], dim=1)  # (B, T)
    return RealTokens(order, slot, count, seen_at_slot > seen_before)


def tap_reach(starts: torch.Tensor, taps: int, dtype: torch.dtype) -> torch.Tensor:
    """Which lags reach inside the document: starts (B, T) bool -> (B, T, k − 1) in dtype, entry ``ℓ − 1`` is 1
    where lag ℓ (the input ℓ steps back, history included) lies in the same document as t, i.e. no start in
    (t − ℓ, t]; positions before a row's first start continue the history (every lag reaches)."""
    _batch, seq_len = starts.shape
    index = torch.arange(seq_len, device=starts.device)  # (T,)
    last_start = torch.where(starts, index, -1).cummax(dim=1).values  # (B, T): the latest start ≤ t, or −1
    since = torch.where(last_start >= 0, index - last_start, seq_len + taps)  # (B, T): t − its document's start
    lags = torch.arange(1, taps, device=starts.device)  # (k − 1,)
    return (lags <= since.unsqueeze(-1)).to(dtype)  # (B, T, k − 1)


def _reached(t: torch.Tensor, reach: torch.Tensor | None, lag: int) -> torch.Tensor:
    """t (B, T, E) times the (B, T, 1) reach of ``lag`` ≥ 1 (t itself when there is no document start)."""
    return t if reach is None else t * reach[:, :, lag - 1 : lag]


class _CausalDepthwiseConvFn(torch.autograd.Function):
    """y = bias + Σ_j w[:, j]·x̃[:, j : j + T]·reach_{k−1−j} on x̃ = [history ; x] (B, k − 1 + T, E); w (E, k);
    reach (B, T, k − 1) or None (every tap reaches, see :func:`tap_reach`)."""

    @staticmethod
    def forward(ctx, x, weight, bias, history, reach):
        taps = weight.shape[1]
        seq_len = x.shape[1]
        padded = torch.cat([history, x], dim=1)  # (B, k − 1 + T, E)
        w_t = weight.t()  # (k, E): row j is tap j of every channel
        y = torch.mul(padded[:, taps - 1 :], w_t[taps - 1])  # (B, T, E): the newest tap (lag 0 always reaches)
        if bias is not None:
            y += bias
        for j in range(taps - 1):
            y.addcmul_(_reached(padded[:, j : j + seq_len], reach, taps - 1 - j), w_t[j])
        ctx.save_for_backward(padded, weight, reach)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y):
        """dL/dx̃[:, s] = Σ_j w[:, j]·g_j[:, s − j];  dL/dw[:, j] = Σ_{b,t} g_j[:, t]·x̃[:, t + j];
        dL/dbias = Σ_{b,t} dL/dy[:, t], with ``g_j = dL/dy·reach_{k−1−j}`` (dL/dy where nothing is cut)."""
        padded, weight, reach = ctx.saved_tensors
        taps, seq_len = weight.shape[1], grad_y.shape[1]
        grad_y = grad_y.contiguous()  # (B, T, E)
        grads = [grad_y] + [_reached(grad_y, reach, lag) for lag in range(1, taps)]  # by lag: g_{k−1−lag}
        w_t = weight.t()  # (k, E)
        scratch = torch.empty_like(grad_y)  # (B, T, E), reused by every tap
        grad_weight = torch.empty_like(weight)  # (E, k)
        for j in range(taps):
            torch.mul(grads[taps - 1 - j], padded[:, j : j + seq_len], out=scratch)  # the inputs tap j met, × g_j
            grad_weight[:, j] = scratch.sum((0, 1))
        grad_bias = grad_y.sum((0, 1)) if ctx.has_bias else None
        grad_x = torch.mul(grad_y, w_t[taps - 1])  # (B, T, E): x[:, t] meets y[:, t + s] through tap k − 1 − s
        for shift in range(1, min(taps, seq_len + 1)):
            if shift < seq_len:
                grad_x[:, : seq_len - shift].addcmul_(grads[shift][:, shift:], w_t[taps - 1 - shift])
        grad_history = None
        if ctx.needs_input_grad[3]:  # x̃[:, i] = history[:, i] meets y[:, t] through tap i − t (t ≤ i)
            grad_history = torch.zeros_like(padded[:, : taps - 1])  # (B, k − 1, E)
            for i in range(taps - 1):
                for t in range(min(seq_len, i + 1)):
                    grad_history[:, i].addcmul_(grads[taps - 1 - (i - t)][:, t], w_t[i - t])
        return grad_x, grad_weight, grad_bias, grad_history, None


def causal_depthwise_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    history: torch.Tensor | None = None,
    starts: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal depthwise convolution of ``x`` (B, T, E) with ``weight`` (E, k) and optional ``bias`` (E,).

    ``history`` (B, k − 1, E), oldest first, holds the inputs before ``x`` (None: zeros, a sequence
    start). Returns y (B, T, E) in x's dtype with ``y[:, t] = bias + Σ_j weight[:, j]·x̃[:, t + j]`` on
    ``x̃ = [history ; x]``: tap k − 1 multiplies the current input, tap 0 the input k − 1 steps back, as
    ``torch.nn.Conv1d(E, E, k, groups=E)`` applied to ``x̃`` transposed to (B, E, ·). Differentiable in
    x, weight, bias and history. ``starts`` (B, T) bool or None: document starts of a packed row; no tap
    crosses one (each document is convolved as if alone from zeros; the history only reaches positions
    before a row's first start). ``mask`` (B, T) or None: 0 at pads, which the taps skip (module docstring); the
    output is 0 there.
    """
    if x.dim() != 3:
        raise ValueError(f"x must have shape (B, T, E); got {tuple(x.shape)}")
    batch, _, channels = x.shape
    if weight.dim() != 2 or weight.shape[0] != channels:
        raise ValueError(f"weight must have shape (E, k) with E = {channels}; got {tuple(weight.shape)}")
    taps = weight.shape[1]
    if bias is not None and tuple(bias.shape) != (channels,):
        raise ValueError(f"bias must have shape (E,) = {(channels,)}; got {tuple(bias.shape)}")
    if history is None:
        history = x.new_zeros(batch, taps - 1, channels)
    elif tuple(history.shape) != (batch, taps - 1, channels):
        expected = (batch, taps - 1, channels)
        raise ValueError(f"history must have shape (B, k − 1, E) = {expected}; got {tuple(history.shape)}")
    if starts is not None and (starts.dtype != torch.bool or starts.shape != x.shape[:2]):
        raise ValueError(
            f"starts must be a bool tensor of shape (B, T) = {tuple(x.shape[:2])}; got {starts.dtype} "
            f"{tuple(starts.shape)}"
        )
    _check_mask(mask, x)
    dtype = x.dtype
    weight, history = weight.to(dtype), history.to(dtype)
    bias = None if bias is None else bias.to(dtype)
    if mask is None:
        return _convolve(x, weight, bias, history, starts)
    real = real_tokens_first(mask, starts)
    y = _convolve(real.gather(x), weight, bias, history, real.starts)  # (B, T, E) in slot order
    return real.scatter_back(y) * (mask != 0).unsqueeze(-1).to(dtype)


def _convolve(x, weight, bias, history, starts):
    taps = weight.shape[1]
    reach = None if starts is None or taps == 1 else tap_reach(starts, taps, x.dtype)  # (B, T, k − 1)
    return _CausalDepthwiseConvFn.apply(x, weight, bias, history, reach)


def _check_mask(mask: torch.Tensor | None, x: torch.Tensor) -> None:
    if mask is not None and mask.shape != x.shape[:2]:
        raise ValueError(f"mask must have shape (B, T) = {tuple(x.shape[:2])}; got {tuple(mask.shape)}")


def conv_window(
    history: torch.Tensor,
    x: torch.Tensor,
    starts: torch.Tensor | None = None,
    ends: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The last k − 1 inputs of ``[history ; x]`` along time: the window a causal k-tap convolution continues
    from after ``x``. history (B, k − 1, E), oldest first; x (B, T, E) -> (B, k − 1, E). ``starts`` (B, T) bool
    or None: inputs before a row's last document start are zeros in its window (the last document's own).
    ``ends`` (B,) int or None: row b's window ends after ``x[b, ends[b] − 1]`` (0: ``history``); None: after
    x's last input. ``mask`` (B, T) or None (not with ``ends``): 0 at pads, which the window skips (the last
    k − 1 real inputs)."""
    _check_mask(mask, x)
    if mask is not None:
        if ends is not None:
            raise ValueError(
                "conv_window takes ends or mask, not both (a mask's window ends after its last real token)"
            )
        real = real_tokens_first(mask, starts)
        return conv_window(history, real.gather(x), real.starts, ends=real.count)
    keep, length = history.shape[1], x.shape[1]
    if ends is None:
        tail = min(length, keep)
        stream = torch.cat([history, x[:, length - tail :]], dim=1)  # (B, k − 1 + min(T, k − 1), E)
        window = stream[:, stream.shape[1] - keep :]  # (B, k − 1, E)
        position = torch.arange(length - keep, length, device=x.device)[None, :]  # (1, k − 1): < 0 is the history
    else:
        slots = ends[:, None] + torch.arange(keep, device=x.device)  # (B, k − 1): window slots of [history ; x]
        window = torch.cat([history, x], dim=1).gather(1, slots[..., None].expand(-1, -1, x.shape[2]))
        position = slots - keep  # (B, k − 1): x's index, < 0 is the history
    if starts is None or keep == 0:
        return window
    index = torch.arange(length, device=x.device)
    last_start = torch.where(starts, index, -1).amax(dim=1)  # (B,): −1 where the row has no start
    return window * (position >= last_start[:, None]).unsqueeze(-1).to(window.dtype)
