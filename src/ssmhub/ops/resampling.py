"""SeRpEnt selective resampling: token times, the uniform grid, K-token windows, distance features, expansion.

Paper: Rando et al., "SeRpEnt: Selective Resampling for Expressive State Space Models" (arXiv 2501.11729),
§3.1 (Eq. 9), §4.2 (Eqs. 11-13) and §4.3 (Eq. 14b). The paper publishes no code and never mentions causality,
masking or decoding: the causal mode and the streaming functions here are ours (see "Causal mode"). Notation:

- Eq. 13: ``Δ_l = σ(θ_Δ(x_l))·Δ·(1−κ) + κΔ ∈ [κΔ, Δ]``, the per-token step (computed by the layer).
- Eq. 9:  ``t_l = Σ_{i≤l} Δ_i``, token times (:func:`resampling_times`; pad tokens advance no clock).
- Eq. 11: ``t̄_j = jΔ`` for ``j = 1..L̄``, ``L̄ = ⌊t_{L−1}/Δ⌋`` (:func:`grid_index`, :func:`grid_sizes`).
- Eq. 12: ``x̄_j = θ_Γ(⊕_{t_k ∈ N_K(t̄_j)} [x_k, ε(t̄_j − t_k)])``, ``ε(d)_i = exp(−(d − μ_i)²)``. The
  neighbourhood comes from :func:`nearest_windows` (paper-faithful K-NN) or :func:`causal_windows` (causal mode),
  the inputs from :func:`gather_windows` and ε from :func:`gaussian_distance_features`; θ_Γ is the layer's.
- Eq. 14b: ``y_l = ȳ_{k(l)}`` back at length L: :func:`expand_nearest` (nearest grid point, paper) or
  :func:`expand_floor` (zero-order hold ``k = ⌊t_l/Δ⌋``, causal mode).
- Not in the paper: O(1)-per-token decoding of the causal mode: :func:`resampling_init_state`,
  :func:`resampling_prefill`, :func:`resampling_step`; they make exactly the decisions of the parallel path.

Causal mode (ours). As written the paper's block is not causal: Eq. 12's window N_K(t̄_j) is symmetric, so x̄_j
reads about K/2 tokens after t̄_j, and Eq. 14b's nearest copy can read a grid point up to Δ/2 after t_l (about
1/(2κ) tokens). The causal mode compresses, for each grid point, the last K real tokens up to the first token
with ``t_l ≥ t̄_j`` (Eq. 12's K-NN set restricted to the past) and expands by floor, ``j(l) = ⌊t_l/Δ⌋``; since
``t̄_{j(l)} ≤ t_l``, y_l depends on x_{≤l} only, and the block can be stepped one token at a time.

Layouts. Token index l is 0-based (0..L−1), grid index j is 1-based (slot j−1 of a (B, Lg, ...) tensor, where
``Lg ≥ max L̄`` pads the batch; slots j > L̄ of a row are invalid). A window has K slots in ascending token
order; its invalid slots (fewer than K real tokens available) come first, so the last slot of a causal window
is always its emission token. Pad tokens (``mask`` 0) never enter a window and advance no clock.

Exact clock. Every discrete decision (L̄, the token that crosses t̄_j, window membership, the expansion
index) compares times with grid points, and the streaming path must make the same ones as the parallel
cumsum, whose rounding (a CUDA scan sums in another order) could otherwise flip ``⌊t/Δ⌋`` at a boundary. So
times live on a lattice: with ``q = 2^(⌊log₂Δ⌋ − 28)``, Δ and every step are rounded to a multiple of q (their
values only; gradients pass straight through, see below) and steps are clamped to ``[0, Δ]`` (Eq. 13's
range, guarding its float rounding; so a token crosses at most one grid point). Sums of lattice values below
``2^53·q`` are exact in float64 in any order, so t is the same bit for bit in the parallel and streaming paths
and on any device, distances ``t̄_j − t_k`` are exact, and ``⌊t/Δ⌋`` is computed in int64 lattice units.
This holds up to ``MAX_EXACT_TOKENS = 2^24`` tokens per row (``t ≤ 2^24·Δ``). The rounding is at most
``2^-29·Δ`` per step, and float32 steps ≥ Δ/32 (with a float32 Δ) are on the lattice already. Each function
that takes ``grid_step`` reads a tensor Δ on the host once to check it (one sync on a GPU), unless it is given
Δ's :func:`resampling_lattice` (built on the device, unchecked with ``check=False``): then, and with a static
``num_grid`` for the window functions, nothing is read back (what the layer's training forward does).

Boundary convention: grid point j belongs to the first token with ``t_l ≥ t̄_j`` (a token landing exactly on
``jΔ`` emits it), and ``⌊t_l/Δ⌋`` counts grid points ``jΔ ≤ t_l``. So ``j(l) = ⌊t_l/Δ⌋`` reads only grid points
emitted at or before token l.

Gradients. ``t`` carries the gradient of the steps (``∂t_l/∂Δ_i = 1`` for real i ≤ l) and the grid times
carry Δ's (``∂t̄_j/∂Δ = j``), so they reach θ_Δ and Δ through the distances of :attr:`ResamplingWindows.distance`
and the features ε only (Eq. 12b). Window selection, L̄ and the expansions are not differentiable in them.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .precision import float32_math

__all__ = [
    "MAX_EXACT_TOKENS",
    "ResamplingEmission",
    "ResamplingLattice",
    "ResamplingState",
    "ResamplingWindows",
    "causal_windows",
    "continued_stream",
    "expand_floor",
    "expand_nearest",
    "gather_windows",
    "gaussian_distance_features",
    "grid_index",
    "grid_sizes",
    "nearest_windows",
    "resampling_init_state",
    "resampling_lattice",
    "resampling_prefill",
    "resampling_step",
    "resampling_times",
]

_LATTICE_BITS = 28  # Δ = b·q with b ∈ [2^28, 2^29]
MAX_EXACT_TOKENS = 2**24  # t/q ≤ L·2^29 < 2^53 keeps every partial sum exact
_MIN_DELTA, _MAX_DELTA = 2.0**-121, 2.0**127  # Δ whose 2^⌊log₂Δ⌋ and q are float32 numbers (see _power_of_two)
# ε(d)_i = exp(−(d − μ_i)²) is computed from (d − μ_i)² clamped at 60, so it never falls below e^−60 ≈ 9e−27 (19
# orders of magnitude under float32's resolution of ε ≤ 1, and its gradient there is 0): the true value changes
# nothing, but below ~1e-38 it and its products with weights and gradients are subnormal floats, which CPUs
# multiply ~50× slower (a (85, L̄)·(L̄, K·G) gradient matmul of θ_Γ took 3 ms instead of 0.05 in a training step).
FEATURE_FLOOR_SQUARE = 60.0


class ResamplingWindows(NamedTuple):
    """The K input tokens feeding each grid point t̄_j (one Eq. 12 neighbourhood per grid slot).

    index: (B, Lg, K) int64 token indices into the length-L input, ascending; 0 in invalid slots.
    valid: (B, Lg, K) bool, a real token of a grid point j ≤ L̄ of its row; invalid slots come first.
    distance: (B, Lg, K) float64 ``t̄_j − t_k`` (exact), 0 in invalid slots; differentiable in Δ and the steps.
    grid_mask: (B, Lg) bool, slot j ≤ L̄ (a grid point of the row, not batch padding).
    """

    index: torch.Tensor
    valid: torch.Tensor
    distance: torch.Tensor
    grid_mask: torch.Tensor


class ResamplingState(NamedTuple):
    """Per-row streaming state of the causal resampling (causal mode, see the module docstring).

    clock: (B,) float64, t of the last real token (0 before any).
    grid_count: (B,) int64, grid points emitted so far, ``j = ⌊clock/Δ⌋``.
    inputs: (B, K, H) the last K real tokens' inputs, oldest first, right-aligned: the ``count`` filled slots
        are the last ones, the empty ones in front are zeros (the layout of a causal window).
    times: (B, K) float64 their times t_k (0 in empty slots).
    count: (B,) int64 filled slots, ``min(K, real tokens so far)``.
    """

    clock: torch.Tensor
    grid_count: torch.Tensor
    inputs: torch.Tensor
    times: torch.Tensor
    count: torch.Tensor


class ResamplingEmission(NamedTuple):
    """What one streamed token produces: for rows that crossed t̄_j, the causal window of grid point j.

    emitted: (B,) bool, the token crossed a grid point (its j is the new ``grid_count``).
    inputs: (B, K, H) window inputs, zeros in invalid slots (every slot of a row that did not emit).
    valid: (B, K) bool, False everywhere in a row that did not emit.
    distance: (B, K) float64 ``t̄_j − t_k``, 0 where invalid.
    These equal row b, slot j−1 of ``gather_windows(x, w.index, w.valid)``, ``w.valid`` and ``w.distance``
    for ``w = causal_windows(...)`` of the parallel pass, bit for bit.
    """

    emitted: torch.Tensor
    inputs: torch.Tensor
    valid: torch.Tensor
    distance: torch.Tensor


class ContinuedStream(NamedTuple):
    """A streaming state's buffered tokens in front of new ones, laid out for the parallel functions.

    inputs: (B, K + L, H) the K buffer slots (empty ones zero), then the new tokens.
    mask: (B, K + L) bool, the buffer's filled slots and the new real tokens.
    times: (B, K + L) float64 token times t (the buffer's as kept, the new ones continuing the clock).
    shifted: (B, K + L) float64 ``t − gΔ`` for the g grid points already emitted: its grid point j is
        grid point g + j of the stream, so :func:`causal_windows` and :func:`expand_floor` on it see only the
        new grid points; exact on the lattice, and carrying Δ's gradient (``∂(t − gΔ)/∂Δ = −g``).
    """

    inputs: torch.Tensor
    mask: torch.Tensor
    times: torch.Tensor
    shifted: torch.Tensor


def _lattice(grid_step, device: torch.device) -> ResamplingLattice:
    """Check Δ (a positive finite scalar, or its :func:`resampling_lattice`, which passes through) and snap it to
    its lattice ``q = 2^(⌊log₂Δ⌋ − 28)`` on ``device``. A tensor Δ is checked on the host (one read); a caller
    that must not read the device passes the lattice it built with ``check=False``."""
    if isinstance(grid_step, ResamplingLattice):
        return grid_step
    if isinstance(grid_step, torch.Tensor):
        if grid_step.numel() != 1:
            raise ValueError(f"grid_step must be a scalar Δ (one element); got shape {tuple(grid_step.shape)}")
        return resampling_lattice(grid_step.reshape(()).to(device))
    value = float(grid_step)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"grid_step must be a positive finite scalar Δ; got {value}")
    return resampling_lattice(torch.tensor(value, dtype=torch.float64, device=device))


def _snap_steps(step: torch.Tensor, lattice: ResamplingLattice) -> torch.Tensor:
    """Steps rounded to multiples of q and clamped to [0, Δ] (values), float64, gradient passed straight through."""
    raw = step.to(torch.float64)
    units = torch.minimum(torch.round(raw.detach() / lattice.quantum).clamp_(min=0), lattice.units)
    snapped = units * lattice.quantum
    return snapped + (raw - raw.detach()) if raw.requires_grad else snapped


def _units(t: torch.Tensor, lattice: ResamplingLattice) -> torch.Tensor:
    """Times in int64 lattice units (exact for times from :func:`resampling_times`; rounded otherwise)."""
    return torch.round(t.detach().to(torch.float64) / lattice.quantum).long()


def _check_window(window: int) -> None:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an int K ≥ 1; got {window!r}")


def _check_times(t: torch.Tensor, name: str = "t") -> None:
    if t.dim() != 2 or t.shape[1] < 1 or not t.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating tensor of shape (B, L) with L ≥ 1; got {t.dtype} {tuple(t.shape)}")


def _check_mask(mask: torch.Tensor | None, shape: tuple[int, ...], name: str = "mask") -> torch.Tensor | None:
    """None, or the mask as bool (nonzero = real token) after checking its shape."""
    if mask is None:
        return None
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} (1 = real token, 0 = pad); got {tuple(mask.shape)}")
    return mask if mask.dtype == torch.bool else mask != 0


def _real_tokens(mask: torch.Tensor | None, batch: int, length: int, device: torch.device):
    """rank (B, L) of each token among its row's real tokens, real_pos (B, L) the index of the r-th real token
    (pads after), and n_real (B,)."""
    if mask is None:
        positions = torch.arange(length, device=device).expand(batch, length)
        return positions, positions, torch.full((batch,), length, dtype=torch.long, device=device)
    rank = mask.long().cumsum(1) - 1  # (B, L)
    real_pos = torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)  # (B, L): real tokens first, in order
    return rank, real_pos, mask.long().sum(1)


def _grid_length(num_grid: int | None, t: torch.Tensor, grid_step) -> int:
    if num_grid is None:
        return int(grid_sizes(t, grid_step).max()) if t.shape[0] else 0
    if isinstance(num_grid, bool) or not isinstance(num_grid, int) or num_grid < 0:
        raise ValueError(f"num_grid must be an int Lg ≥ 0 (usually max L̄ = grid_sizes(t, Δ).max()); got {num_grid!r}")
    return num_grid


def _window_distances(t, lattice, grid_j, index, valid):
    """``t̄_j − t_k`` (B, Lg, K) float64 with gradients, 0 where invalid; grid_j (Lg,) int64."""
    batch, num_grid, window = index.shape
    grid_times = grid_j.to(torch.float64) * lattice.delta  # (Lg,) t̄_j = jΔ
    t_k = t.to(torch.float64).gather(1, index.reshape(batch, -1)).view(batch, num_grid, window)  # (B, Lg, K)
    return torch.where(valid, grid_times[None, :, None] - t_k, 0.0)


@float32_math
def resampling_times(
    step: torch.Tensor, grid_step: torch.Tensor | float, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Token times ``t_l = Σ_{i≤l} Δ_i`` (Eq. 9) on the exact lattice of Δ, float64.

    Args:
        step: (B, L) per-token steps Δ_l of Eq. 13, in ``[κΔ, Δ]`` (values outside ``[0, Δ]`` are clamped).
        grid_step: Δ, a positive scalar (tensor or float); fixes the lattice ``q = 2^(⌊log₂Δ⌋ − 28)``.
        mask: optional (B, L), 1 (True) = real token, 0 = pad; pads get step 0 (advance no clock).

    Returns:
        t (B, L) float64, every value a multiple of q (exact whatever the summation order) and carrying the
        gradient of ``step`` as a plain cumsum would. Exact for L ≤ ``MAX_EXACT_TOKENS``.
    """
    if step.dim() != 2 or not step.dtype.is_floating_point:
        raise ValueError(f"step must be a floating tensor of shape (B, L); got {step.dtype} {tuple(step.shape)}")
    if step.shape[1] > MAX_EXACT_TOKENS:
        raise ValueError(f"step must have L ≤ {MAX_EXACT_TOKENS} tokens for exact times; got L = {step.shape[1]}")
    mask = _check_mask(mask, tuple(step.shape))
    lattice = _lattice(grid_step, step.device)
    snapped = _snap_steps(step, lattice)  # (B, L) float64
    if mask is not None:
        snapped = torch.where(mask, snapped, 0.0)
    return snapped.cumsum(1)


def grid_index(t: torch.Tensor, grid_step: torch.Tensor | float) -> torch.Tensor:
    """``⌊t/Δ⌋`` exactly: the number of grid points ``t̄_j = jΔ ≤ t`` (any shape), int64.

    ``t`` must come from :func:`resampling_times` (or the streaming clock) with the same Δ, i.e. lie on the
    lattice; a time exactly on ``jΔ`` counts grid point j. Not differentiable.
    """
    lattice = _lattice(grid_step, t.device)
    return torch.div(_units(t, lattice), lattice.units, rounding_mode="floor")


def grid_sizes(t: torch.Tensor, grid_step: torch.Tensor | float) -> torch.Tensor:
    """L̄ per row, ``⌊t_{L−1}/Δ⌋``: (B,) int64 grid points ``t̄_j = jΔ`` (Eq. 11), j = 1..L̄.

    t: (B, L) from :func:`resampling_times` (non-decreasing, so its last column is the row's end time, with
    left or right padding). A row ending exactly on ``jΔ`` has L̄ = j. ``L̄ ≥ ⌊κL⌋`` up to the lattice rounding.
    """
    _check_times(t)
    return grid_index(t[:, -1], grid_step)


def causal_windows(
    t: torch.Tensor,
    grid_step: torch.Tensor | float,
    window: int,
    mask: torch.Tensor | None = None,
    num_grid: int | None = None,
) -> ResamplingWindows:
    """Causal compression windows (causal mode): per grid point, the last K real tokens up to its emission.

    The emission index of grid point j is ``e_j = min{l : t_l ≥ t̄_j}`` (searchsorted left; always a real token);
    its window is the last K real tokens with index ≤ e_j, ascending, so slot K−1 is e_j itself. This is the
    K-NN set of Eq. 12 restricted to tokens ≤ e_j. Distances ``t̄_j − t_k`` lie in ``(−Δ, ·)`` and are ≤ 0
    only at k = e_j. Pad tokens are skipped (a window never contains one); with fewer than K real tokens up
    to e_j the first slots are invalid. Coverage: if every real step is ≥ κΔ (as summed, i.e. after the
    lattice rounding), consecutive emission indices are at most ⌈1/κ⌉ apart and ``e_1 + 1 ≤ ⌈1/κ⌉``, so with
    ``K ≥ ⌈1/κ⌉`` every real token up to ``e_{L̄}`` is in some window (the < ⌈1/κ⌉ tokens after it are in
    none; the base branch and the skip of Eq. 15b carry them); with smaller K tokens can be dropped.

    Args:
        t: (B, L) times from :func:`resampling_times`.
        grid_step: Δ, the same scalar as for t.
        window: K ≥ 1.
        mask: optional (B, L), 1 = real token; the same mask as for t.
        num_grid: Lg, the padded grid length (≥ max L̄ to keep every grid point; L always is, a step being at
            most Δ, and reads nothing back); None: ``max L̄`` (one host read).

    Returns:
        :class:`ResamplingWindows` with (B, Lg, K) index / valid / distance and the (B, Lg) grid_mask.
    """
    _check_times(t)
    _check_window(window)
    batch, length = t.shape
    mask = _check_mask(mask, (batch, length))
    num_grid = _grid_length(num_grid, t, grid_step)
    lattice = _lattice(grid_step, t.device)
    counts = torch.div(_units(t, lattice), lattice.units, rounding_mode="floor")  # (B, L) ⌊t_l/Δ⌋, non-decreasing
    grid_j = torch.arange(1, num_grid + 1, device=t.device)  # (Lg,) j
    emission = torch.searchsorted(counts, grid_j.expand(batch, num_grid).contiguous())  # (B, Lg) e_j, L if none
    grid_mask = grid_j[None, :] <= counts[:, -1:]  # (B, Lg) j ≤ L̄
    rank, real_pos, _ = _real_tokens(mask, batch, length, t.device)
    last_rank = rank.gather(1, emission.clamp(max=length - 1))  # (B, Lg) rank of e_j among real tokens
    ranks = last_rank[..., None] - (window - 1) + torch.arange(window, device=t.device)  # (B, Lg, K)
    valid = grid_mask[..., None] & (ranks >= 0)  # (B, Lg, K)
    index = real_pos.gather(1, ranks.clamp(min=0).reshape(batch, -1)).view(batch, num_grid, window)  # (B, Lg, K)
    index = torch.where(valid, index, 0)
    distance = _window_distances(t, lattice, grid_j, index, valid)
    return ResamplingWindows(index, valid, distance, grid_mask)


def nearest_windows(
    t: torch.Tensor,
    grid_step: torch.Tensor | float,
    window: int,
    mask: torch.Tensor | None = None,
    num_grid: int | None = None,
) -> ResamplingWindows:
    """Paper-faithful (non-causal) windows N_K(t̄_j) of Eq. 12: the K real tokens nearest to each grid point.

    Exact K-NN in time: the K smallest ``(|t̄_j − t_k|, k)`` in lexicographic order, so ties in distance go to
    the earlier token. Times of real tokens strictly increase (steps ≥ κΔ > 0), so the set is a contiguous run
    of real tokens around ``searchsorted(t, t̄_j)``, found exactly among the 2K candidates around it.
    Slots are in ascending token order; a row with fewer than K real tokens puts its invalid slots first.
    Pad tokens are never chosen. Coverage: any interval of length Δ holds at most ⌊1/κ⌋ + 1 real
    tokens, so with ``K ≥ ⌊1/κ⌋ + 1`` every real token within Δ/2 of a grid point, i.e. with
    ``t_l ∈ [Δ/2, (L̄ + ½)Δ]``, is in the window of its nearest grid point; with smaller K tokens can be dropped.
    Not causal: a window reaches about K/2 tokens past t̄_j.

    Args and returns: as :func:`causal_windows`.
    """
    _check_times(t)
    _check_window(window)
    batch, length = t.shape
    mask = _check_mask(mask, (batch, length))
    num_grid = _grid_length(num_grid, t, grid_step)
    lattice = _lattice(grid_step, t.device)
    units = _units(t, lattice)  # (B, L) int64
    grid_j = torch.arange(1, num_grid + 1, device=t.device)  # (Lg,)
    grid_units = (grid_j * lattice.units).expand(batch, num_grid).contiguous()  # (B, Lg) t̄_j in lattice units
    grid_mask = grid_j[None, :] <= torch.div(units[:, -1:], lattice.units, rounding_mode="floor")  # (B, Lg)
    _, real_pos, n_real = _real_tokens(mask, batch, length, t.device)
    beyond = torch.iinfo(torch.long).max
    slot = torch.arange(length, device=t.device)
    real_units = torch.where(slot < n_real[:, None], units.gather(1, real_pos), beyond)  # (B, L) sorted, pads last
    anchor = torch.searchsorted(real_units, grid_units)  # (B, Lg) first real rank with t ≥ t̄_j
    candidates = anchor[..., None] - window + torch.arange(2 * window, device=t.device)  # (B, Lg, 2K) ranks
    in_range = (candidates >= 0) & (candidates < n_real[:, None, None])
    cand_units = real_units.gather(1, candidates.clamp(0, length - 1).reshape(batch, -1)).view(candidates.shape)
    gap = torch.where(in_range, (grid_units[..., None] - cand_units).abs(), beyond)  # (B, Lg, 2K) exact
    order = torch.argsort(gap, dim=-1, stable=True)[..., :window]  # (B, Lg, K) stable: earlier rank wins ties
    chosen = torch.where(in_range.gather(-1, order), candidates.gather(-1, order), -1)  # (B, Lg, K), -1 invalid
    chosen = chosen.sort(dim=-1).values  # ascending, invalid (-1) first
    valid = grid_mask[..., None] & (chosen >= 0)  # (B, Lg, K)
    index = real_pos.gather(1, chosen.clamp(min=0).reshape(batch, -1)).view(batch, num_grid, window)  # (B, Lg, K)
    index = torch.where(valid, index, 0)
    distance = _window_distances(t, lattice, grid_j, index, valid)
    return ResamplingWindows(index, valid, distance, grid_mask)


def gaussian_distance_features(
    distance: torch.Tensor, centers: torch.Tensor, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """Gaussian basis of Eq. 12: ``ε(d)_i = exp(−(d − μ_i)²)``, i = 1..G.

    Args:
        distance: (...) window distances ``t̄_j − t_k`` (float64 from the window functions).
        centers: (G,) the learnable μ, or one set per branch when several are stepped at once: as many dims
            as ``distance[..., None]``, broadcasting against it.
        valid: optional bool of distance's shape; features are 0 in invalid slots.

    Returns:
        (..., G) in the centers' dtype (at least float32): the distance is cast down once, after the exact
        float64 subtraction; at least ``exp(−FEATURE_FLOOR_SQUARE)`` in valid slots (no subnormal floats, see there).
        Differentiable in distance and centers.
    """
    expected = (*distance.shape, centers.shape[-1] if centers.dim() else 0)
    fits = centers.dim() in (1, len(expected)) and centers.shape[-1] >= 1
    if not fits or any(c not in (1, e) for c, e in zip(reversed(centers.shape), reversed(expected))):
        raise ValueError(
            f"centers must have shape (G,) with G ≥ 1, or (..., G) broadcasting against distance "
            f"{tuple(distance.shape)}; got {tuple(centers.shape)}"
        )
    if valid is not None and tuple(valid.shape) != tuple(distance.shape):
        raise ValueError(f"valid must have the shape of distance {tuple(distance.shape)}; got {tuple(valid.shape)}")
    dtype = torch.promote_types(centers.dtype, torch.float32)
    square = (distance.to(dtype)[..., None] - centers.to(dtype)) ** 2  # (..., G)
    features = torch.exp(-square.clamp(max=FEATURE_FLOOR_SQUARE))
    if valid is not None:
        features = torch.where(valid[..., None], features, 0.0)
    return features


def gather_windows(x: torch.Tensor, index: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Window inputs: x (B, L, H), index and valid (B, Lg, K) → (B, Lg, K, H), zeros in invalid slots.

    The layer then applies θ_Γ to ``cat([inputs, ε], -1).flatten(-2)`` (Eq. 12). Differentiable in x.
    """
    if x.dim() != 3:
        raise ValueError(f"x must have shape (B, L, H); got {tuple(x.shape)}")
    batch, _, hidden = x.shape
    if index.dim() != 3 or index.shape[0] != batch or index.dtype != torch.long:
        raise ValueError(f"index must be int64 of shape (B={batch}, Lg, K); got {index.dtype} {tuple(index.shape)}")
    if tuple(valid.shape) != tuple(index.shape) or valid.dtype != torch.bool:
        raise ValueError(f"valid must be bool of shape {tuple(index.shape)}; got {valid.dtype} {tuple(valid.shape)}")
    # invalid slots read an appended row of zeros: no mask over the K-times larger windows, forward or backward
    padded = torch.cat([x, x.new_zeros(batch, 1, hidden)], dim=1)  # (B, L + 1, H)
    index = torch.where(valid, index, x.shape[1])  # (B, Lg, K)
    return select_rows(padded, index.reshape(batch, -1)).view(*index.shape, hidden)  # (B, Lg, K, H)


def select_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``out[b, i] = x[b, index[b, i]]``: x (B, L, H), index (B, M) int64 → (B, M, H).

    What ``x.gather(1, index[..., None].expand(-1, -1, H))`` computes, as one ``index_select`` over the
    flattened (B·L, H) rows: no (B, M, H) int64 index is built, and the backward is an ``index_add`` over rows
    instead of a ``scatter_add`` over elements (several times faster on the CPU).
    """
    batch, length, hidden = x.shape
    flat = (index + torch.arange(batch, device=index.device)[:, None] * length).reshape(-1)  # (B·M,)
    return x.reshape(batch * length, hidden).index_select(0, flat).view(batch, -1, hidden)


def _check_expand(y_grid: torch.Tensor, t: torch.Tensor) -> None:
    if y_grid.dim() != 3:
        raise ValueError(f"y_grid must have shape (B, Lg, H); got {tuple(y_grid.shape)}")
    _check_times(t)
    if t.shape[0] != y_grid.shape[0]:
        raise ValueError(f"t must have shape (B={y_grid.shape[0]}, L) like y_grid's batch; got {tuple(t.shape)}")


def _gather_grid(y_grid: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """y_l = ȳ_{k_l} for 1-based k (B, L), 0 where k = 0 → (B, L, H)."""
    batch, num_grid, hidden = y_grid.shape
    if num_grid == 0:
        return y_grid.new_zeros(batch, k.shape[1], hidden)
    out = select_rows(y_grid, (k - 1).clamp(min=0))  # (B, L, H)
    return torch.where((k > 0)[..., None], out, 0.0)


def expand_floor(y_grid: torch.Tensor, t: torch.Tensor, grid_step: torch.Tensor | float) -> torch.Tensor:
    """Causal expansion (Eq. 14b by zero-order hold): ``y_l = ȳ_{j(l)}``, ``j(l) = ⌊t_l/Δ⌋``, 0 if j(l) = 0.

    ``t̄_{j(l)} ≤ t_l`` means grid point j(l) was emitted at or before token l (``e_{j(l)} ≤ l``), so a causal
    SSM over the grid keeps y_l a function of x_{≤l}. Args: y_grid (B, Lg, H) with Lg ≥ max L̄; t (B, L) from
    :func:`resampling_times`; grid_step Δ. Returns (B, L, H); differentiable in y_grid.
    """
    _check_expand(y_grid, t)
    return _gather_grid(y_grid, grid_index(t, grid_step))


def expand_nearest(y_grid: torch.Tensor, t: torch.Tensor, grid_step: torch.Tensor | float) -> torch.Tensor:
    """Paper expansion (Eq. 14b): ``y_l = ȳ_k``, ``k = clamp(round(t_l/Δ), 1, L̄)``, the nearest grid point.

    A time exactly halfway between two grid points goes to the earlier one (``round`` half down, exactly on
    the lattice). Rows with L̄ = 0 give zeros. Not causal: k can be up to Δ/2 after t_l. Args and returns as
    :func:`expand_floor`.
    """
    _check_expand(y_grid, t)
    lattice = _lattice(grid_step, t.device)
    units = _units(t, lattice)  # (B, L)
    nearest = torch.div(2 * units + lattice.units - 1, 2 * lattice.units, rounding_mode="floor")  # (B, L)
    sizes = torch.div(units[:, -1:], lattice.units, rounding_mode="floor")  # (B, 1) L̄
    return _gather_grid(y_grid, torch.minimum(nearest.clamp(min=1), sizes))


def continued_stream(
    state: ResamplingState,
    x: torch.Tensor,
    step: torch.Tensor,
    grid_step: torch.Tensor | float,
    mask: torch.Tensor | None = None,
) -> ContinuedStream:
    """New tokens after a streaming state, in the layout that lets the parallel path continue the stream.

    A causal window reaches back at most K real tokens, all of which the state buffers, so the buffer in front
    of the new tokens holds every input a new grid point can read. The new times continue the clock exactly
    (lattice sums), and shifting all times by the emitted grid points ``gΔ`` numbers the new grid points from
    1: ``causal_windows(shifted, Δ, K, mask)`` gives the windows :func:`resampling_step` would emit token by
    token, with the same distances, and ``expand_floor`` on the new tokens' shifted times reads them (0 where
    no new grid point has passed yet: the caller holds its last output there).

    Args: state from :func:`resampling_prefill` or :func:`resampling_step`; x (B, L, H) new branch inputs;
    step (B, L) their Δ_l (Eq. 13); grid_step Δ; mask optional (B, L), 1 = real token.
    """
    batch, window, _ = state.inputs.shape
    lattice = _lattice(grid_step, x.device)
    times = state.clock[:, None] + resampling_times(step, grid_step, mask)  # (B, L) exact continuation
    filled = torch.arange(window, device=x.device) >= window - state.count[:, None]  # (B, K)
    new_mask = torch.ones(batch, x.shape[1], dtype=torch.bool, device=x.device) if mask is None else mask != 0
    all_times = torch.cat([state.times, times], dim=1)  # (B, K + L)
    return ContinuedStream(
        inputs=torch.cat([state.inputs.to(x.dtype), x], dim=1),
        mask=torch.cat([filled, new_mask], dim=1),
        times=all_times,
        shifted=all_times - state.grid_count[:, None].to(torch.float64) * lattice.delta,
    )


def resampling_init_state(
    batch: int, window: int, hidden: int, *, dtype: torch.dtype = torch.float32, device=None
) -> ResamplingState:
    """The streaming state before any token: clock 0, no grid point, an empty K-slot window buffer."""
    _check_window(window)
    return ResamplingState(
        clock=torch.zeros(batch, dtype=torch.float64, device=device),
        grid_count=torch.zeros(batch, dtype=torch.long, device=device),
        inputs=torch.zeros(batch, window, hidden, dtype=dtype, device=device),
        times=torch.zeros(batch, window, dtype=torch.float64, device=device),
        count=torch.zeros(batch, dtype=torch.long, device=device),
    )


def resampling_prefill(
    x: torch.Tensor,
    t: torch.Tensor,
    grid_step: torch.Tensor | float,
    window: int,
    mask: torch.Tensor | None = None,
) -> ResamplingState:
    """The streaming state after a parallel pass over a prompt (causal mode).

    Args: x (B, L, H) the branch inputs; t (B, L) from :func:`resampling_times`; grid_step Δ; window K;
    mask optional (B, L), 1 = real token. Returns clock ``t_{L−1}``, grid_count L̄ and the last K real tokens
    (inputs and times), exactly the state :func:`resampling_step` reaches token by token.
    """
    if x.dim() != 3:
        raise ValueError(f"x must have shape (B, L, H); got {tuple(x.shape)}")
    batch, length, hidden = x.shape
    _check_times(t)
    if tuple(t.shape) != (batch, length):
        raise ValueError(f"t must have shape (B, L) = {(batch, length)} like x; got {tuple(t.shape)}")
    _check_window(window)
    mask = _check_mask(mask, (batch, length))
    _, real_pos, n_real = _real_tokens(mask, batch, length, x.device)
    ranks = n_real[:, None] - window + torch.arange(window, device=x.device)  # (B, K) last K real ranks
    filled = ranks >= 0
    index = torch.where(filled, real_pos.gather(1, ranks.clamp(min=0)), 0)  # (B, K)
    inputs = torch.where(filled[..., None], x.gather(1, index[..., None].expand(-1, -1, hidden)), 0.0)  # (B, K, H)
    times = torch.where(filled, t.to(torch.float64).gather(1, index), 0.0)  # (B, K)
    return ResamplingState(
        clock=t[:, -1].to(torch.float64),
        grid_count=grid_sizes(t, grid_step),
        inputs=inputs,
        times=times,
        count=n_real.clamp(max=window),
    )


class ResamplingLattice(NamedTuple):
    """The time lattices of one or more grid steps, elementwise (see "Exact clock" above), built on the device
    without a host sync: quantum q and Δ float64, units int64 (Δ = units·q exactly)."""

    quantum: torch.Tensor
    units: torch.Tensor
    delta: torch.Tensor


def resampling_lattice(grid_step: torch.Tensor | float, *, check: bool = True) -> ResamplingLattice:
    """Δ (a scalar, or a tensor of them: one per branch or row) snapped to its lattice ``q = 2^(⌊log₂Δ⌋ − 28)``
    elementwise, on Δ's device. ``delta`` carries Δ's gradient straight through. ``check``: raise ValueError
    unless every Δ is positive and finite (in [2^-121, 2^127), where the lattice is exact), reading Δ on the host
    (skipped under ``torch.compile``); a caller that must not read the device (a training forward) passes False and
    checks Δ its own way."""
    # a tensor stays on its device (as_tensor would move it to torch's default device, where one is set)
    raw = (grid_step if isinstance(grid_step, torch.Tensor) else torch.as_tensor(grid_step)).to(torch.float64)
    value = raw.detach()
    if check and not torch.compiler.is_compiling() and not bool(((value >= _MIN_DELTA) & (value < _MAX_DELTA)).all()):
        raise ValueError(f"grid_step must be positive and finite (Δ in [2^-121, 2^127)); got {value.tolist()}")
    # ⌊log₂Δ⌋ from log2, corrected where it rounded across a power of two (the powers are exact), so that
    # an exported step needs no frexp (ONNX has none)
    exponent = torch.floor(torch.log2(value))
    power = _power_of_two(exponent)
    exponent = exponent - (power > value).to(value.dtype) + (2 * power <= value).to(value.dtype)
    quantum = _power_of_two(exponent - _LATTICE_BITS)
    units = torch.round(value / quantum).long()
    delta = units * quantum
    if raw.requires_grad:
        delta = delta + (raw - value)  # value exactly units·q, gradient of grid_step
    return ResamplingLattice(quantum, units, delta)


def _power_of_two(exponent: torch.Tensor) -> torch.Tensor:
    """``2^e`` exactly, for integer-valued float64 ``e`` in [−149, 127]. ``pow(2, e)`` alone is not exact on every
    device (on an H100, CUDA's ``pow(2.0, −32.0)`` came out one ulp below 2^−32, which would put the lattice off the
    powers of two and its sums off exact); it is within a few ulps, and rounding it to float32, which holds 2^e
    exactly, snaps it back."""
    return torch.pow(2.0, exponent).float().double()


@float32_math
def resampling_step(
    state: ResamplingState,
    x_t: torch.Tensor,
    step_t: torch.Tensor,
    grid_step: torch.Tensor | float | ResamplingLattice,
    mask_t: torch.Tensor | None = None,
) -> tuple[ResamplingState, ResamplingEmission]:
    """One token of the causal resampling (causal mode), O(K·H): advance the clock, push the token, maybe emit.

    A real token adds its (lattice-snapped, clamped) step to the clock and enters the window buffer; a pad
    (``mask_t`` 0) changes nothing. Since steps are ≤ Δ a token crosses at most one grid point; every real
    token crosses exactly one when steps equal Δ (κ = 1). A crossing row emits the window of grid point
    ``j = ⌊clock/Δ⌋``: the last K real tokens including this one and their distances ``t̄_j − t_k``, the same
    bits as :func:`causal_windows` on the whole sequence.

    Rows may have more than one leading dim (B, R, ...: several branches stepped at once), written (B,) below.

    Args:
        state: from :func:`resampling_init_state`, :func:`resampling_prefill` or a previous step.
        x_t: (B, H) this token's branch input; step_t: (B,) its step Δ_l (Eq. 13);
        grid_step: Δ, a scalar or one per row (broadcasting against (B,)), or its :func:`resampling_lattice`;
        mask_t: optional (B,), 1 = real token.

    Returns:
        The new state and a :class:`ResamplingEmission` (the layer runs θ_Γ on it and steps its SSM on the
        emitting rows only).
    """
    *rows, window, hidden = state.inputs.shape
    rows = tuple(rows)
    if tuple(x_t.shape) != (*rows, hidden):
        raise ValueError(f"x_t must have shape (B, H) = {(*rows, hidden)} like the state; got {tuple(x_t.shape)}")
    if tuple(step_t.shape) != rows or not step_t.dtype.is_floating_point:
        raise ValueError(f"step_t must be a floating tensor of shape (B,) = {rows}; got {tuple(step_t.shape)}")
    mask_t = _check_mask(mask_t, rows, "mask_t")
    lattice = grid_step if isinstance(grid_step, ResamplingLattice) else resampling_lattice(grid_step)
    raw = step_t.to(torch.float64)
    step = torch.minimum(torch.round(raw.detach() / lattice.quantum).clamp_(min=0), lattice.units) * lattice.quantum
    if raw.requires_grad:
        step = step + (raw - raw.detach())  # snapped value, gradient of step_t
    if mask_t is not None:
        step = torch.where(mask_t, step, 0.0)
    clock = state.clock + step  # (B,) exact lattice sum
    inputs = torch.cat([state.inputs[..., 1:, :], x_t[..., None, :].to(state.inputs.dtype)], dim=-2)  # (B, K, H)
    times = torch.cat([state.times[..., 1:], clock[..., None]], dim=-1)  # (B, K)
    count = (state.count + 1).clamp(max=window)
    if mask_t is not None:  # a pad pushes nothing
        inputs = torch.where(mask_t[..., None, None], inputs, state.inputs)
        times = torch.where(mask_t[..., None], times, state.times)
        count = torch.where(mask_t, count, state.count)
    clock_units = torch.round(clock.detach() / lattice.quantum).long()  # (B,)
    grid_count = torch.div(clock_units, lattice.units, rounding_mode="floor")  # (B,) ⌊t/Δ⌋
    emitted = grid_count > state.grid_count
    valid = emitted[..., None] & (torch.arange(window, device=x_t.device) >= window - count[..., None])  # (B, K)
    grid_time = grid_count * lattice.delta  # (B,) t̄_j, float64
    emission = ResamplingEmission(
        emitted=emitted,
        inputs=torch.where(valid[..., None], inputs, 0.0),
        valid=valid,
        distance=torch.where(valid, grid_time[..., None] - times, 0.0),
    )
    return ResamplingState(clock, grid_count, inputs, times, count), emission
