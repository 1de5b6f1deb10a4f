"""Configuration of DLR models (diagonal linear RNNs, arXiv 2212.00768)."""

# no `from __future__ import annotations` here: @strict checks field types only on real annotations
from huggingface_hub.dataclasses import strict

from ..configuration_recurrent import RecurrentLMConfig, check_choice, check_positive

__all__ = ["DLRConfig"]


@strict
class DLRConfig(RecurrentLMConfig):
    """A stack of DLR layers (seed paper §2.3) with an embedding, for language modelling and classification.

    Args (besides those of :class:`~ssmhub.models.configuration_recurrent.RecurrentLMConfig`):
        state_size: N, complex states per layer (Λ ∈ C^N is shared by the H channels, W ∈ C^{H×N}).
        kernel_type: ``"real"`` (K = Re(W P)) or ``"prod"`` (DLR-prod, K = Re(W P)·Im(W P), §2.3;
            it decodes with N² states per channel).
        bidirectional: use Eq. 6's bidirectional convolution (classification only; cannot decode).
        bidirectional_shared_lambda: one Λ for both directions as in Figure 4 (default), or one per
            direction as in Eq. 5 (the paper is inconsistent; Figure 4 is what its code does).
        skip_connection: ``"identity"`` is the paper's residual ``y + u``; ``"learned"`` is the
            S4/DSS codebase's ``y + D⊙u`` (D initialised to 1).
        use_glu: output map H→2H plus GLU (the paper's Tables 3-4 models) instead of H→H.
        dropout: per-element dropout after the layer's GELU.
        dt_min, dt_max: range of e^r in the init ``logΛ_re = (e^r/2)^{1/2}``, r ~ U(log dt_min,
            log dt_max); §2.3 uses (0.0005, 0.5). The paper's tables call these dt-min/dt-max.
        weight_std: std of Re W and Im W at init (None: 1/N, §2.3).
    """

    model_type = "dlr"

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

    def check_fields(self) -> None:
        super().check_fields()
        check_positive(self, "state_size", "dt_min", "dt_max", "weight_std")
        check_positive(self, "dropout", allow_zero=True)
        check_choice(self, "kernel_type", ("real", "prod"))
        check_choice(self, "skip_connection", ("identity", "learned"))
        if self.dt_min > self.dt_max:
            raise ValueError(f"DLRConfig.dt_min ({self.dt_min}) must not exceed dt_max ({self.dt_max})")
        if not self.dropout < 1:
            raise ValueError(f"DLRConfig.dropout must be in [0, 1); got {self.dropout}")
