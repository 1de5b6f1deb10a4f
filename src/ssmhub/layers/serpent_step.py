"""SeRpEnt's decode step with all resampling branches of a mixer at once (arXiv 2501.11729 §4, causal mode).

Per token a SeRpEnt mixer runs, in each of its R resampling branches, Eq. 13 (the step Δ_l), the streaming
clock and window (:func:`~ssmhub.ops.resampling.resampling_step`), Eq. 12's compression θ_Γ and a step of the
branch's Mamba. The branches share every shape (window K, G distance features, width H_b, the Mamba options)
and differ only in their weights and κ, so this module stacks their weights along a leading branch dimension
and runs each piece once for all of them: a decode step is hundreds of small tensor ops, whose count, not
their arithmetic, sets its cost. :meth:`ResamplingBranch._step <ssmhub.layers.serpent.ResamplingBranch._step>`
is this step with R = 1, so there is one implementation of the streaming branch.

Layout: the mixer keeps its branches' states stacked, (B, R, ...) (batch first, as the cache wants every
state); the streaming clock runs on the (B, R) rows with one lattice per branch, and the per-branch matmuls
on branch-first views, (R, B, ...).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.nn import functional as F

from ..ops.resampling import (
    ResamplingLattice,
    ResamplingState,
    gaussian_distance_features,
    resampling_lattice,
    resampling_step,
)
from ..ops.selective_scan import selective_step

__all__ = ["STREAM_FIELDS", "StackedBranches", "stack_branches", "stacked_weights", "step_branches"]

STREAM_FIELDS = ResamplingState._fields  # clock, grid_count, inputs, times, count


class StackedBranches(NamedTuple):
    """The weights of R resampling branches, stacked branch-first (weights as right operands of a matmul).

    Eq. 13: step_weight (R, H) and step_bias (R,) float64 (θ_Δ), grid_step (R,) Δ and its lattice,
    one_minus_kappa and kappa (R,) float32. Eq. 12: centers (1, R, 1, G) μ; compress_weight
    (R, K·(H + G), H_b), compress_bias (R, 1, H_b). The branch Mambas: in_weight (R, H_b, 2E), in_bias
    (R, 1, 2E) or None; conv_taps (R, 1, E, k), conv_bias (R, 1, E) or None; x_weight (R, E, rank + 2N);
    dt_weight (R, rank, E), dt_bias (R, 1, E); out_weight (R, E, H_b), out_bias (R, 1, H_b) or None;
    A (R, 1, E, N) float32; D (R, 1, E).
    """

    step_weight: torch.Tensor
    step_bias: torch.Tensor
    grid_step: torch.Tensor
    lattice: ResamplingLattice
    one_minus_kappa: torch.Tensor
    kappa: torch.Tensor
    centers: torch.Tensor
    compress_weight: torch.Tensor
    compress_bias: torch.Tensor
    in_weight: torch.Tensor
    in_bias: torch.Tensor | None
    conv_taps: torch.Tensor
    conv_bias: torch.Tensor | None
    x_weight: torch.Tensor
    dt_weight: torch.Tensor
    dt_bias: torch.Tensor
    out_weight: torch.Tensor
    out_bias: torch.Tensor | None
    A: torch.Tensor
    D: torch.Tensor


def _stack(tensors, *, transpose: bool = False, middle: bool = False) -> torch.Tensor | None:
    """Stack branch tensors along a new dim 0 (None if the first is None); ``transpose``: the 2-d weights as
    (in, out); ``middle``: a (R, 1, ...) stack that broadcasts over the rows."""
    if tensors[0] is None:
        return None
    stacked = torch.stack([t.t() if transpose else t for t in tensors])
    return stacked.unsqueeze(1) if middle else stacked


def stack_branches(branches) -> StackedBranches:
    """Stack the weights of ``branches`` (:class:`~ssmhub.layers.serpent.ResamplingBranch`, same shapes)."""
    mambas = [b.mamba for b in branches]
    grid_step = torch.stack([b.ssm.grid_step() for b in branches])  # each a 0-dim exp, as in the parallel pass
    return StackedBranches(
        step_weight=torch.stack([b.step_proj.weight[0] for b in branches]).double(),
        step_bias=torch.cat([b.step_proj.bias for b in branches]).double(),
        grid_step=grid_step,
        lattice=resampling_lattice(grid_step),
        one_minus_kappa=torch.tensor([1 - b.resampling_rate for b in branches], dtype=torch.float32),
        kappa=torch.tensor([b.resampling_rate for b in branches], dtype=torch.float32),
        centers=_stack([b.ssm.distance_centers for b in branches], middle=True)[None],
        compress_weight=_stack([b.compress.weight for b in branches], transpose=True),
        compress_bias=_stack([b.compress.bias for b in branches], middle=True),
        in_weight=_stack([m.in_proj.weight for m in mambas], transpose=True),
        in_bias=_stack([m.in_proj.bias for m in mambas], middle=True),
        conv_taps=_stack([m._conv_taps() for m in mambas], middle=True),
        conv_bias=_stack([m.conv1d.bias for m in mambas], middle=True),
        x_weight=_stack([m.x_proj.weight for m in mambas], transpose=True),
        dt_weight=_stack([m.dt_proj.weight for m in mambas], transpose=True),
        dt_bias=_stack([m.dt_proj.bias for m in mambas], middle=True),
        out_weight=_stack([m.out_proj.weight for m in mambas], transpose=True),
        out_bias=_stack([m.out_proj.bias for m in mambas], middle=True),
        A=_stack([m.A() for m in mambas], middle=True),
        D=_stack([m.ssm.D for m in mambas], middle=True),
    )


def stacked_weights(owner, branches) -> StackedBranches:
    """:func:`stack_branches` of ``branches``, kept on ``owner`` (their mixer) between decode steps and made
    again when a weight changed (its version counter or storage), when gradients are on (the stack must carry
    them) or under ``torch.compile`` (which fuses the stacking into the step)."""
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        return stack_branches(branches)
    key = tuple((p.data_ptr(), p._version, p.dtype) for b in branches for p in b.parameters())
    kept = getattr(owner, "_stacked_weights", None)
    if kept is None or kept[0] != key:
        kept = (key, stack_branches(branches))
        owner._stacked_weights = kept
    return kept[1]


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Per-branch ``x W + b``: x (R, B, in), weight (R, in, out), bias (R, 1, out) or None -> (R, B, out)."""
    weight = weight.to(x.dtype)
    return torch.bmm(x, weight) if bias is None else torch.baddbmm(bias.to(x.dtype), x, weight)


