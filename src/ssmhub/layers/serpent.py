"""The SeRpEnt mixer: Mamba branches over selectively resampled copies of the sequence (arXiv 2501.11729 §4).

One block (Eq. 15) on x ∈ R^{B×L×H} with ``1 + len(resampling_rates)`` branches of width H_b = H / #branches:

- the base branch: a Mamba mixer over the full sequence (H → H_b; App. B.1 "a base branch with no
  resampling"; the paper does not say how it maps H → H_b, here Mamba's own in/out projections do);
- one :class:`ResamplingBranch` per compression rate κ:
    1. Eq. 13: per-token steps ``Δ_l = σ(θ_Δ x_l)·Δ·(1−κ) + κΔ`` (a scalar per token; Δ learnable, init 1);
    2. Eq. 9 / 11: times ``t_l = Σ_{i≤l} Δ_i`` (float64, exact; :mod:`ssmhub.ops.resampling`) and the uniform
       grid ``t̄_j = jΔ``, j = 1..L̄, ``L̄ = ⌊t_{L−1}/Δ⌋``;
    3. Eq. 12: ``x̄_j = θ_Γ(⊕_{k ∈ N_K(t̄_j)} [x_k, ε(t̄_j − t_k)])`` with G Gaussian distance features;
    4. Eq. 15a: the branch's Mamba (H_b → H_b) over x̄;
    5. Eq. 14b: back to length L by copying a grid output to every token.
- Eq. 15b: the branch outputs are concatenated; the block's residual stream is the skip ``+ x``.

Two resampling modes; the paper never discusses causality, and the causal mode is ours. ``"faithful"``: N_K is
the K nearest tokens in time and the expansion copies the nearest grid point, as the paper writes it; output l
then reads up to ~1/(2κ) + K/2 later tokens, so this mode is for classification. ``"causal"`` (default): N_K is
the last K tokens up to the first token at or past t̄_j and the expansion holds ȳ_{⌊t_l/Δ⌋} (0 before the first
grid point), so output l depends on tokens ≤ l only, and the branch streams: per token at most one grid point,
O(K·H + Mamba step).

Padding: pad tokens advance no clock, enter no window and leave every Mamba state unchanged, so a
left-padded row gives the numbers of the row alone.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..ops.host_reads import are_free as host_reads_are_free
from ..ops.resampling import (
    ResamplingLattice,
    ResamplingState,
    causal_windows,
    continued_stream,
    expand_floor,
    expand_nearest,
    gather_windows,
    gaussian_distance_features,
    grid_index,
    nearest_windows,
    resampling_lattice,
    resampling_prefill,
    resampling_times,
)
from .initial_values import fill_initial_values
from .mamba import MambaMixer
from .mixer import TokenMixer
from .serpent_options import SerpentOptions
from .serpent_step import stack_branches, stacked_weights, step_branches

__all__ = ["ResamplingBranch", "SerpentMixer", "SerpentOptions"]
_STREAM_FIELDS = ResamplingState._fields  # clock, grid_count, inputs, times, count
_FAITHFUL_HAS_NO_STATE = (
    "faithful resampling reads later tokens (use resampling_mode='causal' to decode, or call with use_cache=False)"
)


def static_grid(x: torch.Tensor) -> bool:
    """Whether a parallel pass over x pads every branch's grid to L slots (L̄ ≤ L, a step being at most Δ) instead of
    reading max L̄ back: on an accelerator (where the read is a host sync per branch and forward) and under
    ``torch.compile`` (where it is a data-dependent shape). On the CPU the read waits for nothing, and a grid of
    max L̄ slots skips the θ_Γ and Mamba work of the slots past it (up to 1 − κ of the branch's grid)."""
    return not host_reads_are_free(x)


class ResamplingParameters(nn.Module):
    """A branch's resampling parameters, float32 and out of weight decay: ``log_grid_step`` (the grid step
    Δ = exp(log_grid_step), init 1; Eq. 13 says only that Δ is learnable) and the Gaussian centres μ (G,) of
    Eq. 12, drawn uniformly over the range the window distances take at init (causal: (−Δ, KΔ]; faithful: about
    ±KΔ/2)."""

    def __init__(self, num_features: int, window: int, mode: str):
        super().__init__()
        self.window, self.mode = window, mode
        self.log_grid_step = nn.Parameter(torch.empty(()))
        self.distance_centers = nn.Parameter(torch.empty(num_features))
        fill_initial_values(self)

    def initial_parameter_values(self) -> dict[str, torch.Tensor]:
        low, high = (-1.0, float(self.window)) if self.mode == "causal" else (-self.window / 2, self.window / 2)
        centers = torch.empty(self.distance_centers.shape).uniform_(low, high)
        return {"log_grid_step": torch.zeros(()), "distance_centers": centers}

    def grid_step(self) -> torch.Tensor:
        """Δ, a float32 scalar."""
        return self.log_grid_step.float().exp()

    def lattice(self, grid_step: torch.Tensor) -> ResamplingLattice:
        """Δ (:meth:`grid_step`) on its exact time lattice (:func:`~ssmhub.ops.resampling.resampling_lattice`),
        built and checked on the device, so a forward reads nothing back: an exp that overflowed or underflowed
        fails an asynchronous assert."""
        finite = (grid_step > 0) & torch.isfinite(grid_step)
        torch._assert_async(finite, "SeRpEnt's grid step Δ = exp(log_grid_step) must be positive and finite")
        return resampling_lattice(grid_step, check=False)


class ResamplingBranch(TokenMixer):
    """One compressed branch of Eq. 15a: resample (Eq. 11-13), Mamba over the grid, expand back (Eq. 14b).

    Args:
        hidden_size: H, the block's input width. branch_size: H_b, this branch's output width.
        resampling_rate: κ ∈ (0, 1], the minimum compression rate L̄/L.
        options: a :class:`SerpentOptions` (or a config holding its fields): the window K
            (``resampling_window``), G (``num_distance_features``), the ``resampling_mode`` and the branch
            Mamba's options; ``**values`` override single fields.
    """

    def __init__(
        self,
        hidden_size: int,
        branch_size: int,
        resampling_rate: float,
        options: SerpentOptions | None = None,
        **values,
    ):
        super().__init__()
        options = SerpentOptions.take(options, **values)
        options.check_options()
        if isinstance(resampling_rate, bool) or not 0 < resampling_rate <= 1:
            raise ValueError(f"{type(self).__name__}.resampling_rate must lie in (0, 1] (κ); got {resampling_rate}")
        self.hidden_size, self.branch_size, self.output_size = hidden_size, branch_size, branch_size
        window, mode = options.resampling_window, options.resampling_mode
        self.resampling_rate, self.window, self.mode = resampling_rate, window, mode
        self.causal = mode == "causal"
        self.step_proj = nn.Linear(hidden_size, 1)  # θ_Δ of Eq. 13
        num_features = options.num_distance_features
        self.compress = nn.Linear(window * (hidden_size + num_features), branch_size)  # θ_Γ of Eq. 12
        self.mamba = MambaMixer(branch_size, options)
        self.ssm = ResamplingParameters(num_features, window, mode)

    # ----------------------------------------------------------------------------- pieces
    def steps(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. 13: x (..., H) -> (Δ_l (...) float32 in [κΔ, Δ], Δ)."""
        grid_step = self.ssm.grid_step()
        kappa = self.resampling_rate
        # A streamed token must get the very float32 Δ_l the parallel pass gives it, or the two clocks drift apart
        # and cross grid points at different tokens. So θ_Δ·x is a product and a sum along H per token, not a
        # matmul (whose rounding depends on how many tokens the call holds), and the gate is computed in
        # float64 and rounded once to float32: torch's vectorized and scalar sigmoid differ in the last float32
        # bit (a call over many tokens takes the first, a single token the second), while a float64 difference
        # of an ulp changes the rounded float32 only at a rounding midpoint (odds about 2^-29 per token).
        weight, bias = self.step_proj.weight[0].double(), self.step_proj.bias.double()
        logit = (x.double() * weight).sum(-1) + bias
        gate = torch.sigmoid(logit).float()
        return gate * grid_step * (1 - kappa) + kappa * grid_step, grid_step

    def _compress(self, inputs: torch.Tensor, distance: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Eq. 12: window inputs (..., K, H), distances and validity (..., K) -> x̄ (..., H_b).

        θ_Γ reads ``⊕_k [x_k, ε_k]``; its columns are split into those that read inputs and those that read
        features, so that the (..., K, H + G) window is never concatenated (a copy K times the size of x)."""
        features = gaussian_distance_features(distance, self.ssm.distance_centers, valid)  # (..., K, G)
        hidden = inputs.shape[-1]
        weight = self.compress.weight.view(self.branch_size, self.window, -1)  # (H_b, K, H + G)
        x_weight = weight[..., :hidden].reshape(self.branch_size, -1)  # (H_b, K·H)
        f_weight = weight[..., hidden:].reshape(self.branch_size, -1)  # (H_b, K·G)
        y = F.linear(inputs.flatten(-2), x_weight.to(inputs.dtype), self.compress.bias.to(inputs.dtype))
        return y + F.linear(features.to(inputs.dtype).flatten(-2), f_weight.to(inputs.dtype))  # (..., H_b)

    # ----------------------------------------------------------------------------- state
    def noncausal_reason(self) -> str:
        return _FAITHFUL_HAS_NO_STATE

    def state_layout(self, batch_size: int, dtype=None):
        """The stream of :func:`~ssmhub.ops.resampling.resampling_step` (clock and window times float64, grid and
        token counters, the last K inputs), the held output ȳ_j and the branch Mamba's state; all zero at first."""
        B, K, H = batch_size, self.window, self.hidden_size
        return {
            "clock": ((B,), torch.float64),
            "grid_count": ((B,), torch.long),
            "inputs": ((B, K, H), torch.float32),
            "times": ((B, K), torch.float64),
            "count": ((B,), torch.long),
            "held": ((B, self.branch_size), torch.float32),
            **self.mamba.state_layout(batch_size),
        }

    # ----------------------------------------------------------------------------- forward
    def _forward(self, x, mask, state, return_state):
        """x (B, L, H) -> y (B, L, H_b), in parallel: from the start, or continuing a streaming ``state``."""
        if state is None:
            return self._parallel(x, mask, return_state)
        return self._continue(x, mask, state, return_state)

    def _continue(self, x, mask, state, return_state):
        """The parallel path after a state (causal mode): the state's buffered K tokens go in front of x, times
        continue its clock and count grid points from the last one emitted (:func:`continued_stream`); the new
        grid points' windows are compressed at once and the branch Mamba continues from its state over them.
        Tokens before the first new grid point hold the state's last output ȳ (as :meth:`_step` does)."""
        step, grid_step = self.steps(x)  # (B, L)
        lattice = self.ssm.lattice(grid_step)
        stream = continued_stream(ResamplingState(*(state[name] for name in _STREAM_FIELDS)), x, step, lattice, mask)
        num_grid = x.shape[1] if static_grid(x) else None  # L new tokens pass at most L new grid points
        windows = causal_windows(stream.shifted, lattice, self.window, stream.mask, num_grid)  # (B, Lg, K): new points
        x_grid = self._compress(
            gather_windows(stream.inputs, windows.index, windows.valid), windows.distance, windows.valid
        )  # (B, Lg, H_b), slot j − 1 = new grid point j
        mamba_state = {name: state[name] for name in ("conv_state", "ssm_state")}
        y_grid, mamba_state = self._mamba_continued(x_grid, windows.grid_mask, mamba_state, return_state)
        new_times = stream.shifted[:, self.window :]  # (B, L)
        y = expand_floor(y_grid, new_times, lattice)  # (B, L, H_b); 0 before the first new grid point
        before = grid_index(new_times, lattice) == 0  # (B, L): no new grid point passed yet
        y = torch.where(before[..., None], state["held"].to(y.dtype)[:, None], y)
        if not return_state:
            return y, None
        prefill = resampling_prefill(stream.inputs.float(), stream.times, lattice, self.window, stream.mask)
        held = y[:, -1].float() if x.shape[1] else state["held"]
        return y, {**prefill._asdict(), "held": held, **mamba_state}

    def _mamba_continued(self, x_grid, grid_mask, mamba_state, return_state):
        """The branch Mamba over each row's new grid points (x_grid (B, Lg, H_b), the first ``grid_mask`` slots
        valid), continuing from its state, all rows at once: the slots after a row's points are right padding, whose
        Δ = 0 leaves the SSM state and the causal outputs of the points as they were; the convolution's window is
        taken after the row's last point. Outputs at padding slots are 0."""
        if x_grid.shape[1] == 0:
            return x_grid, mamba_state
        y, new_state = self.mamba(x_grid, mask=grid_mask, state=mamba_state, return_state=True)  # (B, Lg, H_b)
        new_state["conv_state"] = self.mamba.conv_state_after(x_grid, mamba_state, grid_mask.sum(1))
        return y * grid_mask[..., None].to(y.dtype), new_state

    def _parallel(self, x, mask, return_state):
        """x (B, L, H) -> y (B, L, H_b) from the start of the sequence. Where :func:`static_grid`, every shape is
        fixed by x's and nothing is read back from the device: the grid has L slots and the branch Mamba always
        takes the mask of its grid points."""
        batch, length, _ = x.shape
        static = static_grid(x)
        step, grid_step = self.steps(x)  # (B, L)
        lattice = self.ssm.lattice(grid_step)
        t = resampling_times(step, lattice, mask)  # (B, L) float64, Eq. 9
        find_windows = causal_windows if self.mode == "causal" else nearest_windows
        windows = find_windows(t, lattice, self.window, mask, num_grid=length if static else None)  # (B, Lg, K) each
        x_grid = self._compress(
            gather_windows(x, windows.index, windows.valid), windows.distance, windows.valid
        )  # (B, Lg, H_b), Lg = L or max L̄
        # Right-align each row's L̄ grid points (batch padding in front), so that the branch Mamba treats
        # them as left padding: its state after the last slot is the state after grid point L̄.
        num_grid = x_grid.shape[1]
        grid_sizes = windows.grid_mask.sum(1)  # (B,) L̄
        offset = (num_grid - grid_sizes)[:, None]  # (B, 1)
        slots = torch.arange(num_grid, device=x.device)[None, :]  # (1, Lg)
        aligned_mask = slots >= offset  # (B, Lg)
        aligned = x_grid.gather(1, (slots - offset).clamp(min=0)[..., None].expand_as(x_grid))  # (B, Lg, H_b)
        if num_grid:
            grid_mask = aligned_mask if static or not bool(aligned_mask.all()) else None
            y_aligned, mamba_state = self.mamba(aligned, mask=grid_mask, return_state=return_state)  # (B, Lg, H_b)
        else:  # no row reached its first grid point yet
            y_aligned, mamba_state = aligned, None
        y_grid = y_aligned.gather(1, (slots + offset).clamp(max=max(num_grid - 1, 0))[..., None].expand_as(y_aligned))
        expand = expand_floor if self.mode == "causal" else expand_nearest
        y = expand(y_grid, t, lattice)  # (B, L, H_b), Eq. 14b
        if not return_state:
            return y, None
        stream = resampling_prefill(x.float(), t, lattice, self.window, mask)
        if mamba_state is None:  # no grid point in any row yet
            mamba_state = self.mamba.init_state(batch, device=x.device)
        held = y[:, -1].float() if length else x.new_zeros(batch, self.branch_size, dtype=torch.float32)
        return y, {**stream._asdict(), "held": held, **mamba_state}

    def _step(self, x_t, state, mask_t):
        """One token of the causal mode (:mod:`ssmhub.ops.resampling`): advance the clock, push the token; if it
        crosses t̄_j, compress the window and step the branch Mamba (on those rows only); emit the held ȳ_j (0
        before the first grid point). The step of a mixer's branches at once (:func:`step_branches`), R = 1."""
        stacked = {name: value.unsqueeze(1) for name, value in state.items()}  # (B, 1, ...)
        y_t, new_state = step_branches(stacked_weights(self, [self]), x_t, stacked, mask_t)
        return y_t[:, 0], {name: value[:, 0] for name, value in new_state.items()}

    def extra_repr(self) -> str:
        return f"resampling_rate={self.resampling_rate}, window={self.window}, mode={self.mode!r}"


class SerpentMixer(TokenMixer):
    """SeRpEnt token mixer (Eq. 15; :class:`~ssmhub.layers.mixer.TokenMixer`).

    Args:
        hidden_size: H, split into 1 + len(resampling_rates) branches (:meth:`SerpentOptions.branch_widths`).
        options: a :class:`SerpentOptions` (or a ``SerpentConfig``, which is one); ``**values`` override single
            fields. With ``resampling_rates=[]`` the mixer is a plain Mamba mixer.
    """

    # packed rows branch by branch: the base Mamba natively (the row's own cost), each resampling branch through
    # the protocol's batch of documents (its clocks, grids and windows restart with every document run alone)
    native_packing = True

    def __init__(self, hidden_size: int, options: SerpentOptions | None = None, **values):
        super().__init__()
        options = SerpentOptions.take(options, **values)
        options.check_options(hidden_size)
        self.hidden_size = hidden_size
        self.base_size, self.branch_size = options.branch_widths(hidden_size)
        self.resampling_mode = options.resampling_mode
        self.causal = options.resampling_mode == "causal"
        self.base = MambaMixer(hidden_size, options, output_size=self.base_size)
        self.resampled = nn.ModuleList(
            ResamplingBranch(hidden_size, self.branch_size, kappa, options) for kappa in options.resampling_rates
        )

    def noncausal_reason(self) -> str:
        return _FAITHFUL_HAS_NO_STATE

    def state_layout(self, batch_size: int, dtype=None):
        """``"base.<field>"``: the base Mamba's state; ``"resampled.<field>"``: the resampling branches' states
        stacked after the batch dim, (B, R, ...), as their decode step reads them (:func:`step_branches`)."""
        layout = {f"base.{name}": spec for name, spec in self.base.state_layout(batch_size, dtype).items()}
        if len(self.resampled):
            for name, (shape, kind) in self.resampled[0].state_layout(batch_size, dtype).items():
                layout[f"resampled.{name}"] = ((shape[0], len(self.resampled), *shape[1:]), kind)
        return layout

    @staticmethod
    def _part(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
        """The fields ``"<prefix>.<field>"`` of a mixer state, as ``{field: tensor}``."""
        return {name[len(prefix) + 1 :]: value for name, value in state.items() if name.startswith(prefix + ".")}

    def _branch_states(self, state):
        """Per branch, its state (the base's, then each resampling branch's (B, ...) slice), or Nones."""
        if state is None:
            return [None] * (1 + len(self.resampled))
        stacked = self._part(state, "resampled")
        slices = [{name: value[:, i] for name, value in stacked.items()} for i in range(len(self.resampled))]
        return [self._part(state, "base"), *slices]

    def _forward(self, x, mask, state, return_state, starts=None):
        """x (B, L, H) -> y (B, L, H): the branch outputs concatenated (Eq. 15b without the skip, which is
        the block's residual); ``starts`` (B, L) bool or None: document starts of packed rows."""
        branches = [self.base, *self.resampled]
        results = [
            branch(x, mask, branch_state, return_state, document_starts=starts)
            for branch, branch_state in zip(branches, self._branch_states(state))
        ]
        y = torch.cat([y for y, _ in results], dim=-1) if len(results) > 1 else results[0][0]  # (B, L, H)
        if not return_state:
            return y, None
        new_state = {f"base.{name}": value for name, value in results[0][1].items()}
        if len(results) > 1:
            for name in results[1][1]:
                new_state[f"resampled.{name}"] = torch.stack([s[name] for _, s in results[1:]], dim=1)  # (B, R, ...)
        return y, new_state

    def _step(self, x_t, state, mask_t):
        """One token through every branch, O(1) in the context length: the base Mamba, then the resampling
        branches all at once on their stacked weights and states (:func:`step_branches`)."""
        y_t, base_state = self.base._step(x_t, self._part(state, "base"), mask_t)
        new_state = {f"base.{name}": value for name, value in base_state.items()}
        if not len(self.resampled):
            return y_t, new_state
        if torch.compiler.is_compiling():  # each branch on its own weights: stacking them would copy every step
            y_branches, stacked = self._step_branches_one_by_one(x_t, self._part(state, "resampled"), mask_t)
        else:
            weights = stacked_weights(self, self.resampled)
            y_branches, stacked = step_branches(weights, x_t, self._part(state, "resampled"), mask_t)
        new_state.update({f"resampled.{name}": value for name, value in stacked.items()})
        return torch.cat([y_t, y_branches.flatten(1)], dim=-1), new_state  # (B, H_base + R·H_b), branch order

    def _step_branches_one_by_one(self, x_t, stacked, mask_t):
        """:func:`step_branches` of each resampling branch alone (R = 1, its weights as views), restacked."""
        results = [
            step_branches(
                stack_branches([branch]), x_t, {name: value[:, i : i + 1] for name, value in stacked.items()}, mask_t
            )
            for i, branch in enumerate(self.resampled)
        ]
        y = torch.cat([y for y, _ in results], dim=1)  # (B, R, H_b)
        return y, {name: torch.cat([s[name] for _, s in results], dim=1) for name in stacked}

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, base_size={self.base_size}, branch_size={self.branch_size}, "
            f"mode={self.resampling_mode!r}"
        )
