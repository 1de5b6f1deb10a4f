"""Prompt caches on disk: prefill a long document once, continue from it in later sessions.

The file format behind :meth:`ssmhub.cache.RecurrentCache.save` and :meth:`~ssmhub.cache.RecurrentCache.load`
(this module reads and writes layer states; it does not import the cache class). A cache is one safetensors
file: its tensors (``layers.<i>.<field>``) and, in the file's metadata, what identifies the model it belongs
to: the family (``model_type``), a hash of the config's fields that shape the computation, a fingerprint of
the weights, the dtype, the batch size and the tokens absorbed. :func:`read_cache_file` refuses, with a
ValueError naming the mismatch, a file written for another model, dtype or batch size: a state fed to the
wrong model decodes nonsense without any error. The write is atomic (a temporary file, fsync, rename), so a
crash never leaves half a cache.
"""

from __future__ import annotations

import hashlib
import json
import os

import torch
from safetensors.torch import load_file, save_file

from .fileio import atomic_path

__all__ = ["config_hash", "model_identity", "read_cache_file", "weights_fingerprint", "write_cache_file"]

FORMAT = "ssmhub-recurrent-cache"
VERSION = "2"  # 2 (issue 45): DLR states are float32 planes; version 1 files convert on load (cache.py)
# config fields that say how a model is stored or called, not what it computes
_VOLATILE_CONFIG_FIELDS = {
    "_name_or_path",
    "architectures",
    "auto_map",
    "dtype",
    "torch_dtype",
    "transformers_version",
    "use_cache",
    "return_dict",
    "output_hidden_states",
    "output_attentions",
    "id2label",
    "label2id",
}


def config_hash(config) -> str:
    """sha256 of the config's fields that shape the computation (not its dtype, name or version fields)."""
    fields = {k: v for k, v in config.to_dict().items() if k not in _VOLATILE_CONFIG_FIELDS and not k.startswith("_")}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def weights_fingerprint(model, samples: int = 64) -> str:
    """sha256 over each parameter's name, shape and ``samples`` evenly spaced values: cheap (it reads a few
    kilobytes whatever the model's size) and different for two initialisations or trainings of one config.
    Two models that differ only between the sampled values share it."""
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        flat = param.detach().reshape(-1)
        index = torch.linspace(0, flat.numel() - 1, min(samples, flat.numel()), device=flat.device).long()
        digest.update(f"{name}{tuple(param.shape)}".encode())
        digest.update(flat[index].float().cpu().numpy().tobytes())
    return digest.hexdigest()


def model_identity(model) -> dict[str, str]:
    """What a saved cache records about the model it belongs to."""
    return {
        "model_type": str(model.config.model_type),
        "config_hash": config_hash(model.config),
        "weights_fingerprint": weights_fingerprint(model),
        "dtype": str(model.dtype).removeprefix("torch."),
        "num_layers": str(model.config.num_hidden_layers),
    }


def write_cache_file(state: dict[str, torch.Tensor], path: str | os.PathLike, model) -> None:
    """Write a cache's :meth:`~ssmhub.cache.RecurrentCache.state_dict` (a prefilled prompt of ``model``) to
    ``path``, atomically: its ``layers.<i>.<field>`` tensors, and its token count in the metadata with ``model``'s
    identity.

    Raises a ValueError naming ``cache`` if it is empty (nothing prefilled) or holds a different number of
    layers than ``model``.
    """
    seen_tokens = int(state.get("seen_tokens", 0))
    tensors = {key: t.contiguous().cpu() for key, t in state.items() if key != "seen_tokens"}
    if not tensors or seen_tokens == 0:
        raise ValueError("cache is empty: prefill a prompt into it (model(ids, use_cache=True)) before saving it")
    layers = {int(key.split(".")[1]) for key in tensors}
    if max(layers) >= model.config.num_hidden_layers:
        raise ValueError(f"cache has {max(layers) + 1} layers but the model has {model.config.num_hidden_layers}")
    metadata = {
        "format": FORMAT,
        "version": VERSION,
        **model_identity(model),
        "batch_size": str(next(iter(tensors.values())).shape[0]),
        "seen_tokens": str(seen_tokens),
    }
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


def _check_identity(saved: dict[str, str], model, batch_size: int | None, path) -> None:
    """Raise a ValueError naming the first field of the file that does not fit ``model`` (or ``batch_size``)."""
    if saved.get("format") != FORMAT:
        raise ValueError(f"path {os.fspath(path)!r} is not an ssmhub recurrent cache (format {saved.get('format')!r})")
    expected = model_identity(model)
    what = {
        "model_type": "a model of another family",
        "num_layers": "a model with another number of layers",
        "config_hash": "a model with another config",
        "weights_fingerprint": "a model with other weights",
        "dtype": "a model in another dtype",
    }
    for field, meaning in what.items():
        if saved.get(field) != expected[field]:
            raise ValueError(
                f"the cache at {os.fspath(path)!r} belongs to {meaning}: {field} is {saved.get(field)!r} there and "
                f"{expected[field]!r} for model"
            )
    if batch_size is not None and int(saved["batch_size"]) != batch_size:
        raise ValueError(
            f"batch_size is {batch_size} but the cache at {os.fspath(path)!r} holds {saved['batch_size']} rows"
        )


def read_cache_file(path: str | os.PathLike, model, batch_size: int | None = None) -> dict[str, torch.Tensor]:
    """The :meth:`~ssmhub.cache.RecurrentCache.state_dict` (on the CPU) stored by :func:`write_cache_file`.

    Args:
        path: the file. model: the model it must belong to (same family, config, weights and dtype).
        batch_size: if given, the number of rows the caller will feed (checked against the file's).

    Raises a ValueError naming the mismatch (``model_type``, ``config_hash``, ``weights_fingerprint``,
    ``dtype``, ``batch_size``) before anything is loaded onto the device.
    """
    from safetensors import safe_open

    with safe_open(os.fspath(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    _check_identity(metadata, model, batch_size, path)
    state = load_file(os.fspath(path))
    return {**state, "seen_tokens": torch.tensor(int(metadata["seen_tokens"]), dtype=torch.int64, device="cpu")}
