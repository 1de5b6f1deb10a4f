"""The options of a SeRpEnt mixer (arXiv 2501.11729 §4-5), defined once: Mamba's and the resampling's;
``SerpentConfig`` inherits them.

No ``from __future__ import annotations`` here: a config built on these fields checks their types.
"""

from dataclasses import dataclass, field

from .mamba_options import MambaOptions
from .options import check_choice, check_integer, check_positive

__all__ = ["BRANCH_LAYOUTS", "RESAMPLING_MODES", "SerpentOptions"]

RESAMPLING_MODES = ("causal", "faithful")
BRANCH_LAYOUTS = ("additive", "concatenated")
DEFAULT_BRANCH_FRACTION = 8  # additive layout: a resampling branch is hidden_size // 8 wide by default
PAPER_RESAMPLING_RATES = (0.5, 0.1)  # the language model's κ next to its base branch (App. B.2)


@dataclass
class SerpentOptions(MambaOptions):
    """Options of :class:`~ssmhub.layers.serpent.SerpentMixer`: those of
    :class:`~ssmhub.layers.mamba_options.MambaOptions` (every branch's Mamba) and the resampling's.

    Each mixer has a base branch (a Mamba over the whole sequence) and one resampling branch per κ, laid out as
    ``branch_layout`` says.

    Args:
        resampling_rates: κ ∈ (0, 1] of each resampling branch, the minimum compression rate L̄/L (Eq. 13).
            The paper's language model: ``[0.5, 0.1]`` next to the base branch; ``[]`` is exactly Mamba.
        resampling_window: K, the number of input tokens compressed into each grid point (Eq. 12). Every token
            lands in some window when K ≥ 1/κ, since a grid interval holds up to 1/κ tokens; the default 10
            covers κ = 0.1. The paper does not report K for language modelling.
        num_distance_features: G Gaussian distance features per window token (Eq. 12; 8 in App. B.2).
        resampling_mode: ``"causal"`` (default: windows of the last K tokens up to the first token past each
            grid point, floor expansion; ours, since the paper never discusses causality; streams in O(1) per
            token) or ``"faithful"`` (the paper's symmetric K-nearest windows and nearest-grid-point expansion;
            non-causal, so for classification only).
        branch_layout: how the branches share the width H. ``"additive"`` (default; ours): the base branch is a
            whole Mamba of width H, exactly Mamba's block; each resampling branch projects x to a small width H_b
            (``resampling_branch_size``), compresses each window with per-slot depthwise weights (a weight per
            window slot and channel, plus a map of the distance features) in place of Eq. 12's dense θ_Γ, runs a
            Mamba of width H_b and adds its output through a zero-initialised projection H_b → H, so the branches
            cost a small share of the parameters and start out contributing nothing (a Mamba checkpoint loads with
            its logits unchanged: ``SerpentForCausalLM.from_mamba``). ``"concatenated"``: the paper's reading
            (arXiv 2501.11729 Eq. 12 and 15b): 1 + #κ branches of width H / #branches, concatenated, each window
            mapped by a dense θ_Γ over ``⊕_k [x_k, ε_k]``; where #branches does not divide H, each resampling branch
            has ⌊H / #branches⌋ and the base branch the rest. A saved config without this field is one written
            before it existed, and loads as ``"concatenated"``.
        resampling_branch_size: H_b of each resampling branch in the additive layout (None: ⌊H / 8⌋, at least 1);
            the concatenated layout's widths follow from H.
        branch_output_init_std: the standard deviation of the additive layout's output projections at
            initialization (default 0: a new branch adds nothing until trained, and a converted Mamba keeps its
            logits; > 0 makes the branches contribute from the first step, as the concatenated layout's do).
    """

    resampling_rates: list[float] = field(default_factory=lambda: list(PAPER_RESAMPLING_RATES))
    resampling_window: int = 10
    num_distance_features: int = 8
    resampling_mode: str = "causal"
    branch_layout: str = "additive"
    resampling_branch_size: int | None = None
    branch_output_init_std: float = 0.0

    @property
    def num_branches(self) -> int:
        """1 (the base branch) + one per compression rate."""
        return 1 + len(self.resampling_rates)

    def branch_widths(self, hidden_size: int) -> tuple[int, int]:
        """(base, resampling) branch widths. Additive: (H, H_b). Concatenated: ⌊H / #branches⌋ for each resampling
        branch, the rest for the base."""
        if self.branch_layout == "additive":
            resampled = self.resampling_branch_size or max(1, hidden_size // DEFAULT_BRANCH_FRACTION)
            return hidden_size, resampled
        resampled = hidden_size // self.num_branches
        return hidden_size - resampled * len(self.resampling_rates), resampled

    def check_options(self, hidden_size: int | None = None) -> None:
        super().check_options(hidden_size)
        name = type(self).__name__
        check_integer(self, "resampling_window", "num_distance_features", "resampling_branch_size")
        check_choice(self, "resampling_mode", RESAMPLING_MODES)
        check_choice(self, "branch_layout", BRANCH_LAYOUTS)
        check_positive(self, "branch_output_init_std", allow_zero=True)
        for kappa in self.resampling_rates:
            if isinstance(kappa, bool) or not isinstance(kappa, (int, float)) or not 0 < kappa <= 1:
                raise ValueError(f"{name}.resampling_rates must lie in (0, 1] (κ of Eq. 13); got {kappa!r}")
        concatenated = self.branch_layout == "concatenated"
        if concatenated and hidden_size is not None and hidden_size < self.num_branches:
            raise ValueError(
                f"{self.width_name()} ({hidden_size}) must be at least the number of branches "
                f"({self.num_branches} = 1 base + {len(self.resampling_rates)} {name}.resampling_rates)"
            )
