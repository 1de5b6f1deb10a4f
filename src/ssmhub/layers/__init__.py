"""Token mixers (nn.Modules built on ops), one file per mixer, all following one protocol.

``forward(x, mask=None, state=None, return_state=False) -> (y, new_state)`` on (B, L, D) inputs,
``step(x_t, state) -> (y_t, new_state)`` in O(1) time per token, ``init_state(batch_size, device, dtype)``.

Each mixer is built as ``Mixer(hidden_size, options=None, **values)``: its options are one dataclass
(``DLROptions``, ``H3Options``, ...: :mod:`ssmhub.layers.options`) that the family's config inherits, so an
option has one name, one docstring and one validator from the config down to the op.
"""

from .attention import CausalSelfAttention
from .attention_options import AttentionOptions
from .bdlrnn import BDLRNNMixer
from .bdlrnn_options import BDLRNNOptions
from .diagonal_ssm import DiagonalSSMKernel
from .dlr import DLRMixer
from .dlr_options import DLROptions
from .h3 import H3Mixer
from .h3_options import H3Options
from .longconv import LearnedButterflyConv, LongConvKernel
from .longconv_options import LongConvOptions
from .mamba import MambaMixer
from .mamba_options import MambaOptions
from .options import MixerOptions
from .serpent import ResamplingBranch, SerpentMixer
from .serpent_options import SerpentOptions

__all__ = [
    "AttentionOptions",
    "BDLRNNMixer",
    "BDLRNNOptions",
    "CausalSelfAttention",
    "DLRMixer",
    "DLROptions",
    "DiagonalSSMKernel",
    "H3Mixer",
    "H3Options",
    "LearnedButterflyConv",
    "LongConvKernel",
    "LongConvOptions",
    "MambaMixer",
    "MambaOptions",
    "MixerOptions",
    "ResamplingBranch",
    "SerpentMixer",
    "SerpentOptions",
]
