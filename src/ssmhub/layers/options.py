"""Mixer options, written once from a model's config down to the op.

Each mixer's options are one dataclass in its layer file (``DLROptions``, ``H3Options``, ...): one field per
option, its one docstring, and one validator, :meth:`MixerOptions.check_options`. The family's config
*inherits* that dataclass (``class H3Config(RecurrentLMConfig, H3Options)``), so a config field and the
mixer argument are the same field (one name, one default) and the config validates itself with the same
method the mixer calls. Errors name the owner: ``H3Config.smooth_width must be ...`` from a config,
``H3Options.smooth_width must be ...`` from a layer built by hand.

A mixer takes ``(hidden_size, options=None, **values)``: ``options`` may be an options object or a config
(anything holding the fields by name; only the mixer's own fields are read, and copied), ``values``
override single fields, so ``ssmhub.layers`` stays usable without a config::

    H3Mixer(64, max_kernel_length=128, ssm_num_heads=8)   # by hand
    H3Mixer(config.hidden_size, config)                   # from a model's config

This module imports no transformers (the layers tier never does), and the options classes are plain
dataclasses without ``from __future__ import annotations``: a config built on them checks field types.
"""

import math
from dataclasses import dataclass, fields
from typing import TypeVar

__all__ = ["MixerOptions", "check_choice", "check_integer", "check_positive"]

Options = TypeVar("Options", bound="MixerOptions")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _copied(value):
    """Lists are copied so that a layer never shares one with the config it was built from."""
    return list(value) if isinstance(value, list) else value


def check_positive(owner, *names: str, allow_zero: bool = False) -> None:
    """Raise a ValueError naming the first field of ``names`` that is not a positive finite number
    (non-negative with ``allow_zero``); None passes (an unset optional field)."""
    for name in names:
        value = getattr(owner, name)
        if value is None:
            continue
        if not _is_number(value) or value < 0 or (value == 0 and not allow_zero):
            bound = "a non-negative" if allow_zero else "a positive"
            raise ValueError(f"{type(owner).__name__}.{name} must be {bound} number; got {value!r}")


def check_integer(owner, *names: str, minimum: int = 1) -> None:
    """Raise a ValueError naming the first field of ``names`` that is not an integer >= ``minimum``;
    None passes (an unset optional field)."""
    for name in names:
        value = getattr(owner, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{type(owner).__name__}.{name} must be an integer >= {minimum}; got {value!r}")


def check_choice(owner, name: str, choices: tuple) -> None:
    """Raise a ValueError naming ``name`` when its value is not one of ``choices``."""
    value = getattr(owner, name)
    if value not in choices:
        raise ValueError(f"{type(owner).__name__}.{name} must be one of {choices}; got {value!r}")


@dataclass
class MixerOptions:
    """Base of every mixer's options dataclass (see the module docstring)."""

    @classmethod
    def take(cls: type[Options], source=None, **values) -> Options:
        """A fresh ``cls`` with the fields of ``source`` (an options object or a config holding them by name;
        None: the defaults), then ``values`` (a TypeError names an unknown one). Not yet checked: the mixer
        calls :meth:`check_options` with its width."""
        missing = [f.name for f in fields(cls) if source is not None and not hasattr(source, f.name)]
        if missing:
            raise TypeError(
                f"options must be a {cls.__name__} or a config holding its fields (missing {missing[0]!r}); "
                f"got {type(source).__name__}: pass single options by name, e.g. {missing[0]}=..."
            )
        taken = {} if source is None else {f.name: _copied(getattr(source, f.name)) for f in fields(cls)}
        return cls(**{**taken, **values})

    def width_name(self) -> str:
        """How errors name the mixer's width: the config's field, or the mixer's argument."""
        return f"{type(self).__name__}.hidden_size" if hasattr(self, "hidden_size") else "the mixer's hidden_size"

    def check_options(self, hidden_size: int | None = None) -> None:
        """Raise a ValueError naming the first field whose value is bad; ``hidden_size`` is the mixer's width
        where an option must fit it (a config passes its own). Subclasses extend this (call super)."""
        if hidden_size is not None and (
            isinstance(hidden_size, bool) or not isinstance(hidden_size, int) or hidden_size < 1
        ):
            raise ValueError(f"{self.width_name()} must be an integer >= 1; got {hidden_size!r}")
