"""SeRpEnt's decode step with all resampling branches of a mixer at once (arXiv 2501.11729 §4, causal mode).

Per token a SeRpEnt mixer runs, in each of its R resampling branches, Eq. 13 (the step Δ_l), the streaming
clock and window (:func:`~ssmhub.ops.resampling.resampling_step`), Eq. 12's compression θ_Γ and a step of the
branch's Mamba. The branches share every shape (window K, G distance features, width H_b, the Mamba options)
and differ only in their weights and κ, so this module stacks their weights along a leading branch dimension
(:mod:`ssmhub.layers.stacking`) and runs each piece once for all of them, the Mambas through
:func:`~ssmhub.layers.mamba.mamba_step`; the window input and output projections and θ_Γ run branch by branch, on
each branch's own weights (no copy; a quantized projection runs as its module). Branches that share one Mamba (the
additive layout) step it once over all their rows, as B·R mixers of one row each on its weights, unstacked.

Every matmul of the step is a batched one with a single row per matrix (:func:`~ssmhub.layers.stacking.row_linear`,
:func:`~ssmhub.layers.stacking.linear_maps`): under ``torch.compile`` on a CPU, Inductor fuses those into its
generated loops, where a 2-d ``mm`` or a matrix of several rows stays an external call with buffers of its own.
:meth:`ResamplingBranch._step <ssmhub.layers.serpent.ResamplingBranch._step>` is this step with R = 1, so there is
one implementation of the streaming branch.

Layout: the mixer keeps its branches' states stacked, (B, R, ...) (batch first, as the cache wants every
state); the streaming clock runs on the (B, R) rows with one lattice per branch, and the per-branch matmuls
on branch-first views, (R, B, ...).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..ops.resampling import (
    ResamplingLattice,
    ResamplingState,
    gaussian_distance_features,
    resampling_lattice,
    resampling_step,
)
from .mamba import MambaStepWeights, mamba_step, stack_step_weights
from .stacking import kept_stack, linear_maps, row_linear, stack

__all__ = ["STREAM_FIELDS", "StackedBranches", "project_outputs", "stack_branches", "stacked_weights", "step_branches"]

STREAM_FIELDS = ResamplingState._fields  # clock, grid_count, inputs, times, count


class StackedBranches(NamedTuple):
    """The weights of R resampling branches, stacked branch-first.

    Eq. 13: step_weight (R, H) and step_bias (R,) float64 (θ_Δ), grid_step (R,) Δ and its lattice,
    one_minus_kappa and kappa (R,) float32. Eq. 12: centers (1, R, 1, G) μ. mamba: the branch Mambas' step weights,
    stacked (R, ...), or the one Mamba they share (1, ...) where ``shared_mamba``.
    window_maps, output_maps: each branch's ``window_proj`` and ``output_proj`` as a map (1, B, in) -> (1, B, out)
    (:func:`~ssmhub.layers.stacking.linear_maps`), or None in the concatenated layout, which has neither.
    branches: the :class:`~ssmhub.layers.serpent.ResamplingBranch` modules themselves (their θ_Γ).
    """

    step_weight: torch.Tensor
    step_bias: torch.Tensor
    grid_step: torch.Tensor
    lattice: ResamplingLattice
    one_minus_kappa: torch.Tensor
    kappa: torch.Tensor
    centers: torch.Tensor
    mamba: MambaStepWeights
    shared_mamba: bool
    window_maps: tuple | None
    output_maps: tuple | None
    branches: tuple


def stack_branches(branches) -> StackedBranches:
    """Stack the weights of ``branches`` (:class:`~ssmhub.layers.serpent.ResamplingBranch`, same shapes)."""
    grid_step = torch.stack([b.ssm.grid_step() for b in branches])  # each a 0-dim exp, as in the parallel pass
    device = grid_step.device
    shared = all(b.mamba is branches[0].mamba for b in branches)
    return StackedBranches(
        step_weight=torch.stack([b.step_proj.weight[0] for b in branches]).double(),
        step_bias=torch.cat([b.step_proj.bias for b in branches]).double(),
        grid_step=grid_step,
        lattice=resampling_lattice(grid_step),
        one_minus_kappa=torch.tensor([1 - b.resampling_rate for b in branches], dtype=torch.float32, device=device),
        kappa=torch.tensor([b.resampling_rate for b in branches], dtype=torch.float32, device=device),
        centers=stack([b.ssm.distance_centers for b in branches], middle=True)[None],
        mamba=stack_step_weights([branches[0].mamba] if shared else [b.mamba for b in branches]),
        shared_mamba=shared,
        window_maps=tuple(linear_maps([b.window_proj]) for b in branches) if branches[0].additive else None,
        output_maps=tuple(linear_maps([b.output_proj]) for b in branches) if branches[0].additive else None,
        branches=tuple(branches),
    )


def stacked_weights(owner, branches) -> StackedBranches:
    """:func:`stack_branches` of ``branches``, kept on ``owner`` (their mixer) between decode steps (made again when
    a weight of a branch or of its Mamba, which the branches may share and not own, changed)."""
    return kept_stack(owner, [*branches, *(b.mamba for b in branches)], lambda: stack_branches(branches))


def _steps(w: StackedBranches, x_t: torch.Tensor) -> torch.Tensor:
    """Eq. 13 for every branch: x_t (B, H) -> Δ_l (B, R) float32, computed as :meth:`ResamplingBranch.steps
    <ssmhub.layers.serpent.ResamplingBranch.steps>` does (a float64 product and sum along H, the gate rounded once),
    so a streamed token gets the float32 Δ_l of the parallel pass (another only where the two float64 logits
    straddle a float32 rounding midpoint: odds about 2^-29 per token)."""
    logit = (x_t.double()[:, None] * w.step_weight).sum(-1) + w.step_bias  # (B, R)
    gate = torch.sigmoid(logit).float()
    return gate * w.grid_step * w.one_minus_kappa + w.kappa * w.grid_step


def _window_inputs(w: StackedBranches, x_t: torch.Tensor) -> torch.Tensor:
    """x_t (B, H) -> each branch's window input (B, R, W) float32 (:meth:`ResamplingBranch.window_inputs
    <ssmhub.layers.serpent.ResamplingBranch.window_inputs>`: x_t itself in the concatenated layout)."""
    if w.window_maps is None:
        return x_t.float()[:, None].expand(x_t.shape[0], len(w.branches), x_t.shape[-1])  # every branch reads x_t
    return torch.cat([project(x_t[None]) for project in w.window_maps]).transpose(0, 1).float()  # (B, R, H_b)


def project_outputs(w: StackedBranches, y: torch.Tensor) -> list[torch.Tensor]:
    """Each branch's ``project_output`` of its held output, y (B, R, H_b) -> R tensors (B, H) (additive), or each
    branch's slice (B, H_b) itself (concatenated)."""
    if w.output_maps is None:
        return list(y.unbind(1))
    return [project(y[None, :, i])[0] for i, project in enumerate(w.output_maps)]  # (B, H) each


def _compress(w: StackedBranches, inputs, distance, valid, dtype) -> torch.Tensor:
    """Eq. 12: window inputs (B, R, K, W), distances and validity (B, R, K) -> x̄ (B, R, H_b)."""
    features = gaussian_distance_features(distance, w.centers, valid)  # (B, R, K, G)
    inputs = inputs.to(dtype)
    compressed = [branch.compress(inputs[:, i], features[:, i], row_linear) for i, branch in enumerate(w.branches)]
    return torch.stack(compressed, dim=1)


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
        _window_inputs(w, x_t),  # (B, R, W)
        _steps(w, x_t),
        w.lattice,
        None if mask_t is None else mask_t[:, None].expand(batch, branches),
    )
    new_state = stream._asdict()
    x_bar = _compress(w, emission.inputs, emission.distance, emission.valid, x_t.dtype)  # (B, R, H_b)
    y_t, stepped_conv, stepped_ssm = _branch_mambas(w, x_bar, state["conv_state"], state["ssm_state"])
    # Every row's branch Mamba steps and only the rows that crossed a grid point keep the result: a branch on
    # ``emitted.any()`` would read the device back every token (a sync on a GPU, a break in a CUDA graph).
    emitted = emission.emitted  # (B, R)
    held = torch.where(emitted[..., None], y_t.float(), state["held"])
    conv_state = torch.where(emitted[..., None, None], stepped_conv, state["conv_state"])
    ssm_state = torch.where(emitted[..., None, None], stepped_ssm, state["ssm_state"])
    new_state.update(held=held, conv_state=conv_state, ssm_state=ssm_state)
    return held.to(x_t.dtype), new_state


def _branch_mambas(w: StackedBranches, x_bar, conv_state, ssm_state):
    """A step of every branch's Mamba: x̄ (B, R, H_b) and its states (B, R, ...) -> y (B, R, H_b) and the stepped
    states (B, R, ...). One shared Mamba steps the B·R rows as one mixer of B·R rows (one matrix product of B·R rows
    per projection, eager), or under ``torch.compile`` as B·R one-row mixers (products Inductor fuses with their
    neighbours: :func:`~ssmhub.layers.stacking.batched_linear`); views, no copy. Branches of their own step as R
    stacked Mambas on branch-first views (R, B, ...)."""
    batch, branches = x_bar.shape[:2]
    if w.shared_mamba:  # (B, R, ...) -> (1, B·R, ...), or (B·R, 1, ...) compiled: the one Mamba's weights broadcast
        lead = (batch * branches, 1) if torch.compiler.is_compiling() else (1, batch * branches)
        rows = [t.reshape(*lead, *t.shape[2:]) for t in (x_bar, conv_state, ssm_state)]
        return [t.view(batch, branches, *t.shape[2:]) for t in mamba_step(w.mamba, *rows)]
    stepped = mamba_step(w.mamba, *(t.transpose(0, 1) for t in (x_bar, conv_state, ssm_state)))  # (R, B, ...)
    return [t.transpose(0, 1) for t in stepped]
