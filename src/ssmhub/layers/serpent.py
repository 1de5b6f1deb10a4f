"""The SeRpEnt mixer: Mamba branches over selectively resampled copies of the sequence (arXiv 2501.11729 §4).

One block (Eq. 15) on x ∈ R^{B×L×H}: a base branch, a Mamba mixer over the full sequence (App. B.1 "a base
branch with no resampling"), and one :class:`ResamplingBranch` per compression rate κ:

1. Eq. 13: per-token steps ``Δ_l = σ(θ_Δ x_l)·Δ·(1−κ) + κΔ`` (a scalar per token; Δ learnable, init 1);
2. Eq. 9 / 11: times ``t_l = Σ_{i≤l} Δ_i`` (float64, exact; :mod:`ssmhub.ops.resampling`) and the uniform
   grid ``t̄_j = jΔ``, j = 1..L̄, ``L̄ = ⌊t_{L−1}/Δ⌋``;
3. Eq. 12: ``x̄_j = θ_Γ(⊕_{k ∈ N_K(t̄_j)} [x_k, ε(t̄_j − t_k)])`` with G Gaussian distance features;
4. Eq. 15a: the branch's Mamba (H_b → H_b) over x̄;
5. Eq. 14b: back to length L by copying a grid output to every token.

Two branch layouts (``SerpentOptions.branch_layout``). ``"concatenated"``, the paper's reading (Eq. 15b): the
branches have width H_b = H / #branches, the base Mamba maps H → H_b with its own in/out projections (the paper
does not say how), θ_Γ is dense over the window (K·(H + G) → H_b) and the branch outputs are concatenated.
``"additive"`` (default; ours): the base branch is a whole Mamba block of width H; a branch projects x to a small
width H_b first (``window_proj``), θ_Γ is depthwise per window slot (:class:`~.serpent_maps.DepthwiseWindowMap`)
and the branch's output returns to H through a zero-initialised :class:`~.serpent_maps.BranchOutput` and is added to
the base's. The paper's θ_Γ held about half of a concatenated model's parameters; here a branch costs about
(H + 3·H_b)·H_b + K·(G + 1)·H_b + a Mamba of width H_b, and a Mamba checkpoint gains branches without changing
its function. In both layouts the block's residual stream is the skip ``+ x``.

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

from typing import NamedTuple

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
from .serpent_maps import BranchOutput, DenseWindowMap, DepthwiseWindowMap, StepProjection
from .serpent_maps import linear_init_std as linear_init_std_of
from .serpent_options import SerpentOptions
from .serpent_step import project_outputs, stacked_weights, step_branches

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


class BranchGrid(NamedTuple):
    """A branch's grid from the start of a sequence (:meth:`ResamplingBranch.grid`): ``aligned`` (B, Lg, H_b) the
    grid inputs x̄, right-aligned; ``mask`` (B, Lg) its real slots; ``offset`` (B, 1) Lg − L̄; ``times`` (B, L)
    float64 t_l; ``lattice``; ``inputs`` (B, L, W) the window inputs; ``static`` whether Lg = L (no host read)."""

    aligned: torch.Tensor
    mask: torch.Tensor
    offset: torch.Tensor
    times: torch.Tensor
    lattice: ResamplingLattice
    inputs: torch.Tensor
    static: bool


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
        hidden_size: H, the block's input width. branch_size: H_b, the width of the branch's Mamba.
        resampling_rate: κ ∈ (0, 1], the minimum compression rate L̄/L.
        options: a :class:`SerpentOptions` (or a config holding its fields): the window K
            (``resampling_window``), G (``num_distance_features``), the ``resampling_mode``, the ``branch_layout``
            and the branch Mamba's options; ``**values`` override single fields.
        mamba: a Mamba mixer (width H_b) that this branch runs but does not own (the additive layout's mixer shares
            one among its branches and registers it itself); None: the branch builds and owns its own.
        linear_init_std: how the model initialises θ_Δ and θ_Γ (Eq. 13 and the concatenated layout's Eq. 12), as it
            does its ``nn.Linear`` maps (:func:`~.serpent_maps.linear_init_std`); None: what ``options`` says (a
            model config's ``init_scheme``), else torch.nn's defaults.

    Concatenated layout: windows of x (width H), a dense θ_Γ, output H_b. Additive layout: windows of
    ``window_proj(x)`` (width H_b), a depthwise θ_Γ, output ``output_proj`` (H_b → H, zero at first).
    """

    def __init__(
        self,
        hidden_size: int,
        branch_size: int,
        resampling_rate: float,
        options: SerpentOptions | None = None,
        *,
        mamba: MambaMixer | None = None,
        linear_init_std: float | None = None,
        **values,
    ):
        super().__init__()
        init_std = linear_init_std if linear_init_std is not None else linear_init_std_of(options)
        options = SerpentOptions.take(options, **values)
        options.check_options()
        if isinstance(resampling_rate, bool) or not 0 < resampling_rate <= 1:
            raise ValueError(f"{type(self).__name__}.resampling_rate must lie in (0, 1] (κ); got {resampling_rate}")
        window, mode = options.resampling_window, options.resampling_mode
        self.resampling_rate, self.window, self.mode = resampling_rate, window, mode
        self.causal = mode == "causal"
        self.additive = options.branch_layout == "additive"
        self.hidden_size, self.branch_size = hidden_size, branch_size
        self.output_size = hidden_size if self.additive else branch_size
        self.window_size = branch_size if self.additive else hidden_size  # W, the width of a window's inputs
        num_features = options.num_distance_features
        self.step_proj = StepProjection(hidden_size, init_std)  # θ_Δ of Eq. 13
        if self.additive:
            self.window_proj = nn.Linear(hidden_size, branch_size, bias=False)  # x (H) -> the windows' inputs (H_b)
            self.compress = DepthwiseWindowMap(window, branch_size, num_features)  # θ_Γ, per slot
        else:
            self.compress = DenseWindowMap(window, hidden_size, num_features, branch_size, init_std)  # θ_Γ, Eq. 12
        if mamba is None:
            self.mamba = MambaMixer(branch_size, options)
        else:  # shared: held but not registered here, so that its parameters are saved and counted once
            self.__dict__["mamba"] = mamba
        if self.additive:
            self.output_proj = BranchOutput(branch_size, hidden_size, options.branch_output_init_std)
        self.ssm = ResamplingParameters(num_features, window, mode)

    # ----------------------------------------------------------------------------- pieces
    def steps(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. 13: x (..., H) -> (Δ_l (...) float32 in [κΔ, Δ], Δ)."""
        grid_step = self.ssm.grid_step()
        kappa = self.resampling_rate
        # θ_Δ·x in float64 (:class:`StepProjection`), and the gate computed in float64 and rounded once to float32:
        # torch's vectorized and scalar sigmoid differ in the last float32 bit (a call over many tokens takes the
        # first, a single token the second), while a float64 difference of an ulp changes the rounded float32 only
        # at a rounding midpoint (odds about 2^-29 per token).
        gate = torch.sigmoid(self.step_proj(x)).float()
        return gate * grid_step * (1 - kappa) + kappa * grid_step, grid_step

    def window_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., H) -> what the windows hold (..., W): x itself (concatenated) or ``window_proj(x)`` (additive)."""
        return self.window_proj(x) if self.additive else x

    def project_output(self, y: torch.Tensor) -> torch.Tensor:
        """The branch Mamba's output (..., H_b) -> the branch's (..., output_size): ``output_proj`` (additive)."""
        return self.output_proj(y) if self.additive else y

    def _compress(self, inputs: torch.Tensor, distance: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Eq. 12: window inputs (..., K, W), distances and validity (..., K) -> x̄ (..., H_b)."""
        features = gaussian_distance_features(distance, self.ssm.distance_centers, valid)  # (..., K, G)
        return self.compress(inputs, features)

    # ----------------------------------------------------------------------------- state
    def noncausal_reason(self) -> str:
        return _FAITHFUL_HAS_NO_STATE

    def state_layout(self, batch_size: int, dtype=None):
        """The stream of :func:`~ssmhub.ops.resampling.resampling_step` (clock and window times float64, grid and
        token counters, the last K window inputs), the held output ȳ_j (before ``output_proj``) and the branch
        Mamba's state; all zero at first."""
        B, K, H = batch_size, self.window, self.window_size
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
        """x (B, L, H) -> y (B, L, output_size), in parallel: from the start, or continuing a streaming ``state``."""
        if state is None:
            y, new_state = self._parallel(x, mask, return_state)
        else:
            y, new_state = self._continue(x, mask, state, return_state)
        return self.project_output(y), new_state

    def _continue(self, x, mask, state, return_state):
        """The parallel path after a state (causal mode): the state's buffered K tokens go in front of x, times
        continue its clock and count grid points from the last one emitted (:func:`continued_stream`); the new
        grid points' windows are compressed at once and the branch Mamba continues from its state over them.
        Tokens before the first new grid point hold the state's last output ȳ (as :meth:`_step` does)."""
        step, grid_step = self.steps(x)  # (B, L)
        lattice = self.ssm.lattice(grid_step)
        stream = continued_stream(
            ResamplingState(*(state[name] for name in _STREAM_FIELDS)), self.window_inputs(x), step, lattice, mask
        )
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
        grid = self.grid(x, mask)
        if grid.aligned.shape[1]:
            grid_mask = grid.mask if grid.static or not bool(grid.mask.all()) else None
            y_aligned, mamba_state = self.mamba(grid.aligned, mask=grid_mask, return_state=return_state)
        else:  # no row reached its first grid point yet
            y_aligned, mamba_state = grid.aligned, None
        return self.from_grid(x, mask, grid, y_aligned, mamba_state, return_state)

    def grid(self, x, mask) -> BranchGrid:
        """Eq. 13, 9, 11 and 12 from the start of x (B, L, H): the grid inputs x̄ of each row, right-aligned (its
        L̄ grid points last, padding in front, so that the branch Mamba treats them as left padding and its state
        after the last slot is the state after grid point L̄), and what :meth:`from_grid` needs."""
        length = x.shape[1]
        static = static_grid(x)
        step, grid_step = self.steps(x)  # (B, L)
        lattice = self.ssm.lattice(grid_step)
        t = resampling_times(step, lattice, mask)  # (B, L) float64, Eq. 9
        find_windows = causal_windows if self.mode == "causal" else nearest_windows
        windows = find_windows(t, lattice, self.window, mask, num_grid=length if static else None)  # (B, Lg, K) each
        inputs = self.window_inputs(x)  # (B, L, W)
        x_grid = self._compress(
            gather_windows(inputs, windows.index, windows.valid), windows.distance, windows.valid
        )  # (B, Lg, H_b), Lg = L or max L̄
        num_grid = x_grid.shape[1]
        offset = (num_grid - windows.grid_mask.sum(1))[:, None]  # (B, 1): Lg − L̄
        slots = torch.arange(num_grid, device=x.device)[None, :]  # (1, Lg)
        aligned = x_grid.gather(1, (slots - offset).clamp(min=0)[..., None].expand_as(x_grid))  # (B, Lg, H_b)
        return BranchGrid(aligned, slots >= offset, offset, t, lattice, inputs, static)

    def from_grid(self, x, mask, grid: BranchGrid, y_aligned, mamba_state, return_state):
        """The branch Mamba's outputs over :meth:`grid`'s slots (B, Lg, H_b) and its state (or None: no grid point
        in any row) -> y (B, L, H_b) by Eq. 14b, and the branch's state if ``return_state``."""
        batch, length, _ = x.shape
        num_grid = y_aligned.shape[1]
        slots = torch.arange(num_grid, device=x.device)[None, :]  # (1, Lg)
        back = (slots + grid.offset).clamp(max=max(num_grid - 1, 0))  # (B, Lg): slot of grid point j at j − 1
        y_grid = y_aligned.gather(1, back[..., None].expand_as(y_aligned))
        expand = expand_floor if self.mode == "causal" else expand_nearest
        y = expand(y_grid, grid.times, grid.lattice)  # (B, L, H_b), Eq. 14b
        if not return_state:
            return y, None
        stream = resampling_prefill(grid.inputs.float(), grid.times, grid.lattice, self.window, mask)
        if mamba_state is None:  # no grid point in any row yet
            mamba_state = self.mamba.init_state(batch, device=x.device)
        held = y[:, -1].float() if length else x.new_zeros(batch, self.branch_size, dtype=torch.float32)
        return y, {**stream._asdict(), "held": held, **mamba_state}

    def _step(self, x_t, state, mask_t):
        """One token of the causal mode (:mod:`ssmhub.ops.resampling`): advance the clock, push the token; if it
        crosses t̄_j, compress the window and step the branch Mamba (on those rows only); emit the held ȳ_j (0
        before the first grid point). The step of a mixer's branches at once (:func:`step_branches`), R = 1."""
        stacked = {name: value.unsqueeze(1) for name, value in state.items()}  # (B, 1, ...)
        weights = stacked_weights(self, [self])
        y_t, new_state = step_branches(weights, x_t, stacked, mask_t)
        return project_outputs(weights, y_t)[0], {name: value[:, 0] for name, value in new_state.items()}

    def extra_repr(self) -> str:
        return f"resampling_rate={self.resampling_rate}, window={self.window}, mode={self.mode!r}"


class SerpentMixer(TokenMixer):
    """SeRpEnt token mixer (Eq. 15; :class:`~ssmhub.layers.mixer.TokenMixer`).

    Args:
        hidden_size: H; the branches' widths follow ``branch_layout`` (:meth:`SerpentOptions.branch_widths`).
        options: a :class:`SerpentOptions` (or a ``SerpentConfig``, which is one); ``**values`` override single
            fields. With ``resampling_rates=[]`` the mixer is a plain Mamba mixer.
    """

    # packed rows branch by branch: the base Mamba natively (the row's own cost), each resampling branch through
    # the protocol's batch of documents (its clocks, grids and windows restart with every document run alone)
    native_packing = True

    def __init__(self, hidden_size: int, options: SerpentOptions | None = None, **values):
        super().__init__()
        init_std = linear_init_std_of(options)  # a model config's init of linear maps, which θ_Δ and θ_Γ follow
        options = SerpentOptions.take(options, **values)
        options.check_options(hidden_size)
        self.hidden_size = hidden_size
        self.base_size, self.branch_size = options.branch_widths(hidden_size)
        self.resampling_mode, self.branch_layout = options.resampling_mode, options.branch_layout
        self.causal = options.resampling_mode == "causal"
        self.additive = options.branch_layout == "additive"
        self.base = MambaMixer(hidden_size, options, output_size=self.base_size)
        # additive: one Mamba of width H_b runs every branch's grid, all branches in one batch (a scan's cost on a
        # CPU is mostly its number of ops, whatever its width); concatenated: each branch its own (the paper's)
        shared = MambaMixer(self.branch_size, options) if self.additive and options.resampling_rates else None
        if shared is not None:
            self.branch_mamba = shared
        self.resampled = nn.ModuleList(
            ResamplingBranch(hidden_size, self.branch_size, kappa, options, mamba=shared, linear_init_std=init_std)
            for kappa in options.resampling_rates
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

    def _forward(self, x, mask, state, return_state, rows=None):
        """x (B, L, H) -> y (B, L, H): the branch outputs added (additive) or concatenated (Eq. 15b), without the
        skip, which is the block's residual; ``rows`` (:class:`~ssmhub.layers.packing.PackedRows`) or None: the document
        starts of packed rows, handed to every branch (they share its sizes and map)."""
        if self.additive and state is None and rows is None and len(self.resampled) > 1:
            results = [self.base(x, mask, return_state=return_state), *self._branches_batched(x, mask, return_state)]
        else:
            branches = [self.base, *self.resampled]
            results = [
                branch(x, mask, branch_state, return_state, document_starts=rows)
                for branch, branch_state in zip(branches, self._branch_states(state))
            ]
        y = self._combine([y for y, _ in results])  # (B, L, H)
        if not return_state:
            return y, None
        new_state = {f"base.{name}": value for name, value in results[0][1].items()}
        if len(results) > 1:
            for name in results[1][1]:
                new_state[f"resampled.{name}"] = torch.stack([s[name] for _, s in results[1:]], dim=1)  # (B, R, ...)
        return y, new_state

    def _branches_batched(self, x, mask, return_state):
        """Every resampling branch from the start of x (B, L, H), their shared Mamba run once over all their grids:
        each branch's right-aligned grid (:meth:`ResamplingBranch.grid`) left-padded to the longest, stacked along
        the batch, (R·B, Lg, H_b). Padding slots are masked, so each (branch, row) is the sequence of its own grid
        points, as :meth:`ResamplingBranch._parallel` runs it alone. Returns each branch's ``(y, state)``."""
        batch = x.shape[0]
        grids = [branch.grid(x, mask) for branch in self.resampled]
        num_grid = max(grid.aligned.shape[1] for grid in grids)
        y, mamba_state = None, None
        if num_grid:
            aligned = torch.cat([F.pad(g.aligned, (0, 0, num_grid - g.aligned.shape[1], 0)) for g in grids])
            grid_mask = torch.cat([F.pad(g.mask, (num_grid - g.mask.shape[1], 0)) for g in grids])  # (R·B, Lg)
            y, mamba_state = self.branch_mamba(aligned, mask=grid_mask, return_state=return_state)  # (R·B, Lg, H_b)
        results = []
        for i, (branch, grid) in enumerate(zip(self.resampled, grids)):
            rows = slice(i * batch, (i + 1) * batch)
            own = grid.aligned.shape[1]
            y_i = grid.aligned if y is None else y[rows, num_grid - own :]  # (B, Lg_i, H_b)
            state_i = None if mamba_state is None else {name: value[rows] for name, value in mamba_state.items()}
            y_i, state_i = branch.from_grid(x, mask, grid, y_i, state_i, return_state)
            results.append((branch.project_output(y_i), state_i))
        return results

    def _combine(self, outputs: list[torch.Tensor]) -> torch.Tensor:
        """The branches' outputs (B, ..., H each, additive; H_base and H_b, concatenated) -> the mixer's (B, ..., H)."""
        if len(outputs) == 1:
            return outputs[0]
        if self.additive:
            return torch.stack(outputs).sum(0)  # one sum, so the parallel and the step paths round alike
        return torch.cat(outputs, dim=-1)

    def _step(self, x_t, state, mask_t):
        """One token through every branch, O(1) in the context length: the base Mamba, then the resampling
        branches all at once on their stacked weights and states (:func:`step_branches`)."""
        y_t, base_state = self.base._step(x_t, self._part(state, "base"), mask_t)
        new_state = {f"base.{name}": value for name, value in base_state.items()}
        if not len(self.resampled):
            return y_t, new_state
        y_branches, branch_state = self._branches_step(x_t, state, mask_t)
        new_state.update(branch_state)
        return self._combine([y_t, *y_branches.unbind(0)]), new_state  # (B, H)

    def _branches_step(self, x_t, state, mask_t=None):
        """The resampling branches' part of :meth:`_step`, all at once on their stacked weights and states
        (:func:`step_branches`): x_t (B, H) and the ``resampled.`` fields of ``state`` -> (each branch's output,
        stacked (R, B, ·), and those fields stepped)."""
        weights = stacked_weights(self, self.resampled)  # under torch.compile: stacked anew in the graph each step
        y_branches, stacked = step_branches(weights, x_t, self._part(state, "resampled"), mask_t)
        outputs = torch.stack(project_outputs(weights, y_branches))  # (R, B, H) additive, (R, B, H_b) concatenated
        return outputs, {f"resampled.{name}": value for name, value in stacked.items()}

    @property
    def steps_rows_in_one_pass(self) -> bool:
        """Where the base Mamba steps its state in one pass (:meth:`step_rows_`), which holds all of a mixer without
        resampling branches and most of the state of one with them (E·N per row against the branches' clocks,
        windows and Mambas of width H_b)."""
        return self.base.steps_rows_in_one_pass

    @property
    def compiles_whole_step(self) -> bool:
        """With resampling branches, yes: only the base Mamba has a one-pass kernel, and each branch's clock, window,
        compression and Mamba is dozens of small ops per token, which Inductor fuses with the base's step (served
        step, 32 requests: ``benchmarks/results/serving_floor.md``); eagerly (``generate``) :meth:`step_rows_` keeps
        the base's kernel."""
        return bool(len(self.resampled)) or not self.steps_rows_in_one_pass

    def step_rows_(self, x_t, tables, rows, new, coefficients=None, step=None):
        """:meth:`~ssmhub.layers.mixer.TokenMixer.step_rows_`: the base Mamba's
        (:meth:`MambaMixer.step_rows_ <ssmhub.layers.mamba.MambaMixer.step_rows_>`) on its ``base.`` tables, then
        the resampling branches' step (:meth:`_branches_step`) gathered and written back by the protocol's path."""
        if step is not None or not self.steps_rows_in_one_pass:
            return super().step_rows_(x_t, tables, rows, new, coefficients, step)
        y_t = self.base.step_rows_(x_t, self._part(tables, "base"), rows, new)
        if not len(self.resampled):
            return y_t
        branch_tables = {name: table for name, table in tables.items() if name.startswith("resampled.")}
        y_branches = super().step_rows_(x_t, branch_tables, rows, new, step=_resampling_branches)  # (R, B, ·)
        return self._combine([y_t, *y_branches.unbind(0)])

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, base_size={self.base_size}, branch_size={self.branch_size}, "
            f"mode={self.resampling_mode!r}, layout={self.branch_layout!r}"
        )


def _resampling_branches(mixer: SerpentMixer, x_t, state, coefficients):
    """The step :meth:`SerpentMixer.step_rows_` hands the protocol for the branches' tables: their part of the step."""
    return mixer._branches_step(x_t, state)
