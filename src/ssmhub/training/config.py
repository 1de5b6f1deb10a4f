"""Training options: the :class:`TrainConfig` dataclass, loaded from a JSON/YAML file and/or CLI flags.

Every option is a field of :class:`TrainConfig`; a config file holds a mapping of field names and
command-line flags (``--field_name value``) override it. An unknown key, in a file or on the command
line, raises a :class:`ValueError` that names it and lists the valid ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..command_line import CommandLineParser, json_object

__all__ = ["MIXED_PRECISION_CHOICES", "TrainConfig", "build_arg_parser", "config_from_args", "load_config_file"]

MIXED_PRECISION_CHOICES = ("no", "bf16", "fp16")


@dataclass
class TrainConfig:
    """Every option of a training run (the CLI flag of a field is ``--<field name>``)."""

    # where things go
    output_dir: str = "runs/train"
    overwrite_output_dir: bool = False  # a fresh run may write into a non-empty output_dir (replacing what is there)
    # data
    dataset: str = "wikitext-2"  # a name registered in ssmhub.training.data (wikitext-2, wikitext-103, ...)
    data_dir: str | None = None  # local copy of the data; default $SSMHUB_DATA_DIR, else the Hugging Face Hub
    seq_len: int = 128
    max_eval_windows: int = 256  # validation windows evaluated (0: all)
    cache_dir: str | None = None  # tokenized windows cache; default $SSMHUB_CACHE_DIR, else ~/.cache/ssmhub
    preprocessing_num_workers: int = 0  # processes for tokenizing with datasets.map (0: the main one)
    # long documents (issue 26): at most one of the two; validation always scores independent windows
    packing: bool = False  # documents back to back, no padding, position_ids restarting at each (no state crosses)
    stateful: bool = False  # each batch row reads one document after another, its state carried window to window
    # copying practice: this fraction of plain windows ends by repeating a passage of its own (batches.repeat_passages)
    repeat_passage_probability: float = 0.0
    shuffle_repeated_passages: bool = False  # the passage's tokens in a random order: nothing to recall, only to copy
    # tokenizer: a folder / tokenizer.json, or a byte-level BPE of vocab_size trained on the train split
    tokenizer: str | None = None
    vocab_size: int = 4096
    # model: a fresh one of model_type, or one saved before (a folder or Hub id) to continue training from
    model_name_or_path: str | None = None  # its weights, config (model_config overrides it) and tokenizer
    model_type: str | None = None  # default: dlr, or the type of model_name_or_path
    model_config: dict[str, Any] = field(default_factory=dict)  # size kwargs, e.g. {"hidden_size": 256}
    # optimization
    per_device_train_batch_size: int = 8
    per_device_eval_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    max_steps: int = 1000
    learning_rate: float = 1e-3
    recurrence_learning_rate: float | None = None  # default: the model config's, else learning_rate
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_epsilon: float = 1e-8
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1  # the cosine decays to learning_rate * min_lr_ratio at max_steps
    max_grad_norm: float = 1.0  # 0: no clipping
    mixed_precision: str = "no"
    cpu: bool = False  # force the CPU even where an accelerator is present
    # shard the model with FSDP2 (fully_shard per block, the recurrence parameters in a float32 group of their own;
    # ssmhub.training.fsdp) across the processes torchrun / accelerate launch started; mixed_precision bf16 becomes
    # its MixedPrecisionPolicy (bf16 compute, float32 master weights and gradient reduction)
    fsdp: bool = False
    seed: int = 0
    # logging, evaluation, checkpoints
    logging_steps: int = 10
    eval_steps: int = 100  # 0: evaluate only at the end
    save_steps: int = 500  # 0: no intermediate checkpoints
    save_total_limit: int = 3  # keep the newest K checkpoints (0: keep all)
    resume: bool = False  # continue from the newest complete checkpoint in output_dir/checkpoints
    # with resume: follow a changed schedule (max_steps, warmup_steps, min_lr_ratio, learning rates) from the
    # checkpoint's step instead of refusing it
    allow_schedule_change: bool = False
    report_to: list[str] = field(default_factory=list)  # accelerate trackers (log_with), e.g. ["tensorboard"]
    # publishing
    # write the model's code into output_dir too (auto_map), so it loads with trust_remote_code=True where ssmhub
    # is not installed; transformers then asks for remote-code approval even to load the folder's tokenizer
    save_code: bool = False
    push_to_hub: bool = False
    hub_model_id: str | None = None  # "org/name"; the token comes from $HF_TOKEN
    hub_private: bool = False

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> TrainConfig:
        """Build a config from a mapping; an unknown key raises ValueError naming it and the valid ones."""
        check_known_keys(values, source)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> None:
        """Raise ValueError naming the first option whose value cannot work."""
        for name in (
            "seq_len",
            "per_device_train_batch_size",
            "per_device_eval_batch_size",
            "gradient_accumulation_steps",
            "max_steps",
            "vocab_size",
            "logging_steps",
        ):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer; got {getattr(self, name)!r}")
        for name in (
            "max_eval_windows",
            "preprocessing_num_workers",
            "warmup_steps",
            "eval_steps",
            "save_steps",
            "save_total_limit",
        ):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be a non-negative integer; got {getattr(self, name)!r}")
        if self.packing and self.stateful:
            raise ValueError(
                "packing and stateful exclude each other: --stateful already packs each row's documents back to "
                "back (and carries the state between windows); pass one of them"
            )
        if not 0 <= self.repeat_passage_probability <= 1:
            raise ValueError(f"repeat_passage_probability must be in [0, 1]; got {self.repeat_passage_probability!r}")
        if self.repeat_passage_probability and (self.packing or self.stateful):
            raise ValueError(
                "repeat_passage_probability applies to plain windows: a packed or stateful row holds whole documents "
                "in order, so it has no passage to repeat without breaking them; drop --packing / --stateful or it"
            )
        if self.shuffle_repeated_passages and not self.repeat_passage_probability:
            raise ValueError("shuffle_repeated_passages needs repeat_passage_probability > 0 (no passage is repeated)")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be positive; got {self.learning_rate}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1]; got {self.min_lr_ratio}")
        if self.mixed_precision not in MIXED_PRECISION_CHOICES:
            raise ValueError(f"mixed_precision must be one of {MIXED_PRECISION_CHOICES}; got {self.mixed_precision!r}")
        if self.fsdp and self.mixed_precision == "fp16":
            raise ValueError(
                "fsdp with mixed_precision fp16 is not supported (it needs a sharded gradient scaler); "
                "use --mixed_precision bf16 or no"
            )
        if self.fsdp and self.stateful:
            raise ValueError("fsdp with stateful is not supported yet: train a stateful run without --fsdp")
        if not isinstance(self.model_config, dict):
            raise ValueError(f"model_config must be a mapping of model config fields; got {self.model_config!r}")
        if self.model_type is None and not self.model_name_or_path:
            self.model_type = "dlr"
        if isinstance(self.report_to, str):
            self.report_to = [name for name in self.report_to.split(",") if name and name != "none"]
        if self.push_to_hub and not self.hub_model_id:
            raise ValueError("push_to_hub needs hub_model_id (e.g. --hub_model_id my-org/my-model)")


def check_known_keys(values: dict[str, Any], source: str) -> None:
    """Raise ValueError for the first key of ``values`` that is not a TrainConfig field."""
    valid = TrainConfig.field_names()
    for key in values:
        if key not in valid:
            raise ValueError(f"unknown option {key!r} in {source}; valid options are: {', '.join(valid)}")


def load_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a JSON (``.json``) or YAML (``.yaml``/``.yml``) mapping of options; keys are checked."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        values = yaml.safe_load(text) or {}
    else:
        values = json.loads(text)
    if not isinstance(values, dict):
        raise ValueError(f"config file {path} must hold a mapping of options; got {type(values).__name__}")
    check_known_keys(values, f"config file {path}")
    return values


def _base_type(annotation: Any) -> Any:
    """The non-None type of a field annotation (``int | None`` -> int, ``dict[str, Any]`` -> dict)."""
    hint = annotation
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    return typing.get_origin(hint) or hint


def build_arg_parser(prog: str = "ssmhub-train") -> CommandLineParser:
    """One flag per TrainConfig field (``--field_name``, also accepted as ``--field-name``); flags not given
    stay absent (so a config file's values hold)."""
    parser = CommandLineParser(
        prog=prog,
        description="Train an ssmhub language model with Accelerate (options: a --config file and/or flags).",
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("--config", help="JSON or YAML file of options; flags override its values")
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        kind = _base_type(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        flag = f"--{f.name}"
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=f"default {default}")
        elif kind is dict:
            parser.add_argument(flag, type=json_object, metavar="JSON", help=f"default {default}")
        elif kind is list:
            parser.add_argument(flag, type=str, metavar="A,B", help=f"comma-separated; default {default}")
        else:
            parser.add_argument(flag, type=kind, help=f"default {default}")
    return parser


def config_from_args(argv: list[str] | None = None, parser: CommandLineParser | None = None) -> TrainConfig:
    """Parse CLI flags (and the ``--config`` file they name) into a validated TrainConfig."""
    parser = parser or build_arg_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        raise ValueError(
            f"unknown command-line argument {unknown[0]!r}; valid options are: "
            + ", ".join(f"--{name}" for name in ["config", *TrainConfig.field_names()])
        )
    flags = vars(args)
    config_path = flags.pop("config", None)
    values = load_config_file(config_path) if config_path else {}
    values.update(flags)
    return TrainConfig.from_dict(values, source=config_path or "command line")
