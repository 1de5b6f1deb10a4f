"""The options of a DLR layer (arXiv 2212.00768 §2.3), defined once: ``DLRConfig`` inherits them.

No ``from __future__ import annotations`` here: a config built on these fields checks their types.
"""

from dataclasses import dataclass

from .options import MixerOptions, check_choice, check_integer, check_positive

__all__ = ["KERNEL_TYPES", "SKIP_CONNECTIONS", "DLROptions"]

KERNEL_TYPES = ("real", "prod")
SKIP_CONNECTIONS = ("identity", "learned")


@dataclass
class DLROptions(MixerOptions):
    """Options of :class:`~ssmhub.layers.dlr.DLRMixer` (and fields of ``DLRConfig``).

    Args:
        state_size: N, complex states per layer (Λ ∈ C^N is shared by the H channels, W ∈ C^{H×N}).
        kernel_type: ``"real"`` (K = Re(W P)) or ``"prod"`` (DLR-prod, K = Re(W P)·Im(W P), §2.3; it decodes
            with N² states per channel).
        bidirectional: Eq. 5/6's bidirectional convolution instead of the causal Eq. 4 (classification only;
            cannot decode).
        bidirectional_shared_lambda: one Λ for both directions as in Figure 4 (default), or one per direction
            as in Eq. 5 (the paper is inconsistent; Figure 4 is what its code does).
        skip_connection: ``"identity"`` is the paper's residual ``y + u``; ``"learned"`` is the S4/DSS
            codebase's ``y + D⊙u`` (D initialised to 1).
        use_glu: output map H→2H plus GLU (the paper's Tables 3-4 models) instead of H→H.
        dropout: per-element dropout after the layer's GELU, in [0, 1).
        dt_min, dt_max: range of e^r in the init ``logΛ_re = (e^r/2)^{1/2}``, r ~ U(log dt_min, log dt_max);
            §2.3 uses (0.0005, 0.5). The paper's tables call these dt-min/dt-max.
        weight_std: std of Re W and Im W at init (None: 1/N, §2.3).
    """

    state_size: int = 256
    kernel_type: str = "real"
    bidirectional: bool = False
    bidirectional_shared_lambda: bool = True
    skip_connection: str = "identity"
    use_glu: bool = False
    dropout: float = 0.0
    dt_min: float = 5e-4
    dt_max: float = 0.5
    weight_std: float | None = None

    def check_options(self, hidden_size: int | None = None) -> None:
        super().check_options(hidden_size)
        name = type(self).__name__
        check_integer(self, "state_size")
        check_positive(self, "dt_min", "dt_max", "weight_std")
        check_positive(self, "dropout", allow_zero=True)
        check_choice(self, "kernel_type", KERNEL_TYPES)
        check_choice(self, "skip_connection", SKIP_CONNECTIONS)
        if self.dt_min > self.dt_max:
            raise ValueError(f"{name}.dt_min ({self.dt_min}) must not exceed dt_max ({self.dt_max})")
        if not self.dropout < 1:
            raise ValueError(f"{name}.dropout must be in [0, 1); got {self.dropout}")
