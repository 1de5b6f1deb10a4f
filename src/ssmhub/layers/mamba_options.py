"""The options of a Mamba mixer (arXiv 2312.00752 §3.4), defined once, named as transformers' ``MambaConfig``
names them: ``SerpentOptions`` extends them, ``SerpentConfig`` inherits them, and a ``MambaConfig`` maps onto
them field by field (:mod:`ssmhub.models.serpent.mamba_mapping`).

No ``from __future__ import annotations`` here: a config built on these fields checks their types.
"""

from dataclasses import dataclass

from .options import MixerOptions, check_choice, check_integer, check_positive

__all__ = ["SCANS", "TIME_STEP_INIT_SCHEMES", "MambaOptions"]

TIME_STEP_INIT_SCHEMES = ("random", "constant")
SCANS = ("auto", "chunked", "sequential", "triton")


@dataclass
class MambaOptions(MixerOptions):
    """Options of :class:`~ssmhub.layers.mamba.MambaMixer` (the reference values of ``mamba_simple.py``).

    Args:
        state_size: N per channel (16).
        expand: inner width E = expand × the mixer's output width (2).
        conv_kernel: width of the causal depthwise convolution (4).
        time_step_rank: R of Δ's low-rank projection (None: ⌈input width / 16⌉, the reference's "auto").
        use_bias: biases of the in/out projections (False). use_conv_bias: bias of the convolution (True).
        time_step_min, time_step_max: Δ's init is log-uniform in [time_step_min, time_step_max] (0.001, 0.1),
        time_step_floor: floored there (1e-4);
        time_step_scale, time_step_init_scheme: ``W_dt`` is uniform in ±R^(−1/2)·time_step_scale (``"random"``)
            or that constant (``"constant"``).
        scan: ``"auto"`` (default: ``"triton"`` on CUDA tensors where the Triton kernels can run and the
            inputs are not float64, else ``"chunked"``; on CPU always ``"chunked"``), ``"chunked"`` (the chunked
            selective scan in torch, :mod:`ssmhub.ops.selective_scan`), ``"triton"`` (the fused Triton kernels,
            :mod:`ssmhub.ops.triton.selective_scan`, float32; CUDA, or CPU under ``TRITON_INTERPRET=1``; an
            error where they cannot run) or ``"sequential"`` (the loop-over-time oracle; slower). All four
            compute the same function, up to rounding order.
    """

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
    scan: str = "auto"

    def check_options(self, hidden_size: int | None = None) -> None:
        super().check_options(hidden_size)
        name = type(self).__name__
        check_integer(self, "state_size", "expand", "conv_kernel", "time_step_rank")
        check_positive(self, "time_step_min", "time_step_max", "time_step_floor", "time_step_scale")
        check_choice(self, "time_step_init_scheme", TIME_STEP_INIT_SCHEMES)
        check_choice(self, "scan", SCANS)
        if not self.time_step_min <= self.time_step_max:
            raise ValueError(
                f"{name}.time_step_min ({self.time_step_min}) must not exceed time_step_max ({self.time_step_max})"
            )
