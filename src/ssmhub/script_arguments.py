"""The model and tokenizer arguments of the scripts in ``examples/``, written once for all of them.

:class:`ModelArguments` is a dataclass for ``transformers.HfArgumentParser`` (beside ``TrainingArguments``),
as in transformers' ``run_clm.py``: a saved folder or Hub id (``--model_name_or_path``), or a new model of
any registered family (``--model_type``, with ``--config_json`` and ``--config_overrides``).
:func:`build_model` turns it into a model of the Auto class a script needs; a transformers Mamba folder
given to a causal-LM script becomes a SeRpEnt model with Mamba's weights (SeRpEnt's base branch is Mamba,
arXiv 2501.11729 §4.3; see :mod:`ssmhub.models.serpent.convert_mamba`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BudgetArguments", "ModelArguments", "build_model", "load_script_tokenizer", "parse_config_overrides"]

DEFAULT_TOKENIZER = "tokenizers/gpt2"  # under $SSMHUB_DATA_DIR, GPT-2's byte-level BPE


@dataclass
class ModelArguments:
    """Which model to train, fine-tune or run, and with which tokenizer."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "A saved model folder or Hub id; leave out to train a new model."}
    )
    model_type: str = field(
        default="dlr", metadata={"help": "Family of a new model (dlr, h3, serpent, bdlrnn, or a transformers one)."}
    )
    config_json: str | None = field(
        default=None, metadata={"help": "JSON file of config fields for a new model (may name its model_type)."}
    )
    config_overrides: str | None = field(
        default="hidden_size=64,num_hidden_layers=2",
        metadata={"help": "Comma-separated key=value config fields of a new model (values read as JSON)."},
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={"help": f"Tokenizer folder or file; default the model's, else $SSMHUB_DATA_DIR/{DEFAULT_TOKENIZER}."},
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where downloads and datasets' files go."})


@dataclass
class BudgetArguments:
    """A training budget in minutes instead of steps, and the CPU threads, for comparing models at equal cost."""

    max_train_minutes: float | None = field(
        default=None, metadata={"help": "Stop training after this many minutes (evaluation excluded); else steps."}
    )
    budget_clock: str = field(
        default="cpu", metadata={"help": "Clock of --max_train_minutes: cpu (this process's CPU time) or wall."}
    )
    eval_every_minutes: float | None = field(
        default=None, metadata={"help": "Evaluate every this many budget minutes (an accuracy curve over time)."}
    )
    torch_num_threads: int | None = field(default=None, metadata={"help": "torch.set_num_threads (default: torch's)."})

    def callbacks(self) -> list:
        """Sets the thread count; returns the ``Trainer`` callbacks of the budget (none without one)."""
        import torch

        if self.torch_num_threads is not None:
            if self.torch_num_threads < 1:
                raise ValueError(f"--torch_num_threads must be >= 1; got {self.torch_num_threads}")
            torch.set_num_threads(self.torch_num_threads)
        if self.max_train_minutes is None:
            if self.eval_every_minutes is not None:
                raise ValueError("--eval_every_minutes needs --max_train_minutes (it counts budget minutes)")
            return []
        from .training.time_budget import TimeBudgetCallback

        every = None if self.eval_every_minutes is None else 60 * self.eval_every_minutes
        return [TimeBudgetCallback(60 * self.max_train_minutes, clock=self.budget_clock, eval_every=every)]


def parse_config_overrides(text: str | None) -> dict:
    """``"hidden_size=64,use_glu=true"`` -> ``{"hidden_size": 64, "use_glu": True}`` (values read as JSON,
    else kept as strings). Raises ValueError naming ``--config_overrides`` for an item without ``=``."""
    fields = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--config_overrides items are key=value; got {item!r}")
        try:
            fields[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            fields[key.strip()] = value
    return fields


def _new_config(args: ModelArguments, **fields):
    """A config for a new model from ``--model_type``, ``--config_json``, ``--config_overrides`` and ``fields``
    (the script's: vocabulary size, labels), later ones winning."""
    from transformers import AutoConfig

    from .preflight import make_model_config, model_config_class

    from_json = {}
    if args.config_json is not None:
        from_json = json.loads(Path(args.config_json).read_text(encoding="utf-8"))
        if not isinstance(from_json, dict):
            raise ValueError(f"--config_json must hold a JSON object; got {type(from_json).__name__}")
    model_type = from_json.pop("model_type", args.model_type)
    model_config_class(model_type)  # a one-line error for an unknown type
    config_class = AutoConfig.for_model(model_type).__class__
    return make_model_config(config_class, {**from_json, **parse_config_overrides(args.config_overrides), **fields})


def build_model(args: ModelArguments, auto_class, tokenizer=None, **fields):
    """The model of ``auto_class`` (e.g. ``AutoModelForCausalLM``) that ``args`` name.

    A saved folder or Hub id is loaded (``fields``, e.g. ``num_labels``, go to ``from_pretrained``); a
    transformers Mamba folder loaded for causal LM becomes a SeRpEnt. Otherwise a new model is built, its
    vocabulary size and pad / bos / eos ids taken from ``tokenizer`` (when given) before ``fields``.
    """
    import ssmhub  # registers every family with the Auto classes
    from ssmhub.models.serpent.convert_mamba import is_mamba_checkpoint

    if args.model_name_or_path is None:
        from_tokenizer = {} if tokenizer is None else _tokenizer_fields(tokenizer)
        return auto_class.from_config(_new_config(args, **from_tokenizer, **fields))
    path = args.model_name_or_path
    if auto_class.__name__ == "AutoModelForCausalLM" and is_mamba_checkpoint(path, cache_dir=args.cache_dir):
        return ssmhub.SerpentForCausalLM.from_pretrained(path, cache_dir=args.cache_dir, **fields)
    return auto_class.from_pretrained(path, cache_dir=args.cache_dir, **fields)


def _tokenizer_fields(tokenizer) -> dict:
    """The config fields a new model takes from its tokenizer (ids the tokenizer lacks are left out)."""
    ids = {name: getattr(tokenizer, name) for name in ("pad_token_id", "bos_token_id", "eos_token_id")}
    return {"vocab_size": len(tokenizer), **{name: value for name, value in ids.items() if value is not None}}


def load_script_tokenizer(args: ModelArguments):
    """The tokenizer of ``--tokenizer_name``, else the model folder's, else GPT-2's from ``$SSMHUB_DATA_DIR``.

    A tokenizer without its own pad token gets one (and left padding) when the model is new; a saved
    model's tokenizer is used as saved. Raises ValueError saying which flag to give when there is none.
    """
    from .tokenization import ensure_pad_token, resolve_tokenizer

    name = args.tokenizer_name or args.model_name_or_path
    if name is None:
        data_dir = os.environ.get("SSMHUB_DATA_DIR")
        if not data_dir:
            raise ValueError("--tokenizer_name is needed for a new model when $SSMHUB_DATA_DIR is not set")
        name = str(Path(data_dir) / DEFAULT_TOKENIZER)
    tokenizer = resolve_tokenizer(name, cache_dir=args.cache_dir)
    if args.model_name_or_path is None:
        ensure_pad_token(tokenizer)
    return tokenizer
