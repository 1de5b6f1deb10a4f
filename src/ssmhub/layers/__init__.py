"""Token mixers (nn.Modules built on ops), one file per mixer, all following one protocol.

``forward(x, mask=None, state=None, return_state=False) -> (y, new_state)`` on (B, L, D) inputs,
``step(x_t, state) -> (y_t, new_state)`` in O(1) time per token, ``init_state(batch_size, device, dtype)``.
"""

from .attention import CausalSelfAttention
from .bdlrnn import BDLRNNMixer
from .diagonal_ssm import DiagonalSSMKernel
from .dlr import DLRMixer
from .h3 import H3Mixer
from .longconv import LearnedButterflyConv, LongConvKernel
from .mamba import MambaMixer
from .serpent import ResamplingBranch, SerpentMixer

__all__ = [
    "BDLRNNMixer",
    "CausalSelfAttention",
    "DLRMixer",
    "DiagonalSSMKernel",
    "H3Mixer",
    "LearnedButterflyConv",
    "LongConvKernel",
    "MambaMixer",
    "ResamplingBranch",
    "SerpentMixer",
]
