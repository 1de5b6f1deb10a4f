"""Checks the command-line tools run before any work starts, shared so that every tool refuses alike.

Each check raises ValueError (or FileNotFoundError) with one line that names the argument and says what
was expected; :meth:`ssmhub.command_line.CommandLineParser.bad_input_errors` turns it into
``prog: error: <line>`` and exit status 2. None of them writes anything.

- output paths: :func:`check_output_file`, :func:`check_output_dir` (a file where a folder is expected,
  or the other way round, or a place that cannot be created, is found before the run rather than after it);
- devices: :func:`check_device` (``cuda`` on a CPU-only torch);
- the Hub: :func:`check_hub_access` (token, offline mode, the token accepted) before a run that pushes;
- models: :func:`model_config_class` (an unknown ``--model_type`` in one short line, not transformers'
  list of every architecture), :func:`check_model_config_keys` (the one check of ``--model_config`` keys
  that every tool uses: a misspelled key is an error, never an ignored attribute) and
  :func:`make_model_config` (a bad value in one line, not a traceback).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "check_device",
    "check_hub_access",
    "check_model_config_keys",
    "check_output_dir",
    "check_output_file",
    "check_stateful_model",
    "config_fields",
    "make_model_config",
    "model_config_class",
]

_TRUE = ("1", "true", "yes", "on")


def _nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists (what creating ``path`` would start from)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_creatable(path: Path, option: str) -> None:
    """Raise ValueError when ``path`` (absent) could not be created: an ancestor is a file or read-only."""
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise ValueError(f"{option} {path} cannot be created: {base} is a file, not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path} cannot be created: the folder {base} is not writable")


def check_output_file(path: str | os.PathLike | None, option: str, example: str = "results.json") -> None:
    """Raise ValueError unless ``path`` (if given) can be written as a file: not a folder, and writable or
    creatable; ``example`` is the file name the message suggests for a folder."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option} {path} is a folder; give a file path, such as {path / example}")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{option} {path} is not writable")
    _check_creatable(path, option)


def check_output_dir(path: str | os.PathLike, option: str) -> None:
    """Raise ValueError unless ``path`` is a writable folder or can be created as one."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option} {path} is a file; give a folder (it is created if missing)")
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path} is not writable")
    _check_creatable(path, option)


def check_device(name: str | None, option: str = "--device"):
    """The ``torch.device`` for ``name`` (None or ``"auto"``: CUDA when available, else the CPU).

    Raises ValueError for a name torch does not know or a device this torch cannot use (``cuda`` on a
    CPU-only build, a GPU index past the last one, ``mps`` off Apple silicon).
    """
    import torch

    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"{option} must be 'auto', 'cpu', 'cuda' or 'cuda:N'; got {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{option} {name}: CUDA is not available to this torch ({torch.__version__}); use cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"{option} {name}: there are {torch.cuda.device_count()} CUDA devices")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{option} {name}: MPS is not available on this machine; use cpu")
    return device


def check_hub_access(repo_id: str | None, option: str = "--push_to_hub") -> None:
    """Raise ValueError when a push to the Hub repo ``repo_id`` at the end of a run could not work: no
    or a malformed repo id, ``HF_HUB_OFFLINE`` set, no token (``$HF_TOKEN`` or a stored login), or a
    token the Hub does not accept (``whoami``). The token never appears in the message."""
    import huggingface_hub
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not repo_id:
        raise ValueError(f"{option} needs --hub_model_id (e.g. --hub_model_id my-org/my-model)")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise ValueError(f"--hub_model_id {repo_id!r} is not a valid repo id ({first_line(err)})") from None
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE:
        raise ValueError(f"{option}: HF_HUB_OFFLINE is set, so the push to {repo_id!r} would fail; unset it first")
    token = os.environ.get("HF_TOKEN") or huggingface_hub.get_token()
    if not token:
        raise ValueError(f"{option} needs a Hugging Face token: set HF_TOKEN (or log in with `hf auth login`)")
    try:
        huggingface_hub.whoami(token=token)
    except Exception as err:  # network or authentication: either way the push would fail
        reason = first_line(err).replace(token, "***")
        raise ValueError(f"{option}: the Hub did not accept the token ({type(err).__name__}: {reason})") from None


def first_line(err: BaseException) -> str:
    """The first line of an exception's message ("" if it has none): a one-line reason for an error message."""
    return (str(err).strip().splitlines() or [""])[0]


