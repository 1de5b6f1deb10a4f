"""Each mixer option is written once: one field (name, type, default) in the layer tier's options dataclass,
inherited by the family's config, one validator that names the field for both, and Mamba's options named as
transformers' ``MambaConfig`` names them."""

import inspect
from dataclasses import MISSING, fields

import pytest
from transformers import MambaConfig

from ssmhub import DLRConfig, H3Config
from ssmhub.layers.attention_options import AttentionOptions
from ssmhub.layers.h3_options import H3Options
from ssmhub.layers.mamba_options import MambaOptions
from ssmhub.layers.options import MixerOptions
from ssmhub.models import FAMILIES

# every registered family's config and the mixer options it inherits (its bases in the layers tier)
OPTIONS_OF = {
    config: tuple(base for base in config.__bases__ if issubclass(base, MixerOptions))
    for config in (classes["AutoConfig"] for classes in FAMILIES.values())
}
TINY = {"vocab_size": 16, "hidden_size": 24, "num_hidden_layers": 2}


def _bad_value(options_class, name):
    """A value of the field's own type that its validator must refuse (None for a field with none: a flag)."""
    default = next(f for f in fields(options_class) if f.name == name)
    value = default.default if default.default is not MISSING else default.default_factory()
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        return "no-such-choice"
    if isinstance(value, list):
        return ["no-such-step"] if value and isinstance(value[0], str) else [2.0]
    return -1 if isinstance(value, int) or name.endswith(("_rank", "_heads", "_modes", "_size", "_window")) else -1.0


# values past an upper bound or a relation, which the sign-flipped values above do not reach
BEYOND_A_BOUND = {
    "dropout": 1.0,
    "kernel_dropout": 1.0,
    "attention_dropout": 1.0,
    "p_norm": 0.5,
    "dt_min": 1.0,
    "time_step_min": 0.5,
    "kernel_init": "conv",  # a LongConvKernel init, not the H3 long kernel's
    "kernel_regularization_order": ["squash", "squash"],
    "resampling_rates": [0.0],
}


def _cases():
    for config_class, option_classes in OPTIONS_OF.items():
        for options_class in option_classes:
            for f in fields(options_class):
                for kind, bad in (("sign", _bad_value(options_class, f.name)), ("bound", BEYOND_A_BOUND.get(f.name))):
                    if bad is not None:
                        case = f"{config_class.__name__}-{f.name}-{kind}"
                        yield pytest.param(config_class, options_class, f.name, bad, id=case)


def test_the_registry_holds_every_family_with_its_options():
    assert len(OPTIONS_OF) >= 4 and all(OPTIONS_OF.values()), OPTIONS_OF  # a family without options inherits none
    assert OPTIONS_OF[H3Config] == (H3Options, AttentionOptions)


@pytest.mark.parametrize("config_class", list(OPTIONS_OF))
def test_config_inherits_its_mixer_options_and_redeclares_none(config_class):
    own = set(inspect.get_annotations(config_class))
    option_fields = {f.name for options_class in OPTIONS_OF[config_class] for f in fields(options_class)}
    assert not own & option_fields, f"{config_class.__name__} redeclares {sorted(own & option_fields)}"


@pytest.mark.parametrize(("config_class", "options_class", "name", "bad"), list(_cases()))
def test_one_validator_names_the_field_for_config_and_layer(config_class, options_class, name, bad):
    with pytest.raises(ValueError, match=rf"{options_class.__name__}\.{name}") as from_layer:
        options_class(**{name: bad}).check_options(TINY["hidden_size"])
    with pytest.raises(ValueError, match=rf"{config_class.__name__}\.{name}") as from_config:
        config_class(**TINY, **{name: bad})
    owner_free = str(from_config.value).replace(config_class.__name__, options_class.__name__)
    assert owner_free == str(from_layer.value)


def test_mamba_options_are_named_and_defaulted_as_transformers_mamba_config():
    reference = MambaConfig()
    for f in fields(MambaOptions):
        if f.name == "scan":  # ours: the chunked scan or its loop oracle
            continue
        assert hasattr(reference, f.name), f"MambaConfig has no {f.name}"
        if f.name != "time_step_rank":  # MambaConfig resolves its "auto" to an int
            assert getattr(reference, f.name) == f.default, f.name


def test_layers_take_single_options_by_name_and_refuse_unknown_ones():
    from ssmhub.layers import DLRMixer

    assert DLRMixer(8, state_size=3).state_size == 3
    assert DLRMixer(8, DLRConfig(**TINY, state_size=5)).state_size == 5
    assert DLRMixer(8, DLRConfig(**TINY, state_size=5), state_size=2).state_size == 2
    with pytest.raises(TypeError, match="state_sise"):
        DLRMixer(8, state_sise=4)
    with pytest.raises(TypeError, match="options must be a DLROptions"):
        DLRMixer(8, 4)
