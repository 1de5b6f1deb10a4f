"""Configuration of block-diagonal input-dependent LRNN models (arXiv 2309.07412)."""

# no `from __future__ import annotations` here: @strict checks field types only on real annotations
from huggingface_hub.dataclasses import strict

from ..configuration_recurrent import RecurrentLMConfig, check_choice, check_positive

__all__ = ["BDLRNNConfig"]


@strict
class BDLRNNConfig(RecurrentLMConfig):
    """A stack of block-diagonal input-dependent LRNN layers (Eq. 5-6, §3.3) with an embedding.

    The regular-language reproduction (§4.4) uses ``hidden_size=64``, ``block_size=8``
    (h = 8 blocks), ``p_norm=1.2`` and 1 layer (3 for ModArith); those are set by the caller, the other
    fields keep :class:`~ssmhub.models.configuration_recurrent.RecurrentLMConfig`'s defaults.

    Args (besides those of :class:`~ssmhub.models.configuration_recurrent.RecurrentLMConfig`):
        block_size: b, the size of each diagonal block; ``hidden_size`` must be a multiple of it.
        p_norm: p of the column p-norm constraint of Eq. 6 (the paper: 1.2; 1 gives Eq. 7's guarantee).
        norm_mode: ``"code"`` (default: the authors' code, which centres each column and divides the
            block by its largest column p-norm) or ``"paper"`` (Eq. 6: each column ``v / max(1, ‖v‖_p)``).
        norm_eps: added to the ``"code"`` denominator (0, as in the code).
        transition_hidden_size: width of the transition MLP ``g`` (None: hidden_size·block_size, as in
            the code).
        input_map: ``"mlp"`` (default: the code's ReLU MLP for ``v_k``) or ``"linear"`` (the paper's ``B u_k``).
        learned_initial_state: a learned x_0 initialised ``randn`` (the code) or x_0 = 0.
        scan: ``"parallel"`` (§3.4 log-depth scan), ``"sequential"`` (loop over time; same numbers)
            or ``"auto"`` (default: parallel for CUDA tensors, the loop on CPU, faster there:
            benchmarks/results/block_scan.md).
    """

    model_type = "bdlrnn"

    block_size: int = 8
    p_norm: float = 1.2
    norm_mode: str = "code"
    norm_eps: float = 0.0
    transition_hidden_size: int | None = None
    input_map: str = "mlp"
    learned_initial_state: bool = True
    scan: str = "auto"

    def check_fields(self) -> None:
        super().check_fields()
        check_positive(self, "block_size", "transition_hidden_size")
        check_positive(self, "norm_eps", allow_zero=True)
        check_choice(self, "norm_mode", ("code", "paper"))
        check_choice(self, "input_map", ("mlp", "linear"))
        check_choice(self, "scan", ("auto", "parallel", "sequential"))
        if not self.p_norm >= 1:
            raise ValueError(f"BDLRNNConfig.p_norm must be >= 1 (a p-norm); got {self.p_norm}")
        if self.hidden_size % self.block_size:
            raise ValueError(
                f"BDLRNNConfig.hidden_size ({self.hidden_size}) must be divisible by "
                f"BDLRNNConfig.block_size ({self.block_size})"
            )
        if self.norm_mode == "code" and self.block_size == 1:
            raise ValueError(
                "BDLRNNConfig.block_size must be > 1 with norm_mode='code' (centring a 1×1 block gives 0/0); "
                "use norm_mode='paper' for b = 1"
            )