def _steps(w: StackedBranches, x_t: torch.Tensor) -> torch.Tensor:
    """Eq. 13 for every branch: x_t (B, H) -> Δ_l (B, R) float32, computed as
    :meth:`ResamplingBranch.steps <ssmhub.layers.serpent.ResamplingBranch.steps>` does (a float64 product and
    sum along H, the gate rounded once), so a streamed token gets the Δ_l of the parallel pass bit for bit."""
    logit = (x_t.double()[:, None] * w.step_weight).sum(-1) + w.step_bias  # (B, R)
    gate = torch.sigmoid(logit).float()
    return gate * w.grid_step * w.one_minus_kappa + w.kappa * w.grid_step


def _compress(w: StackedBranches, inputs, distance, valid, dtype) -> torch.Tensor:
    """Eq. 12: window inputs (B, R, K, H), distances and validity (B, R, K) -> x̄ (R, B, H_b), branch first."""
    features = gaussian_distance_features(distance, w.centers, valid)  # (B, R, K, G)
    window = torch.cat([inputs.to(dtype), features.to(dtype)], dim=-1).flatten(-2)  # (B, R, K·(H + G))
    return _linear(window.transpose(0, 1), w.compress_weight, w.compress_bias)  # (R, B, H_b)


def _mamba_step(w: StackedBranches, x, conv_state, ssm_state):
    """One token of every branch Mamba, the formulas of :meth:`MambaMixer._step
    <ssmhub.layers.mamba.MambaMixer._step>`, branch first: x (R, B, H_b); conv_state (R, B, E, k − 1);
    ssm_state (R, B, E, N) -> y (R, B, H_b), conv_state, ssm_state."""
    branches, batch, _ = x.shape
    u, z = _linear(x, w.in_weight, w.in_bias).chunk(2, dim=-1)  # (R, B, E) each
    window = torch.cat([conv_state.to(u.dtype), u.unsqueeze(-1)], dim=-1)  # (R, B, E, k), newest last
    u = (window * w.conv_taps.to(u.dtype)).sum(-1)
    if w.conv_bias is not None:
        u = u + w.conv_bias.to(u.dtype)
    u = F.silu(u)
    rank, state_size = w.dt_weight.shape[1], w.A.shape[-1]
    time_step, B, C = torch.split(_linear(u, w.x_weight, None), [rank, state_size, state_size], dim=-1)
    delta = F.softplus(_linear(time_step, w.dt_weight, w.dt_bias).float())  # (R, B, E)
    E = u.shape[-1]
    rows = branches * batch  # (R, B, ...) -> (R·B, ...) for the selective step
    y, ssm_state = selective_step(
        u.reshape(rows, E),
        delta.reshape(rows, E),
        w.A.expand(branches, batch, E, state_size).reshape(rows, E, state_size),
        B.reshape(rows, state_size),
        C.reshape(rows, state_size),
        D=w.D.expand(branches, batch, E).reshape(rows, E),
        z_t=z.reshape(rows, E),
        state=ssm_state.reshape(rows, E, state_size),
    )
    y = _linear(y.view(branches, batch, E).to(x.dtype), w.out_weight, w.out_bias)  # (R, B, H_b)
    return y, window[..., 1:].float(), ssm_state.view(branches, batch, E, state_size)


