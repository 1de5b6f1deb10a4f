"""The options of a block-diagonal input-dependent LRNN layer (arXiv 2309.07412 §3.3-3.4), defined once:
``BDLRNNConfig`` inherits them.

No ``from __future__ import annotations`` here: a config built on these fields checks their types.
"""

from dataclasses import dataclass

from .options import MixerOptions, check_choice, check_integer, check_positive

__all__ = ["INPUT_MAPS", "NORM_MODES", "SCANS", "BDLRNNOptions"]

NORM_MODES = ("code", "paper")
INPUT_MAPS = ("mlp", "linear")
SCANS = ("auto", "parallel", "sequential", "triton")


@dataclass
class BDLRNNOptions(MixerOptions):
    """Options of :class:`~ssmhub.layers.bdlrnn.BDLRNNMixer` (and fields of ``BDLRNNConfig``).

    Args:
        block_size: b, the size of each of the h = d / b diagonal blocks; the width d must be a multiple
            of it (the paper: 8).
        p_norm: p of the column p-norm constraint of Eq. 6, >= 1 (the paper: 1.2; p = 1 gives Eq. 7's
            stability guarantee).
        norm_mode: ``"code"`` (default: the authors' code, which centres each column and divides the block by
            its largest column p-norm; needs b > 1) or ``"paper"`` (Eq. 6: each column ``v / max(1, ‖v‖_p)``).
        norm_eps: added to the ``"code"`` denominator (0, as in the code).
        transition_hidden_size: width of the transition MLP ``g`` (None: d·b, as in the code).
        input_map: ``"mlp"`` (default: the code's ReLU MLP d→d→d for ``v_k``) or ``"linear"`` (the paper's
            ``B u_k``).
        learned_initial_state: a learned x_0 initialised ``randn`` (the code) or x_0 = 0.
        scan: ``"parallel"`` (§3.4 log-depth scan), ``"sequential"`` (loop over time; same numbers),
            ``"triton"`` (the sequential-in-time Triton kernel, :mod:`ssmhub.ops.triton.block_scan`, computed
            in float32; CUDA, or CPU under ``TRITON_INTERPRET=1``; an error if it cannot run) or ``"auto"``
            (default: on CUDA the Triton kernel where it can run and A is not float64, else the parallel scan;
            on CPU the loop, faster there: benchmarks/results/block_scan.md).
    """

    block_size: int = 8
    p_norm: float = 1.2
    norm_mode: str = "code"
    norm_eps: float = 0.0
    transition_hidden_size: int | None = None
    input_map: str = "mlp"
    learned_initial_state: bool = True
    scan: str = "auto"

    def check_options(self, hidden_size: int | None = None) -> None:
        super().check_options(hidden_size)
        name = type(self).__name__
        check_integer(self, "block_size", "transition_hidden_size")
        check_positive(self, "p_norm")
        check_positive(self, "norm_eps", allow_zero=True)
        check_choice(self, "norm_mode", NORM_MODES)
        check_choice(self, "input_map", INPUT_MAPS)
        check_choice(self, "scan", SCANS)
        if not self.p_norm >= 1:
            raise ValueError(f"{name}.p_norm must be >= 1 (a p-norm); got {self.p_norm}")
        if hidden_size is not None and hidden_size % self.block_size:
            raise ValueError(
                f"{self.width_name()} ({hidden_size}) must be divisible by {name}.block_size ({self.block_size})"
            )
        if self.norm_mode == "code" and self.block_size == 1:  # centring a 1×1 block makes it 0: 0/0
            raise ValueError(
                f"{name}.block_size must be > 1 with norm_mode='code' (centring a 1×1 block gives 0/0); "
                "use norm_mode='paper' for b = 1"
            )
