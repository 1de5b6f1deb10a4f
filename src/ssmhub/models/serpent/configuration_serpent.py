"""Configuration of SeRpEnt models: Mamba with selective resampling branches (Rando et al., arXiv 2501.11729)."""

# no `from __future__ import annotations` here: @strict checks field types only on real annotations
from huggingface_hub.dataclasses import strict

from ...layers.serpent_options import SerpentOptions
from ..configuration_recurrent import RecurrentLMConfig

__all__ = ["SerpentConfig"]


@strict
class SerpentConfig(RecurrentLMConfig, SerpentOptions):
    """A stack of SeRpEnt blocks ``h ← h + SeRpEnt(RMSNorm(h))`` with a final RMSNorm (§5.2, App. B.2).

    Each block has a base branch, a Mamba mixer over the full sequence, and one branch per compression rate κ
    that resamples the sequence onto a uniform time grid (Eq. 11-13), runs its own Mamba on it (Eq. 15a) and
    expands the result back (Eq. 14b); the block's residual is the skip of Eq. 15b. ``branch_layout``
    ``"additive"`` (default): the base is a whole Mamba of width ``hidden_size`` and each branch, of width
    ``resampling_branch_size``, adds its output through a zero-initialised projection; ``"concatenated"`` (the
    paper's reading): ``1 + len(resampling_rates)`` branches of width ``hidden_size / #branches``, concatenated.
    A saved ``config.json`` without ``branch_layout`` (written before it existed) loads as ``"concatenated"``.
    With ``resampling_rates=[]`` the model is exactly Mamba (transformers' ``MambaForCausalLM`` weights load
    through :func:`~ssmhub.models.serpent.convert_mamba_checkpoint`; ``SerpentForCausalLM.from_mamba`` adds
    branches that start out contributing nothing).

    Fields: those of :class:`~ssmhub.models.configuration_recurrent.RecurrentLMConfig` (the block stack and
    heads; defaults here follow Mamba: RMSNorm, no MLP, ``hidden_size`` 384) and of
    :class:`~ssmhub.layers.serpent_options.SerpentOptions` (every branch's Mamba options, named as
    transformers' ``MambaConfig`` names them, and ``resampling_rates``, ``resampling_window``,
    ``num_distance_features``, ``resampling_mode``; documented and checked there, once). A ``"faithful"``
    ``resampling_mode`` reads later tokens, so it sets ``use_cache=False``.
    """

    model_type = "serpent"
    # a folder saved before ``branch_layout`` existed (issue 53) has the concatenated layout its weights fit
    values_before_field = {"branch_layout": "concatenated"}

    hidden_size: int = 384
    norm_type: str = "rmsnorm"

    def __post_init__(self, **kwargs):
        if self.resampling_mode == "faithful" and self.resampling_rates:
            self.use_cache = False  # the faithful resampling reads later tokens: no recurrent form to cache
        super().__post_init__(**kwargs)

    @property
    def branch_size(self) -> int:
        """Width of every resampling branch (:meth:`~ssmhub.layers.serpent_options.SerpentOptions.branch_widths`)."""
        return self.branch_widths(self.hidden_size)[1]
