"""The name under which transformers hands a model its cache and reads it back from the outputs.

transformers 5.24 renamed ``past_key_values`` (and Mamba's ``cache_params``) to ``cache``: its
``generate`` now passes ``cache=`` to ``forward`` and reads ``outputs["cache"]``, where 5.0-5.23
pass and read ``past_key_values``. ssmhub's forwards accept either name, and their outputs store the
cache in the field of the installed transformers, so ``generate`` finds it under every 5.x release.
"""

from __future__ import annotations

import dataclasses

from transformers.modeling_outputs import CausalLMOutputWithPast

from ..cache import RecurrentCache

__all__ = ["CACHE_FIELD", "resolve_cache_argument"]

# "cache" from transformers 5.24 on, "past_key_values" before
CACHE_FIELD = "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"


def resolve_cache_argument(
    cache: RecurrentCache | None, past_key_values: RecurrentCache | None
) -> RecurrentCache | None:
    """The one cache a forward was given, as ``cache`` or as ``past_key_values``; checked to be a RecurrentCache."""
    if cache is not None and past_key_values is not None:
        raise ValueError("pass the recurrent cache once, as `cache` or as `past_key_values`; got both")
    given = cache if cache is not None else past_key_values
    if given is not None and not isinstance(given, RecurrentCache):
        raise ValueError(f"cache must be an ssmhub RecurrentCache (or None); got {type(given).__name__}")
    return given