def step_branches(w: StackedBranches, x_t: torch.Tensor, state: dict[str, torch.Tensor], mask_t):
    """One token through R resampling branches (causal mode): advance each clock and push the token; where it
    crosses t̄_j, compress the window (Eq. 12) and step the branch Mamba; emit the held ȳ_j (0 before the first
    grid point).

    Args:
        w: :func:`stack_branches` of the branches. x_t: (B, H) the token's input. mask_t: None or (B,) bool.
        state: each field of :meth:`ResamplingBranch.state_layout
            <ssmhub.layers.serpent.ResamplingBranch.state_layout>` stacked after the batch dim, (B, R, ...).

    Returns:
        ``(y (B, R, H_b) in x_t's dtype, new state in the layout of ``state``)``.
    """
    batch, branches = state["clock"].shape
    stream = ResamplingState(*(state[name] for name in STREAM_FIELDS))  # rows (B, R)
    stream, emission = resampling_step(
        stream,
        x_t.float()[:, None].expand(batch, branches, x_t.shape[-1]),  # (B, R, H): every branch reads x_t
        _steps(w, x_t),
        w.lattice,
        None if mask_t is None else mask_t[:, None].expand(batch, branches),
    )
    new_state = stream._asdict()
    held, conv_state, ssm_state = state["held"], state["conv_state"], state["ssm_state"]
    if torch.compiler.is_compiling() or bool(emission.emitted.any()):
        x_bar = _compress(w, emission.inputs, emission.distance, emission.valid, x_t.dtype)  # (R, B, H_b)
        y_t, stepped_conv, stepped_ssm = _mamba_step(w, x_bar, conv_state.transpose(0, 1), ssm_state.transpose(0, 1))
        emitted = emission.emitted  # (B, R)
        held = torch.where(emitted[..., None], y_t.transpose(0, 1).float(), held)
        conv_state = torch.where(emitted[..., None, None], stepped_conv.transpose(0, 1), conv_state)
        ssm_state = torch.where(emitted[..., None, None], stepped_ssm.transpose(0, 1), ssm_state)
    new_state.update(held=held, conv_state=conv_state, ssm_state=ssm_state)
    return held.to(x_t.dtype), new_state
