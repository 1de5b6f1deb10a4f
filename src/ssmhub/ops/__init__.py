"""Pure tensor functions: the math of every family, each next to its slow reference."""

from .block_scan import block_scan, block_scan_ref, block_step
from .dlr import dlr_init, dlr_kernel, dlr_kernel_ref, dlr_scan, dlr_scan_ref, dlr_step, kronecker_dlr, lambda_powers
from .fftconv import fft_conv, fft_conv_ref, fft_size

__all__ = [
    "block_scan",
    "block_scan_ref",
    "block_step",
    "dlr_init",
    "dlr_kernel",
    "dlr_kernel_ref",
    "dlr_scan",
    "dlr_scan_ref",
    "dlr_step",
    "fft_conv",
    "fft_conv_ref",
    "fft_size",
    "kronecker_dlr",
    "lambda_powers",
]
