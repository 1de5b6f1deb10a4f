"""The options of a SeRpEnt mixer (arXiv 2501.11729 §4-5), defined once: Mamba's and the resampling's;
``SerpentConfig`` inherits them.

No ``from __future__ import annotations`` here: a config built on these fields checks their types.
"""

from dataclasses import dataclass, field

from .mamba_options import MambaOptions
from .options import check_choice, check_integer

__all__ = ["RESAMPLING_MODES", "SerpentOptions"]

RESAMPLING_MODES = ("causal", "faithful")
PAPER_RESAMPLING_RATES = (0.5, 0.1)  # the language model's κ next to its base branch (App. B.2)


@dataclass
class SerpentOptions(MambaOptions):
    """Options of :class:`~ssmhub.layers.serpent.SerpentMixer`: those of
    :class:`~ssmhub.layers.mamba_options.MambaOptions` (every branch's Mamba) and the resampling's.

    Each mixer has ``1 + len(resampling_rates)`` branches of width H_b = H / #branches (Eq. 15b concatenates
    them); where #branches does not divide H, each resampling branch has ⌊H / #branches⌋ and the base branch the
    rest (ours: the paper's widths divide), so every width builds.

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
    """

    resampling_rates: list[float] = field(default_factory=lambda: list(PAPER_RESAMPLING_RATES))
    resampling_window: int = 10
    num_distance_features: int = 8
    resampling_mode: str = "causal"

    @property
    def num_branches(self) -> int:
        """1 (the base branch) + one per compression rate."""
        return 1 + len(self.resampling_rates)

    def branch_widths(self, hidden_size: int) -> tuple[int, int]:
        """(base, resampling) branch widths: ⌊H / #branches⌋ for each resampling branch, the rest for the base."""
        resampled = hidden_size // self.num_branches
        return hidden_size - resampled * len(self.resampling_rates), resampled

    def check_options(self, hidden_size: int | None = None) -> None:
        super().check_options(hidden_size)
        name = type(self).__name__
        check_integer(self, "resampling_window", "num_distance_features")
        check_choice(self, "resampling_mode", RESAMPLING_MODES)
        for kappa in self.resampling_rates:
            if isinstance(kappa, bool) or not isinstance(kappa, (int, float)) or not 0 < kappa <= 1:
                raise ValueError(f"{name}.resampling_rates must lie in (0, 1] (κ of Eq. 13); got {kappa!r}")
        if hidden_size is not None and hidden_size < self.num_branches:
            raise ValueError(
                f"{self.width_name()} ({hidden_size}) must be at least the number of branches "
                f"({self.num_branches} = 1 base + {len(self.resampling_rates)} {name}.resampling_rates)"
            )
