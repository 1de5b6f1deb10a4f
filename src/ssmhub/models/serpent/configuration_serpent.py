"""Configuration of SeRpEnt models: Mamba with selective resampling branches (Rando et al., arXiv 2501.11729)."""

# no `from __future__ import annotations` here: @strict checks field types only on real annotations
from huggingface_hub.dataclasses import strict

from ...layers.mamba import SCANS, TIME_STEP_INIT_SCHEMES
from ...layers.serpent import RESAMPLING_MODES
from ..configuration_recurrent import RecurrentLMConfig, check_choice, check_positive

__all__ = ["SerpentConfig"]


@strict
class SerpentConfig(RecurrentLMConfig):
    """A stack of SeRpEnt blocks ``h ← h + SeRpEnt(RMSNorm(h))`` with a final RMSNorm (§5.2, App. B.2).

    Each block has ``1 + len(resampling_rates)`` branches of width ``hidden_size / #branches``: a base
    branch, a Mamba mixer over the full sequence, and one branch per compression rate κ that resamples
    the sequence onto a uniform time grid (Eq. 11-13), runs its own Mamba on it (Eq. 15a) and expands
    the result back (Eq. 14b). The branch outputs are concatenated; the block's residual is the skip of
    Eq. 15b. With ``resampling_rates=[]`` the model is exactly Mamba (transformers' ``MambaForCausalLM``
    weights load through :func:`~ssmhub.models.serpent.convert_mamba_checkpoint`).

    Args (besides those of :class:`~ssmhub.models.configuration_recurrent.RecurrentLMConfig`, whose
    defaults here follow Mamba: RMSNorm, no MLP):
        state_size: N of every Mamba (16).
        expand: inner width of a branch's Mamba = expand × branch width (2).
        conv_kernel: width of Mamba's causal depthwise convolution (4).
        time_step_rank: R of Δ's low-rank projection (None: ⌈mixer input width / 16⌉, the reference's "auto").
        use_bias, use_conv_bias: biases of Mamba's in/out projections (False) and of its conv (True).
        time_step_min, time_step_max, time_step_floor, time_step_scale, time_step_init_scheme:
            initialization of Mamba's Δ (the reference's values).
        scan: ``"chunked"`` (the chunked parallel selective scan) or ``"sequential"`` (its loop oracle).
        resampling_rates: κ ∈ (0, 1] of each resampling branch, the minimum compression rate L̄/L
            (Eq. 13). The paper's language model: ``[0.5, 0.1]`` next to the base branch.
        resampling_window: K, the number of input tokens compressed into each grid point (Eq. 12).
            Every token lands in some window when K ≥ 1/κ, since a grid interval holds up to 1/κ tokens;
            the default 10 covers κ = 0.1. The paper does not report K for language modelling.
        num_distance_features: G Gaussian distance features per window token (Eq. 12; 8 in App. B.2).
        resampling_mode: ``"causal"`` (default: windows of the last K tokens up to the first token past
            each grid point, floor expansion; ours, since the paper never discusses causality; streams in
            O(1) per token) or ``"faithful"`` (the paper's symmetric K-nearest windows and nearest-grid-point
            expansion; non-causal, so for classification only; it sets ``use_cache=False``).
    """

    model_type = "serpent"

    hidden_size: int = 384
    norm_type: str = "rmsnorm"
    state_size: int = 16
    expand: int = 2
    conv_kernel: int = 4
    time_step_rank: int | None = None
    use_bias: bool = False
    use_conv_bias: bool = True
    time_step_min: float = 0.001
    time_step_max: float = 0.1
    time_step_floor: float = 1e-4
    time_step_scale: float = 1.0
    time_step_init_scheme: str = "random"
    scan: str = "chunked"
    resampling_rates: list[float] | None = None
    resampling_window: int = 10
    num_distance_features: int = 8
    resampling_mode: str = "causal"

    def __post_init__(self, **kwargs):
        if self.resampling_rates is None:
            self.resampling_rates = [0.5, 0.1]
        if self.resampling_mode == "faithful" and self.resampling_rates:
            self.use_cache = False  # the faithful resampling reads later tokens: no recurrent form to cache
        super().__post_init__(**kwargs)

    @property
    def num_branches(self) -> int:
        """1 (the base branch) + one per compression rate."""
        return 1 + len(self.resampling_rates)

    @property
    def branch_size(self) -> int:
        """Output width of every branch: hidden_size / num_branches."""
        return self.hidden_size // self.num_branches

    def check_fields(self) -> None:
        super().check_fields()
        name = type(self).__name__
        check_positive(
            self, "state_size", "expand", "conv_kernel", "time_step_rank", "resampling_window", "num_distance_features"
        )
        check_choice(self, "time_step_init_scheme", TIME_STEP_INIT_SCHEMES)
        check_choice(self, "scan", SCANS)
        check_choice(self, "resampling_mode", RESAMPLING_MODES)
        if not 0 < self.time_step_min <= self.time_step_max:
            raise ValueError(
                f"{name} needs 0 < time_step_min <= time_step_max; got {self.time_step_min} and {self.time_step_max}"
            )
        for kappa in self.resampling_rates:
            if not 0 < kappa <= 1:
                raise ValueError(f"{name}.resampling_rates must lie in (0, 1] (κ of Eq. 13); got {kappa}")
        if self.hidden_size % self.num_branches:
            raise ValueError(
                f"{name}.hidden_size ({self.hidden_size}) must be divisible by the number of branches "
                f"({self.num_branches} = 1 base + {len(self.resampling_rates)} resampling_rates)"
            )
