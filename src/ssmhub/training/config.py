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
    output_dir: str = field(
        default="runs/train",
        metadata={"help": "Folder of the run: checkpoints, metrics.jsonl, the final model and tokenizer."},
    )
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Let a fresh run write into a non-empty output_dir (replacing what is there)."}
    )
    # data
    dataset: str = field(
        default="wikitext-2",
        metadata={
            "help": "Training corpus, a name registered in ssmhub.training.data (wikitext-2, wikitext-103, pg19, ...)."
        },
    )
    data_dir: str | None = field(
        default=None, metadata={"help": "Local copy of the data; default $SSMHUB_DATA_DIR, else the Hugging Face Hub."}
    )
    seq_len: int = field(
        default=128, metadata={"help": "Tokens per training window (the truncation length of --stateful)."}
    )
    max_eval_windows: int = field(default=256, metadata={"help": "Validation windows evaluated (0: all)."})
    cache_dir: str | None = field(
        default=None, metadata={"help": "Cache of tokenized windows; default $SSMHUB_CACHE_DIR, else ~/.cache/ssmhub."}
    )
    preprocessing_num_workers: int = field(
        default=0, metadata={"help": "Processes that tokenize with datasets.map (0: the main one)."}
    )
    # long documents (issue 26): at most one of the two; validation always scores independent windows
    packing: bool = field(
        default=False,
        metadata={
            "help": "Documents back to back with no padding, position_ids restarting at each (no state crosses them)."
        },
    )
    stateful: bool = field(
        default=False,
        metadata={
            "help": "Each batch row reads one document after another, its state carried window to window (TBPTT)."
        },
    )
    repeat_passage_probability: float = field(
        default=0.0,
        metadata={
            "help": "Copying practice: the fraction of plain windows that end by repeating a passage of their own."
        },
    )
    shuffle_repeated_passages: bool = field(
        default=False,
        metadata={"help": "Repeat the passage's tokens in a random order: nothing to recall, only to copy."},
    )
    # tokenizer: a folder / tokenizer.json, or a byte-level BPE of vocab_size trained on the train split
    tokenizer: str | None = field(
        default=None,
        metadata={
            "help": "Tokenizer folder or tokenizer.json; default: a BPE of vocab_size trained on the train split."
        },
    )
    vocab_size: int = field(
        default=4096, metadata={"help": "Vocabulary of the BPE trained when no tokenizer is given."}
    )
    # model: a fresh one of model_type, or one saved before (a folder or Hub id) to continue training from
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "A saved model (folder or Hub id) to continue training: its weights, config and tokenizer."},
    )
    model_type: str | None = field(
        default=None,
        metadata={
            "help": "Family of a new model (dlr, h3, serpent, bdlrnn, gpt2, ...); default dlr, or the saved model's."
        },
    )
    model_config: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": 'JSON object of model config fields, e.g. \'{"hidden_size": 256, "attention_window": 512}\'.'
        },
    )
    # optimization
    per_device_train_batch_size: int = field(default=8, metadata={"help": "Training rows per process and micro-batch."})
    per_device_eval_batch_size: int = field(default=8, metadata={"help": "Validation rows per process."})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Micro-batches per optimizer step."})
    max_steps: int = field(default=1000, metadata={"help": "Optimizer steps of the run."})
    learning_rate: float = field(
        default=1e-3, metadata={"help": "Peak learning rate of AdamW (after warmup, before the cosine decay)."}
    )
    recurrence_learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "Learning rate of the recurrence parameters; default the model config's, else learning_rate."
        },
    )
    weight_decay: float = field(
        default=0.1, metadata={"help": "AdamW weight decay (recurrence parameters, norms and biases get none)."}
    )
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW's beta1, the decay of its gradient average."})
    adam_beta2: float = field(
        default=0.95, metadata={"help": "AdamW's beta2, the decay of its squared-gradient average."}
    )
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW's epsilon, added to the denominator."})
    warmup_steps: int = field(default=100, metadata={"help": "Steps of linear learning-rate warmup."})
    min_lr_ratio: float = field(
        default=0.1, metadata={"help": "The cosine decays to learning_rate * min_lr_ratio at max_steps."}
    )
    max_grad_norm: float = field(default=1.0, metadata={"help": "Clip the gradient norm to this (0: no clipping)."})
    mixed_precision: str = field(
        default="no", metadata={"help": "Autocast dtype: no, bf16 or fp16 (recurrences and FFTs stay float32)."}
    )
    cpu: bool = field(
        default=False,
        metadata={"help": "Train on the CPU even where an accelerator is present (default: CUDA when available)."},
    )
    fsdp: bool = field(
        default=False,
        metadata={"help": "Shard the model with FSDP2 over the processes accelerate launch / torchrun started."},
    )
    compile: bool = field(
        default=False,
        metadata={
            "help": "torch.compile the training forward and backward whole (fullgraph=True, Inductor) through "
            "Accelerate's dynamo plugin; evaluation runs eager."
        },
    )
    gradient_checkpointing: bool = field(
        default=False,
        metadata={"help": "Recompute each block's activations in the backward: less memory, about one more forward."},
    )
    compile_backend: str = field(
        default="inductor",
        metadata={"help": "torch.compile backend of --compile (aot_eager: the same capture, no code generation)."},
    )
    seed: int = field(default=0, metadata={"help": "Seed of the model's initialization and of the data order."})
    # logging, evaluation, checkpoints
    logging_steps: int = field(default=10, metadata={"help": "Log the training loss every this many steps."})
    eval_steps: int = field(default=100, metadata={"help": "Evaluate every this many steps (0: only at the end)."})
    save_steps: int = field(
        default=500, metadata={"help": "Write a checkpoint every this many steps (0: no intermediate checkpoints)."}
    )
    save_total_limit: int = field(default=3, metadata={"help": "Keep the newest K checkpoints (0: keep all)."})
    resume: bool = field(
        default=False, metadata={"help": "Continue from the newest complete checkpoint in output_dir/checkpoints."}
    )
    allow_schedule_change: bool = field(
        default=False,
        metadata={"help": "With --resume: follow a changed schedule (steps, warmup, rates) instead of refusing it."},
    )
    report_to: list[str] = field(
        default_factory=list, metadata={"help": "Accelerate trackers (log_with), comma-separated, e.g. tensorboard."}
    )
    # publishing
    save_code: bool = field(
        default=False,
        metadata={
            "help": "Also write the model's code, so the folder loads with trust_remote_code=True without ssmhub."
        },
    )
    push_to_hub: bool = field(
        default=False,
        metadata={
            "help": "Upload the final model, tokenizer and model card to the Hub (needs --hub_model_id, $HF_TOKEN)."
        },
    )
    hub_model_id: str | None = field(
        default=None, metadata={"help": 'The Hub repository, "org/name"; the token comes from $HF_TOKEN.'}
    )
    hub_private: bool = field(default=False, metadata={"help": "Create the Hub repository as private."})

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
        if self.compile and self.compile_backend not in _compile_backends():
            raise ValueError(
                f"compile_backend must be one of {_compile_backends()} (torch.compile's); got {self.compile_backend!r}"
            )
        if not isinstance(self.model_config, dict):
            raise ValueError(f"model_config must be a mapping of model config fields; got {self.model_config!r}")
        if self.model_type is None and not self.model_name_or_path:
            self.model_type = "dlr"
        if isinstance(self.report_to, str):
            self.report_to = [name for name in self.report_to.split(",") if name and name != "none"]
        if self.push_to_hub and not self.hub_model_id:
            raise ValueError("push_to_hub needs hub_model_id (e.g. --hub_model_id my-org/my-model)")


def _compile_backends() -> list[str]:
    import torch._dynamo

    return torch._dynamo.list_backends(exclude_tags=())  # the debug ones too (aot_eager, eager)


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
        shown = f" Default: {default}." if default not in (None, [], {}) else ""  # None: the help says what happens
        help_text = f"{f.metadata.get('help', '')}{shown}"
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        elif kind is dict:
            parser.add_argument(flag, type=json_object, metavar="JSON", help=help_text)
        elif kind is list:
            parser.add_argument(flag, type=str, metavar="A,B", help=help_text)
        else:
            parser.add_argument(flag, type=kind, help=help_text)
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