def _registered_model_types() -> list[str]:
    """Every ``model_type`` that ``AutoConfig`` knows (ssmhub's families registered)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    import ssmhub  # noqa: F401  (registers the families)

    return list(CONFIG_MAPPING.keys())


def model_config_class(
    model_type: str, auto_class=None, purpose: str = "", extra_types: Iterable[str] = (), option: str = "--model_type"
) -> type:
    """The config class of ``model_type``; ``auto_class`` (e.g. ``AutoModelForCausalLM``), if given, must
    have a model for it.

    Raises ValueError in one line listing the ssmhub families (and ``extra_types``, names the tool adds)
    and saying that any transformers model_type with a model for ``purpose`` also works.
    """
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from .models.auto import FAMILIES

    known = _registered_model_types()
    families = ", ".join([*sorted(FAMILIES), *extra_types])
    if model_type not in known:
        close = difflib.get_close_matches(model_type, [*known, *extra_types], n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        that_has = f" that has {purpose}" if purpose else ""
        raise ValueError(
            f"{option} {model_type!r} is not a registered model type; {hint}use an ssmhub family ({families}) "
            f"or any transformers model_type{that_has} (e.g. 'gpt2', 'mamba')"
        )
    config_class = CONFIG_MAPPING[model_type]
    if auto_class is not None and config_class not in auto_class._model_mapping:
        raise ValueError(
            f"{option} {model_type!r} has no {auto_class.__name__} model ({purpose or 'needed here'}); "
            f"use an ssmhub family ({families})"
        )
    return config_class


def config_fields(config_class: type) -> set[str]:
    """The keys a config of ``config_class`` takes: the fields of a default one and their aliases
    (``attribute_map``, e.g. GPT-2's ``hidden_size`` for ``n_embd``)."""
    return set(config_class().to_dict()) | set(getattr(config_class, "attribute_map", {}))


def check_model_config_keys(
    config_class: type, model_config: Mapping[str, Any], set_by: Mapping[str, str] | None = None
) -> None:
    """The check of ``--model_config`` keys, the same in every tool: raise ValueError for the first key
    that is not a field of ``config_class`` (transformers would keep it as a silently unused attribute),
    with the closest field or the valid ones, or one in ``set_by`` (key -> the flag that sets it)."""
    if not isinstance(model_config, Mapping):
        raise ValueError(f"--model_config must be a JSON object of config fields; got {model_config!r}")
    known = config_fields(config_class)
    model_type = getattr(config_class, "model_type", config_class.__name__)
    for key in model_config:
        if key in (set_by or {}):
            raise ValueError(f"--model_config key {key!r} is set by {set_by[key]}; use that flag instead")
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(sorted(known))}"
            raise ValueError(f"--model_config key {key!r} is not a field of the {model_type!r} config; {hint}")


def make_model_config(config_class: type, fields: Mapping[str, Any]):
    """``config_class(**fields)``, a value the config rejects (a type, a range) raised as a one-line
    ValueError naming ``--model_config`` rather than a multi-line validation traceback."""
    from huggingface_hub.errors import StrictDataclassError

    try:
        return config_class(**fields)
    except (StrictDataclassError, TypeError, ValueError) as err:
        raise ValueError(f"--model_config does not fit the {config_class.model_type!r} config: {err}") from None


def check_stateful_model(
    config,
    subject: str,
    other_model_fix: str,
    window_fix: str,
    attention_window: int | None = None,
    caller: str = "--stateful",
) -> None:
    """Raise ValueError unless a model of ``config`` can carry its state through a whole document (``--stateful``):
    only ssmhub models have a cache of fixed size, and a hybrid's attention layers only with a sliding window
    (``attention_window``, else the config's).

    Args: subject names the model in the message (``"model runs/x"``); ``other_model_fix`` and ``window_fix`` say
    how to fix each case with the calling tool's options; ``caller`` opens the message (the option or function).
    """
    from .models.auto import FAMILIES

    model_type = getattr(config, "model_type", "")
    if model_type not in FAMILIES:
        raise ValueError(
            f"{caller} needs an ssmhub recurrent model ({', '.join(sorted(FAMILIES))}), whose cache has a fixed "
            f"size; {subject} is a {model_type!r} model: {other_model_fix}"
        )
    attention_layers = list(getattr(config, "attention_layers", None) or [])
    window = attention_window if attention_window is not None else getattr(config, "attention_window", None)
    if attention_layers and window is None:
        raise ValueError(
            f"{caller}: {subject} has attention layers {attention_layers}, whose cache would keep every key and "
            f"value of a document; {window_fix}"
        )
