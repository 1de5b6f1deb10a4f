"""Configuration fields every ssmhub language model shares (the block stack, the heads)."""

# no `from __future__ import annotations` here: @strict checks field types only on real annotations
from typing import ClassVar

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

from ..layers.options import MixerOptions, check_choice, check_integer, check_positive

__all__ = ["HIDDEN_ACTS", "INIT_SCHEMES", "NORM_TYPES", "POOLINGS", "RecurrentLMConfig"]

POOLINGS = ("max", "mean", "last")
INIT_SCHEMES = ("normal", "pytorch")
NORM_TYPES = ("layernorm", "rmsnorm")
HIDDEN_ACTS = ("gelu", "gelu_pytorch_tanh")  # transformers' names: the exact (erf) GELU and its tanh approximation


@strict
class RecurrentLMConfig(PreTrainedConfig):
    """Fields of the shared block stack; each family's config adds its mixer's fields.

    Args:
        vocab_size: size of the token vocabulary.
        hidden_size: model width H.
        num_hidden_layers: number of blocks.
        intermediate_size: width of an optional position-wise MLP after each mixer (0: none, the
            plain stack of mixers described in the DLR paper §2.3).
        hidden_act: the MLP's activation, as transformers names it: ``"gelu"`` (exact, the default) or
            ``"gelu_pytorch_tanh"`` (the tanh approximation, GPT-2's and the released H3 models' MLP).
        prenorm: ``x + f(LN(x))`` with a final LayerNorm (True) or post-norm ``LN(x + f(x))``.
        last_layer_residual: False makes the last block output its mixer's result without the residual
            stream (pre-norm only), as the regular-language LRNN code does (arXiv 2309.07412).
        norm_type: the blocks' and the final normalization: ``"layernorm"`` or ``"rmsnorm"`` (Mamba's).
        layer_norm_epsilon: epsilon of that normalization.
        initializer_range: std of the normal init of embeddings and linear maps.
        init_scheme: ``"normal"`` (transformers' convention: embeddings and linear weights
            N(0, initializer_range), zero biases) or ``"pytorch"`` (torch.nn's own defaults: Kaiming-uniform
            linear weights with U(±1/√fan_in) biases, N(0, 1) embeddings), which the regular-language
            LRNN code trains with (arXiv 2309.07412). Recurrence parameters keep their family's init.
        classifier_pooling: how sequence classification pools over positions: ``"max"`` (the DLR
            paper's max-pool), ``"mean"`` or ``"last"`` (the last real token); padding is ignored.
        classifier_intermediate_size: token classification head: 0 for a linear map, else the width
            of a ReLU MLP head (the regular-language LRNN code uses one of width H).
        recurrence_learning_rate: learning rate of the recurrence parameters in
            ``optimizer_param_groups`` (None: the model's). DLR's PG-19 run used 2e-4 vs 1e-3.
    """

    vocab_size: int = 50257
    hidden_size: int = 256
    num_hidden_layers: int = 4
    intermediate_size: int = 0
    hidden_act: str = "gelu"
    prenorm: bool = True
    last_layer_residual: bool = True
    norm_type: str = "layernorm"
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    init_scheme: str = "normal"
    classifier_pooling: str = "max"
    classifier_intermediate_size: int = 0
    recurrence_learning_rate: float | None = None
    use_cache: bool = True
    tie_word_embeddings: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    # Saved configs are versioned by the fields they hold: a field added after folders were saved without it maps
    # to the value every such folder was written with (a family sets this; a config built anew gets the default).
    values_before_field: ClassVar[dict[str, object]] = {}

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self.check_fields()

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """As ``PretrainedConfig.from_dict``; a saved config (it names its ``model_type``) that lacks a field of
        ``values_before_field`` gets the value it was written with."""
        if "model_type" in config_dict:
            missing = {name: value for name, value in cls.values_before_field.items() if name not in config_dict}
            config_dict = {**config_dict, **missing}
        return super().from_dict(config_dict, **kwargs)

    def check_fields(self) -> None:
        """Raise a ValueError naming the first field with a bad value (families extend this).

        Runs in ``__post_init__`` rather than as a ``@strict`` ``validate_*`` hook so that users get
        a plain ValueError; strict still checks each field's type on its own, also on assignment.
        A value assigned after construction is not checked then: every ssmhub model runs this again
        when it is built and in ``save_pretrained`` before writing anything
        (:class:`~ssmhub.models.modeling_recurrent.RecurrentPreTrainedModel`)."""
        check_integer(self, "vocab_size", "hidden_size", "num_hidden_layers")
        check_integer(self, "intermediate_size", "classifier_intermediate_size", minimum=0)
        check_positive(self, "layer_norm_epsilon")
        check_positive(self, "initializer_range", allow_zero=True)
        check_positive(self, "recurrence_learning_rate")
        check_choice(self, "classifier_pooling", POOLINGS)
        check_choice(self, "norm_type", NORM_TYPES)
        check_choice(self, "hidden_act", HIDDEN_ACTS)
        check_choice(self, "init_scheme", INIT_SCHEMES)
        if isinstance(self, MixerOptions):  # a family config inherits its mixer's options and their one validator
            self.check_options(self.hidden_size)
        if not self.last_layer_residual and not self.prenorm:
            raise ValueError(
                f"{type(self).__name__}.last_layer_residual=False needs prenorm=True (post-norm blocks always add it)"
            )
