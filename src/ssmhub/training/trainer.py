"""The Accelerate training loop behind ``ssmhub-train``.

:func:`train` runs a :class:`~ssmhub.training.config.TrainConfig` in three phases, each a short function:

- :func:`_prepare` builds everything the loop needs (a :class:`_TrainingSetup`) and where it starts
  (a :class:`_Progress`):

  1. checks the options that can be checked cheaply (data folder, dataset, model type and config keys
     and values, seq_len against any length limit the model config declares, an ``output_dir`` that is
     a writable folder and, for a fresh run without ``overwrite_output_dir``, empty; a checkpoint to
     ``resume``; Hub access for ``push_to_hub``), before any data is read or anything written
     (:func:`_check_before_reading_data`), and starts Accelerate (:func:`_start_accelerator`);
  2. trains a BPE on the train documents, streamed (or loads ``tokenizer``), on the main process and
     saves it where every process loads it (:func:`_shared_tokenizer`): ``output_dir/.tmp-tokenizer``,
     moved to ``output_dir/checkpoints/tokenizer`` (where a resumed run finds it) once steps 2-4 have
     worked (:func:`_install_staged_tokenizer`); a start that fails in them leaves ``output_dir`` as it
     was (:func:`_nothing_left_on_failure`);
  3. tokenizes both splits into fixed-length windows once, into an on-disk cache that later runs reuse
     (:func:`ssmhub.data.cached_token_windows`; windows are memory-mapped, PG-19 is read book by
     book and its windows never cross a book), builds the model from
     ``AutoConfig.for_model(model_type, **model_config)`` (or loads ``model_name_or_path``), AdamW over
     ``model.optimizer_param_groups`` (no weight decay on recurrence parameters) and a warmup + cosine schedule
     (:func:`_build_model_and_optimizer`); the data is read in an order fixed by ``seed`` and the epoch
     (:class:`EpochShuffleSampler`), so a resumed run and a run on N processes with 1/N of the
     per-device batch see the same global batches;
  4. with ``resume``, restores the newest checkpoint (:func:`_resume_point`), and starts the metrics
     files and trackers (:func:`_start_records`).

  With ``fsdp`` the model is sharded by :func:`ssmhub.training.fsdp.shard_model` before its optimizer is built
  (not prepared by Accelerate), its checkpoints hold each process's shards (:data:`SHARDS_SUBDIR`) and the final
  folder its gathered weights.

- :func:`_run_loop` takes optimizer steps (:func:`_train_step`: gradient accumulation and clipping,
  mixed precision) until ``max_steps``, logs each to ``metrics.jsonl``, ``metrics.csv``, Accelerate
  trackers and a tqdm bar, evaluates every ``eval_steps`` and checkpoints every ``save_steps``
  (:func:`_evaluate_and_checkpoint`; see :mod:`.checkpoint`).

- :func:`_finish` saves model, tokenizer, model card and a loss plot into ``output_dir``, and pushes it
  to the Hub if asked (after the local save, so a failed push leaves a complete folder).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Sampler

from ..fileio import write_json_atomic
from ..metrics.functional import perplexity
from ..preflight import (
    check_hub_access,
    check_model_config_keys,
    check_output_dir,
    check_stateful_model,
    first_line,
    make_model_config,
    model_config_class,
)
from .batches import WindowBatches, count_targets
from .checkpoint import (
    CheckpointError,
    checkpoints_dir,
    list_checkpoints,
    load_checkpoint,
    newest_checkpoint,
    save_checkpoint,
)
from .config import TrainConfig
from .data import build_windows, check_data_dir, corpus_source, iter_documents
from .metrics import MetricsLogger, plot_losses
from .model_card import final_metrics, push_folder_to_hub, write_model_card
from .param_groups import param_groups
from .schedule import lr_lambda

__all__ = ["EpochShuffleSampler", "TrainResult", "build_model_config", "lr_lambda", "train"]

# Length limits a model config may declare; seq_len must not exceed any that is set.
_LENGTH_LIMIT_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length", "n_ctx")
TOKENIZER_SUBDIR = "tokenizer"
STAGED_TOKENIZER = ".tmp-tokenizer"  # under output_dir, until the run's start has worked
SHARDS_SUBDIR = "shards"  # of a checkpoint of an fsdp run: model and optimizer shards (torch.distributed.checkpoint)


@dataclass
class TrainResult:
    """What a finished run reports."""

    output_dir: Path
    steps: int
    tokens_seen: int
    train_loss: float | None
    eval_loss: float | None
    hub_url: str | None = None


class EpochShuffleSampler(Sampler[int]):
    """A permutation of ``range(n)`` fixed by ``seed`` and the epoch (``set_epoch``); no hidden RNG state."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return iter(torch.randperm(self.n, generator=generator).tolist())

    def __len__(self) -> int:
        return self.n


def build_model_config(config: TrainConfig, tokenizer=None):
    """The model config of ``model_type`` with ``model_config`` (or of ``model_name_or_path`` with ``model_config``
    as overrides); with a tokenizer, its vocabulary and special ids.

    Raises ValueError for a model type without a causal LM, an unknown config key (the check every tool
    shares, :func:`ssmhub.preflight.check_model_config_keys`), a value the config rejects, a seq_len the
    model cannot take, or a tokenizer larger than a forced ``vocab_size`` (or than the saved model's).
    """
    model_config = _model_config_alone(config)
    if tokenizer is not None:
        fit_to_tokenizer(model_config, config, tokenizer)
    return model_config


def _model_config_alone(config: TrainConfig):
    """:func:`build_model_config` before a tokenizer is known: built and checked once per run, before any data is
    read; :func:`fit_to_tokenizer` completes it."""
    if config.model_name_or_path:
        model_config = _saved_model_config(config)
    else:
        model_config = _new_model_config(config)
    for name in _LENGTH_LIMIT_FIELDS:
        limit = getattr(model_config, name, None)
        if isinstance(limit, int) and config.seq_len > limit:
            raise ValueError(f"seq_len {config.seq_len} exceeds the model's {name}={limit}")
    return model_config


def fit_to_tokenizer(model_config, config: TrainConfig, tokenizer) -> None:
    """Give ``model_config`` (of :func:`_model_config_alone`) the tokenizer's vocabulary size and special ids, in
    place, where ``model_config`` (the option) does not set them; a saved model's config keeps its own. Raises
    ValueError for a tokenizer larger than a forced ``vocab_size`` or than the saved model's."""
    if config.model_name_or_path:
        if model_config.vocab_size < len(tokenizer):
            raise ValueError(
                f"the tokenizer has {len(tokenizer)} tokens but --model_name_or_path {config.model_name_or_path} "
                f"has vocab_size={model_config.vocab_size}; pass the tokenizer that model was trained with"
            )
        return
    given = config.model_config
    if "vocab_size" in given and given["vocab_size"] < len(tokenizer):
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but model_config forces vocab_size={given['vocab_size']}; "
            "raise vocab_size or use a smaller tokenizer"
        )
    eos = tokenizer.eos_token_id
    fields = {
        "vocab_size": len(tokenizer),
        "eos_token_id": eos,
        "bos_token_id": tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos,
        "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos,
    }
    model_config.update({name: value for name, value in fields.items() if name not in given})


def _new_model_config(config: TrainConfig):
    from transformers import AutoModelForCausalLM

    config_class = model_config_class(config.model_type, AutoModelForCausalLM, "a causal LM")
    check_model_config_keys(config_class, config.model_config)
    return make_model_config(config_class, dict(config.model_config))


def _saved_model_config(config: TrainConfig):
    """The config saved with ``model_name_or_path``, ``model_config`` applied to it; ``config.model_type``
    becomes its type (ValueError when another type was asked for, or when there is no causal-LM config there)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    where = config.model_name_or_path
    try:
        saved = AutoConfig.from_pretrained(where)
    except (OSError, ValueError) as err:
        reason = first_line(err) or type(err).__name__
        raise ValueError(f"--model_name_or_path {where!r}: no model config could be loaded ({reason})") from None
    if config.model_type not in (None, saved.model_type):
        raise ValueError(
            f"--model_type {config.model_type!r} does not match --model_name_or_path {where} (a {saved.model_type!r} "
            "model); drop --model_type"
        )
    config.model_type = saved.model_type
    config_class = model_config_class(saved.model_type, AutoModelForCausalLM, "a causal LM", option=where)
    check_model_config_keys(config_class, config.model_config)
    return make_model_config(config_class, {**saved.to_diff_dict(), **config.model_config})


def _load_or_train_tokenizer(config: TrainConfig, train_documents: Iterable[str]):
    """The tokenizer of a new run, as a transformers user expects a causal LM's: a pad token distinct from
    eos (so ``DataCollatorForLanguageModeling`` keeps eos labels) and left padding (batched generation).
    A given tokenizer that lacks such a pad token gets one (:func:`~ssmhub.tokenization.ensure_pad_token`)
    before the model is built on ``len(tokenizer)``; a resumed run reuses the tokenizer saved by its start."""
    from ..tokenization import ensure_pad_token, resolve_tokenizer, train_bpe_tokenizer

    if config.tokenizer:
        tokenizer = resolve_tokenizer(config.tokenizer)
    elif config.model_name_or_path:
        tokenizer = _saved_model_tokenizer(config.model_name_or_path)
    else:
        tokenizer = train_bpe_tokenizer(train_documents, vocab_size=config.vocab_size)
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {config.tokenizer} has no eos token (needed to join documents)")
    if not ensure_pad_token(tokenizer, config.model_config.get("vocab_size")):
        print(
            f"warning: model_config vocab_size={config.model_config['vocab_size']} leaves no id for a pad token "
            f"beside the {len(tokenizer)} of tokenizer {config.tokenizer}: pad stays the eos token, so "
            "DataCollatorForLanguageModeling will mask eos labels; raise vocab_size to get a distinct pad token",
            flush=True,
        )
    return tokenizer


def _saved_model_tokenizer(where: str):
    """The tokenizer saved with the model at ``where``: a new BPE would not match the model's embeddings."""
    from ..tokenization import resolve_tokenizer

    files = ("tokenizer.json", "tokenizer_config.json")
    if Path(where).is_dir() and not any((Path(where) / name).is_file() for name in files):
        raise ValueError(
            f"--model_name_or_path {where} has no tokenizer ({' or '.join(files)}); pass --tokenizer, the one that "
            "model was trained with"
        )
    try:
        return resolve_tokenizer(where)
    except (OSError, ValueError, TypeError) as err:
        reason = first_line(err) or type(err).__name__
        raise ValueError(
            f"--model_name_or_path {where!r} has no tokenizer ({reason}); pass --tokenizer, the one that model was "
            "trained with"
        ) from None


@torch.no_grad()
def evaluate(accelerator, model, windows, batch_size: int) -> float:
    """Mean next-token loss over ``windows`` (``windows[indices]`` -> (n, seq_len) ids), shared out across
    processes (exact: sums are reduced)."""
    model = accelerator.unwrap_model(model)
    was_training = model.training
    model.eval()
    mine = range(accelerator.process_index, len(windows), accelerator.num_processes)
    most = len(range(0, len(windows), accelerator.num_processes))  # process 0's share, the largest
    total = torch.zeros(2, dtype=torch.float64, device=accelerator.device)
    for start in range(0, most, batch_size):  # as many forwards on every process: a sharded one gathers in each
        rows = mine[start : start + batch_size]
        batch = windows[rows or range(1)].to(accelerator.device)  # out of windows: one more, counted 0 times
        with accelerator.autocast():
            loss = model(batch, labels=batch, use_cache=False).loss
        predicted = (batch.numel() - batch.shape[0]) if rows else 0  # every token but each window's first
        total += torch.tensor([loss.double().item() * predicted, predicted], dtype=torch.float64, device=total.device)
    total = accelerator.reduce(total, reduction="sum")
    model.train(was_training)
    return (total[0] / total[1]).item()


# Options that fix the model, the data order or the meaning of a checkpoint's data position.
_RESUME_MUST_MATCH = (
    "dataset",
    "seq_len",
    "tokenizer",
    "vocab_size",
    "model_name_or_path",
    "model_type",
    "model_config",
    "seed",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "packing",
    "stateful",
    "repeat_passage_probability",
    "shuffle_repeated_passages",
    "fsdp",
)


# Options that define the learning-rate schedule: a resume may change them only with --allow_schedule_change.
_SCHEDULE = ("max_steps", "warmup_steps", "min_lr_ratio", "learning_rate", "recurrence_learning_rate")


def _schedule_lr(options: dict, step: int) -> float:
    """The base learning rate at ``step`` under the warmup + cosine schedule of ``options`` (a run's settings)."""
    warmup = min(options["warmup_steps"], options["max_steps"])
    return options["learning_rate"] * lr_lambda(step, warmup, options["max_steps"], options["min_lr_ratio"])


def _check_schedule_matches(saved: dict, current: dict, output_dir: Path, allow_change: bool) -> None:
    """Raise ValueError, saying what would change, when a resume changes the schedule without
    ``--allow_schedule_change``."""
    changed = [key for key in _SCHEDULE if key in saved and saved[key] != current[key]]
    if not changed or allow_change:
        return
    step = int(newest_checkpoint(output_dir).name.split("-")[-1])
    what = ", ".join(f"{key} {saved[key]!r} -> {current[key]!r}" for key in changed)
    raise ValueError(
        f"--resume changes the learning-rate schedule of the run in {output_dir} ({what}): at its step {step} the "
        f"rate would go from {_schedule_lr(saved, step):.3g} to {_schedule_lr(current, step):.3g} and follow the "
        f"new warmup + cosine from there; pass --allow_schedule_change to do that, or resume with the saved values"
    )


def _check_resume_matches(config: TrainConfig, output_dir: Path, num_processes: int) -> None:
    """Raise ValueError when a resumed run differs from the saved run in an option that must match, or in its
    learning-rate schedule without ``allow_schedule_change``."""
    path = output_dir / "train_config.json"
    if not path.is_file():
        return  # load_checkpoint reports the missing checkpoint
    saved = json.loads(path.read_text(encoding="utf-8"))
    current = {**config.to_dict(), "num_processes": num_processes}
    for key in (*_RESUME_MUST_MATCH, "num_processes"):
        if key in saved and saved[key] != current[key]:
            why = "the checkpoint's model and data order depend on it"
            if config.stateful and key in ("per_device_train_batch_size", "num_processes"):
                why = "a stateful run carries one state per batch row, per_device_train_batch_size x num_processes rows"
            raise ValueError(
                f"--resume: {key} is {current[key]!r} but the run in {output_dir} used {saved[key]!r} ({why})"
            )
    _check_schedule_matches(saved, current, output_dir, config.allow_schedule_change)


def train(config: TrainConfig, on_step_end: Callable[[int], None] | None = None) -> TrainResult:
    """Run the training described by ``config``; ``on_step_end(step)`` is called after each step (tests).

    Raises ValueError / FileNotFoundError / NotImplementedError for bad options before training starts,
    :class:`~ssmhub.training.checkpoint.CheckpointError` for a checkpoint that cannot be resumed, and
    :class:`~ssmhub.training.model_card.HubPushError` when the push fails after the local save.
    """
    with _single_process_group(config):
        setup, progress = _prepare(config)
        _run_loop(setup, progress, on_step_end)
        return _finish(setup, progress)


@contextlib.contextmanager
def _single_process_group(config: TrainConfig) -> Iterator[None]:
    """With ``fsdp`` in a process that no launcher started: a process group of one for the run (FSDP2 needs one;
    torchrun's and accelerate's workers have theirs), removed at its end."""
    alone = config.fsdp and not dist.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) == 1
    if alone:
        backend = "nccl" if torch.cuda.is_available() and not config.cpu else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        if alone and dist.is_initialized():  # accelerator.end_training() may have removed it
            dist.destroy_process_group()


@dataclass
class _TrainingSetup:
    """What the loop works with, built once by :func:`_prepare` (model, optimizer and loader are prepared
    by Accelerate; the scheduler is not, but is registered for checkpointing)."""

    config: TrainConfig
    accelerator: Any  # accelerate.Accelerator
    output_dir: Path
    tokenizer: Any
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    batches: Any  # WindowBatches or StatefulBatches: each micro-batch's model inputs, and their checkpoint state
    valid_windows: Any  # ssmhub.data.TokenWindows
    logger: MetricsLogger

    @property
    def tokens_per_step(self) -> int:
        """Tokens in one optimizer step: per-device batch x processes x accumulation steps x seq_len."""
        config = self.config
        batch = config.per_device_train_batch_size * self.accelerator.num_processes
        return batch * config.gradient_accumulation_steps * config.seq_len


@dataclass
class _Progress:
    """Where the run stands; ``step``, ``epoch`` and ``position`` are what a checkpoint records."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0  # epoch of the last batch read
    position: int = 0  # batches of that epoch read so far (on each process)
    train_loss: float | None = None  # of the last step
    eval_loss: float | None = None  # of the last evaluation
    started: float = 0.0  # time.perf_counter() when this session's loop began (``elapsed_s`` counts from it)


@dataclass
class _StepOutcome:
    """What one optimizer step reports."""

    loss: float  # mean over its micro-batches and the processes
    lr: float  # the learning rate it used
    epoch: int  # where its last micro-batch came from
    position: int


def _prepare(config: TrainConfig) -> tuple[_TrainingSetup, _Progress]:
    """Check the options, start Accelerate, get the tokenizer and windows, build model, optimizer and data
    loader, and resume (or start) the run; steps 1-4 of the module docstring, in that order.

    A start that fails leaves ``output_dir`` as it found it (:func:`_nothing_left_on_failure`); a fresh
    run replaces an overwritten run's checkpoints only once everything before the first step has worked.
    """
    output_dir, model_config = _check_before_reading_data(config)
    accelerator = _start_accelerator(config, output_dir)
    if config.resume:  # before any data is read: a resumed run's batch shape, model and data order must match
        _check_resume_matches(config, output_dir, accelerator.num_processes)
    with _nothing_left_on_failure(output_dir, accelerator.is_main_process):
        parts = _build_training_parts(config, accelerator, output_dir, model_config)
        base_lrs = list(parts["scheduler"].base_lrs)  # this run's settings; a resume loads the saved run's
        progress = _resume_point(config, accelerator, output_dir, parts)
        if config.resume and config.allow_schedule_change:
            _follow_schedule(parts["scheduler"], base_lrs)
        _install_staged_tokenizer(config, accelerator, output_dir)
    logger = _start_records(config, accelerator, output_dir, resume_step=progress.step if config.resume else None)
    setup = _TrainingSetup(config=config, accelerator=accelerator, output_dir=output_dir, logger=logger, **parts)
    return setup, progress


def _build_training_parts(config: TrainConfig, accelerator, output_dir: Path, model_config) -> dict[str, Any]:
    """The tokenizer, windows, model, optimizer, scheduler, sampler and loader of the run (model, optimizer
    and loader prepared by Accelerate; the scheduler is not, as Accelerate would step it once per process,
    but it is checkpointed)."""
    train_source = corpus_source(config.dataset, "train", config.data_dir)  # files resolved, not read
    valid_source = corpus_source(config.dataset, "validation", config.data_dir)
    tokenizer = _shared_tokenizer(config, accelerator, output_dir, train_source)
    layout = "documents" if config.stateful else "packed" if config.packing else "windows"
    with accelerator.main_process_first():  # the main process tokenizes into the cache, the others then load
        train_data, valid_windows = build_windows(
            tokenizer,
            train_source,
            valid_source,
            config.seq_len,
            config.max_eval_windows,
            cache_dir=config.cache_dir,
            num_proc=config.preprocessing_num_workers or None,
            train_layout=layout,
        )
    fit_to_tokenizer(model_config, config, tokenizer)
    model, optimizer, scheduler = _build_model_and_optimizer(config, model_config, accelerator)
    if config.stateful:
        if not config.fsdp:  # sharded already (the optimizer holds the shards): Accelerate would wrap it in DDP
            model, optimizer = accelerator.prepare(model, optimizer)
        batches = _stateful_batches(config, accelerator, train_data, model)
    else:
        model, optimizer, batches = _window_batches(config, accelerator, train_data, model, optimizer)
    accelerator.register_for_checkpointing(scheduler)
    return {
        "tokenizer": tokenizer,
        "model": model,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "batches": batches,
        "valid_windows": valid_windows,
    }


def _window_batches(config: TrainConfig, accelerator, train_windows, model, optimizer):
    """Model, optimizer and :class:`~ssmhub.training.batches.WindowBatches` prepared by Accelerate: a DataLoader
    over (plain or packed) windows in the seeded order of :class:`EpochShuffleSampler`, each process its share."""
    sampler = EpochShuffleSampler(len(train_windows), config.seed)
    collate = getattr(train_windows, "collate", None)  # packed windows: their documents' sizes, on the host
    loader = DataLoader(
        train_windows,
        batch_size=config.per_device_train_batch_size,
        sampler=sampler,
        drop_last=True,
        collate_fn=collate,
    )
    if config.fsdp:  # sharded already (the optimizer holds the shards): Accelerate would wrap the model in DDP
        loader = accelerator.prepare(loader)
    else:
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if len(loader) == 0:
        raise ValueError(
            f"{len(train_windows)} train windows are too few for a global batch of "
            f"{config.per_device_train_batch_size} x {accelerator.num_processes} processes"
        )
    repeats = (config.repeat_passage_probability, config.seed, config.shuffle_repeated_passages)
    return model, optimizer, WindowBatches(loader, sampler, *repeats)


def _stateful_batches(config: TrainConfig, accelerator, stream, model):
    """:class:`~ssmhub.training.stateful.StatefulBatches` of this process: rows ``p*b:(p+1)*b`` of the
    ``b x num_processes`` rows that read the train documents (every process knows every row's place)."""
    from .stateful import DocumentStreams, StatefulBatches

    rows_here = config.per_device_train_batch_size
    streams = DocumentStreams(stream, rows_here * accelerator.num_processes, config.seq_len, config.seed)
    mine = slice(accelerator.process_index * rows_here, (accelerator.process_index + 1) * rows_here)
    num_layers = accelerator.unwrap_model(model).config.num_hidden_layers
    return StatefulBatches(streams, mine, num_layers, accelerator.device)


@contextlib.contextmanager
def _nothing_left_on_failure(output_dir: Path, is_main_process: bool) -> Iterator[None]:
    """On an exception in the block, the main process removes what appeared in ``output_dir`` during it
    (the folder itself, if it did not exist before), so that a refused run writes nothing."""
    before = set(output_dir.iterdir()) if output_dir.is_dir() else None
    try:
        yield
    except BaseException:
        if is_main_process:
            created = [output_dir] if before is None else sorted(set(output_dir.iterdir()) - before)
            for path in created:
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        raise


def _check_before_reading_data(config: TrainConfig) -> tuple[Path, Any]:
    """Raise for an option that cannot work, before any data is read or anything written; returns the
    output folder and the model config (:func:`_model_config_alone`: the tokenizer's fields come later)."""
    config.validate()
    check_data_dir(config.data_dir)
    model_config = _model_config_alone(config)
    if config.stateful:
        check_stateful_model(
            model_config,
            "the model",
            "train it without --stateful (or with --packing)",
            'set a sliding window in --model_config (e.g. {"attention_window": SEQ_LEN}: each token attends to its '
            'last W tokens) or drop the attention layers ("attention_layers": [])',
        )
    if config.tokenizer and not Path(config.tokenizer).exists():
        raise FileNotFoundError(f"tokenizer {config.tokenizer} does not exist")
    if config.model_name_or_path and not config.tokenizer:
        _saved_model_tokenizer(config.model_name_or_path)
    output_dir = Path(config.output_dir)
    check_output_dir(output_dir, "--output_dir")
    if config.resume and not list_checkpoints(output_dir):  # bad input (exit 2); a damaged one is CheckpointError
        raise FileNotFoundError(
            f"--resume: no checkpoint in {checkpoints_dir(output_dir)} (run without --resume to start from scratch)"
        )
    if config.resume:
        newest_checkpoint(output_dir)  # raises CheckpointError when the newest one is unmarked
    elif not config.overwrite_output_dir:
        _check_output_dir_is_free(output_dir)
    if config.push_to_hub:
        check_hub_access(config.hub_model_id)
    return output_dir, model_config


def _check_output_dir_is_free(output_dir: Path) -> None:
    """Raise ValueError when a fresh run would write over files in ``output_dir`` (a saved model, an
    earlier run's checkpoints or metrics): a run never silently replaces work."""
    found = sorted(p.name for p in output_dir.iterdir()) if output_dir.is_dir() else []
    if found:
        shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
        raise ValueError(
            f"--output_dir {output_dir} is not empty ({shown}): pass --resume to continue the run there, "
            "--overwrite_output_dir to replace it, or give another --output_dir"
        )


def _start_accelerator(config: TrainConfig, output_dir: Path):
    """The run's ``Accelerator`` (its trackers checked to be installed), with every RNG seeded by ``seed``."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    accelerator = Accelerator(
        mixed_precision="no" if config.fsdp else config.mixed_precision,  # FSDP2's policy casts, not autocast
        cpu=config.cpu,
        log_with=config.report_to or None,
        project_dir=str(output_dir),
        dynamo_plugin=_dynamo_plugin(config),
    )
    active = {str(getattr(tracker, "value", tracker)) for tracker in accelerator.log_with}
    missing = [name for name in config.report_to if name != "all" and name not in active]
    if missing:
        raise ValueError(f"report_to: tracker {missing[0]!r} is not installed (installed trackers: {sorted(active)})")
    if config.mixed_precision != "no" and not config.fsdp and not accelerator.native_amp:
        accelerator.print(
            f"warning: mixed_precision={config.mixed_precision} has no effect on {accelerator.device} "
            "(Accelerate enables no autocast there); training in fp32"
        )
    set_seed(config.seed)
    return accelerator


def _dynamo_plugin(config: TrainConfig):
    """``--compile``: Accelerate compiles the prepared model whole (``fullgraph=True``: a graph break is an error,
    not a silent slowdown); a sharded model is compiled by :func:`_shard`, which Accelerate does not prepare."""
    from accelerate.utils import TorchDynamoPlugin

    if not config.compile or config.fsdp:
        return None
    return TorchDynamoPlugin(backend=config.compile_backend, fullgraph=True)


def _shared_tokenizer(config: TrainConfig, accelerator, output_dir: Path, train_source):
    """The run's tokenizer, the same on every process: trained (streaming over the train documents) or
    loaded from ``config.tokenizer`` once, on the main process, and shared through a folder of
    ``output_dir``; a resumed run reuses the one saved in ``output_dir/checkpoints/tokenizer``.

    A new tokenizer is saved under ``output_dir/.tmp-tokenizer`` until the start of the run has worked
    (:func:`_install_staged_tokenizer`), so a refused run leaves no tokenizer and an overwritten run's
    checkpoints are still there.
    """
    from ..tokenization import resolve_tokenizer

    saved = output_dir / "checkpoints" / TOKENIZER_SUBDIR
    if config.resume and saved.is_dir():
        return resolve_tokenizer(saved)
    staged = output_dir / STAGED_TOKENIZER
    if accelerator.is_main_process:
        shutil.rmtree(staged, ignore_errors=True)
        _load_or_train_tokenizer(config, iter_documents(train_source)).save_pretrained(staged)
    accelerator.wait_for_everyone()
    return resolve_tokenizer(staged)


def _install_staged_tokenizer(config: TrainConfig, accelerator, output_dir: Path) -> None:
    """Once the run's start has worked: move a tokenizer staged by :func:`_shared_tokenizer` to
    ``output_dir/checkpoints/tokenizer``; a fresh run first removes the checkpoints of the run it overwrites."""
    staged = output_dir / STAGED_TOKENIZER
    if accelerator.is_main_process and staged.is_dir():
        checkpoints = output_dir / "checkpoints"
        if not config.resume:
            shutil.rmtree(checkpoints, ignore_errors=True)
        checkpoints.mkdir(parents=True, exist_ok=True)
        staged.rename(checkpoints / TOKENIZER_SUBDIR)
    accelerator.wait_for_everyone()


def _build_model_and_optimizer(config: TrainConfig, model_config, accelerator):
    """The model (initialized from ``seed``, or loaded from ``model_name_or_path``; with ``fsdp``, sharded), AdamW
    over its parameter groups and the warmup + cosine schedule."""
    from accelerate.utils import set_seed
    from transformers import AutoModelForCausalLM

    set_seed(config.seed)
    if config.model_name_or_path:  # float32 weights whatever dtype they were saved in: autocast does the rest
        model = AutoModelForCausalLM.from_pretrained(
            config.model_name_or_path, config=model_config, dtype=torch.float32
        )
    else:
        model = AutoModelForCausalLM.from_config(model_config)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if config.fsdp:
        model = _shard(config, accelerator, model)
    optimizer = torch.optim.AdamW(
        param_groups(model, config.weight_decay, config.learning_rate, config.recurrence_learning_rate),
        lr=config.learning_rate,
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_epsilon,
    )
    warmup = min(config.warmup_steps, config.max_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_lambda(step, warmup, config.max_steps, config.min_lr_ratio)
    )
    return model, optimizer, scheduler


def _shard(config: TrainConfig, accelerator, model: torch.nn.Module) -> torch.nn.Module:
    """``model`` on the run's device, sharded over its processes by :func:`ssmhub.training.fsdp.shard_model` (per
    block, the recurrence in float32), with a bf16 policy when ``mixed_precision`` is bf16."""
    from torch.distributed.device_mesh import init_device_mesh

    from .fsdp import BF16_POLICY, shard_model

    mesh = init_device_mesh(accelerator.device.type, (accelerator.num_processes,))
    policy = BF16_POLICY if config.mixed_precision == "bf16" else None
    model = shard_model(model.to(accelerator.device), mesh=mesh, mp_policy=policy)
    return torch.compile(model, backend=config.compile_backend, fullgraph=True) if config.compile else model


def _resume_point(config: TrainConfig, accelerator, output_dir: Path, parts: dict[str, Any]) -> _Progress:
    """Step 0 of a fresh run; with ``resume``, the newest checkpoint's, after restoring it into ``accelerator``
    (model, optimizer, scheduler, RNG states; a sharded run's shards) and ``parts["batches"]`` (the data position; a
    stateful run's carried states and every row's place in its document)."""
    if not config.resume:
        return _Progress()
    path, state = load_checkpoint(accelerator, output_dir)
    batches = parts["batches"]
    if config.fsdp:
        _load_shards(path, parts["model"], parts["optimizer"])
    if config.stateful:
        if "streams" not in state:
            raise CheckpointError(f"checkpoint {path} was not written by a stateful run (no document streams in it)")
        batches.load(path, accelerator.process_index, state["streams"])
    else:
        batches.start(state["epoch"], state["position"])
    accelerator.print(f"resumed from {path} at step {state['step']}")
    return _Progress(step=state["step"], epoch=state["epoch"], position=state["position"])


def _load_shards(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """This process's model and optimizer shards from checkpoint ``path`` (:data:`SHARDS_SUBDIR`)."""
    from .fsdp import load_sharded_checkpoint

    if not (path / SHARDS_SUBDIR).is_dir():
        raise CheckpointError(f"checkpoint {path} was not written by an fsdp run (no {SHARDS_SUBDIR} folder in it)")
    try:
        load_sharded_checkpoint(str(path / SHARDS_SUBDIR), model, optimizer)
    except Exception as err:  # a file that passed the checksum can still fail to load
        raise CheckpointError(f"checkpoint {path} could not be loaded: {type(err).__name__}: {err}") from err


def _follow_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR, base_lrs: list[float]) -> None:
    """After a resume with ``allow_schedule_change``: this run's base rates, and its schedule (the scheduler's
    lambda is this run's, only its step comes from the checkpoint) from the restored step on."""
    scheduler.base_lrs = list(base_lrs)
    for group, base, factor in zip(scheduler.optimizer.param_groups, base_lrs, scheduler.lr_lambdas):
        group["initial_lr"], group["lr"] = base, base * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]


def _start_records(config: TrainConfig, accelerator, output_dir: Path, resume_step: int | None) -> MetricsLogger:
    """Write ``train_config.json`` (what a resumed run is checked against), start the trackers and the
    metrics files (a resumed run keeps the records up to ``resume_step``)."""
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        saved = {**config.to_dict(), "num_processes": accelerator.num_processes}
        write_json_atomic(output_dir / "train_config.json", saved)
    accelerator.init_trackers("ssmhub-train", config={k: str(v) for k, v in config.to_dict().items()})
    return MetricsLogger(accelerator, output_dir, resume_step=resume_step)


def _run_loop(setup: _TrainingSetup, progress: _Progress, on_step_end: Callable[[int], None] | None) -> None:
    """Take optimizer steps from ``progress`` to ``max_steps``, logging each (metrics files, trackers, a
    tqdm bar), evaluating and checkpointing on their schedules; ``progress`` is updated in place."""
    from tqdm.auto import tqdm

    config = setup.config
    hidden = not setup.accelerator.is_local_main_process
    bar = tqdm(total=config.max_steps, initial=progress.step, desc="training", disable=hidden)
    progress.started = time.perf_counter()
    recent: list[float] = []  # train losses since the bar last showed one
    setup.model.train()
    while progress.step < config.max_steps:
        outcome = _train_step(setup)
        progress.step += 1
        progress.epoch, progress.position, progress.train_loss = outcome.epoch, outcome.position, outcome.loss
        recent.append(outcome.loss)
        _log_metrics(setup, progress, "train", outcome.loss, outcome.lr)
        if progress.step % config.logging_steps == 0 or progress.step == config.max_steps:
            bar.set_postfix(loss=f"{sum(recent) / len(recent):.4f}", lr=f"{outcome.lr:.2e}")
            recent = []
        bar.update(1)
        _evaluate_and_checkpoint(setup, progress)
        if on_step_end is not None:
            on_step_end(progress.step)
    bar.close()


def _train_step(setup: _TrainingSetup) -> _StepOutcome:
    """One optimizer step over ``gradient_accumulation_steps`` micro-batches drawn from ``setup.batches``
    (gradients synchronized across processes on the last one only), clipped to ``max_grad_norm``; the
    scheduler steps with the optimizer.

    A micro-batch's loss is its predicted tokens' summed loss over their mean count per process
    (``num_items_in_batch``), so that processes whose rows predict different numbers of tokens (packed and
    stateful rows skip each document's first token) give the loss of the global batch, as one process would.
    """
    config, accelerator, model = setup.config, setup.accelerator, setup.model
    micro_losses = []
    for micro in range(config.gradient_accumulation_steps):
        inputs = setup.batches.next_inputs()
        predicted = accelerator.reduce(count_targets(inputs).to(accelerator.device), reduction="sum")
        per_process = predicted.double().clamp(min=1) / accelerator.num_processes
        last = micro == config.gradient_accumulation_steps - 1
        with contextlib.nullcontext() if last else accelerator.no_sync(model):
            loss = model(**{"use_cache": False, **inputs}, num_items_in_batch=per_process).loss
            accelerator.backward(loss / config.gradient_accumulation_steps)
        setup.batches.truncate()
        micro_losses.append(loss.detach().float())
    if config.max_grad_norm > 0 and config.fsdp:
        from .fsdp import clip_grad_norm_

        clip_grad_norm_(model.parameters(), config.max_grad_norm)
    elif config.max_grad_norm > 0:
        accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
    lr = setup.scheduler.get_last_lr()[0]
    setup.optimizer.step()
    setup.scheduler.step()
    setup.optimizer.zero_grad(set_to_none=True)
    step_loss = accelerator.reduce(torch.stack(micro_losses).mean(), reduction="mean").item()
    data = setup.batches.state()
    return _StepOutcome(step_loss, lr, data["epoch"], data["position"])


def _evaluate_and_checkpoint(setup: _TrainingSetup, progress: _Progress) -> None:
    """After a step: evaluate every ``eval_steps`` and at the last step, checkpoint every ``save_steps``."""
    config, step = setup.config, progress.step
    if (config.eval_steps and step % config.eval_steps == 0) or step == config.max_steps:
        loss = evaluate(setup.accelerator, setup.model, setup.valid_windows, config.per_device_eval_batch_size)
        progress.eval_loss = loss
        _log_metrics(setup, progress, "validation", progress.eval_loss)
    if config.save_steps and step % config.save_steps == 0:
        accelerator, batches = setup.accelerator, setup.batches
        write = _process_files_writer(setup)
        save_checkpoint(accelerator, setup.output_dir, step, batches.state(), config.save_total_limit, write)


def _process_files_writer(setup: _TrainingSetup) -> Callable[[Path], None] | None:
    """What each process adds to a checkpoint folder beside ``accelerator.save_state``'s files: a stateful run's
    carried states of its rows, a sharded run's model and optimizer shards (every process writes its own; a sharded
    stateful run, both)."""
    writers = []
    if setup.config.stateful:
        writers.append(lambda folder: setup.batches.save(folder, setup.accelerator.process_index))
    if setup.config.fsdp:
        from .fsdp import save_sharded_checkpoint

        def write_shards(folder: Path) -> None:
            save_sharded_checkpoint(str(folder / SHARDS_SUBDIR), setup.model, setup.optimizer)

        writers.append(write_shards)

    def write_all(folder: Path) -> None:
        for write in writers:
            write(folder)

    return write_all if writers else None


def _log_metrics(setup: _TrainingSetup, progress: _Progress, split: str, loss: float, lr: float | None = None) -> None:
    """Log one record of ``split`` ("train" or "validation") at the current step."""
    setup.logger.log(
        {
            "step": progress.step,
            "split": split,
            "loss": loss,
            "perplexity": perplexity(loss, 1),  # loss: mean NLL per token
            "lr": lr,
            "tokens_seen": progress.step * setup.tokens_per_step,
            "epoch": progress.epoch,
            "elapsed_s": time.perf_counter() - progress.started,
        }
    )


def _finish(setup: _TrainingSetup, progress: _Progress) -> TrainResult:
    """Save the model folder (main process), end the trackers, print a summary and push to the Hub if asked
    (after the local save, so a failed push leaves a complete folder)."""
    config, accelerator, output_dir = setup.config, setup.accelerator, setup.output_dir
    tokens_seen = progress.step * setup.tokens_per_step
    accelerator.wait_for_everyone()
    model = _gathered_model(setup)  # every process takes part when sharded
    if accelerator.is_main_process:
        metrics = final_metrics(progress.train_loss, progress.eval_loss)
        _save_model_folder(setup, model, progress.step, tokens_seen, metrics)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    result = TrainResult(output_dir, progress.step, tokens_seen, progress.train_loss, progress.eval_loss)
    metrics = final_metrics(progress.train_loss, progress.eval_loss)
    summary = "".join(f"; {name} {value:.4f}" for name, value in metrics.items())  # none when no step ran here
    accelerator.print(f"trained {progress.step} steps ({tokens_seen:,} tokens){summary}; saved to {output_dir}")
    if config.push_to_hub and accelerator.is_main_process:
        result.hub_url = push_folder_to_hub(output_dir, config.hub_model_id, private=config.hub_private)
        accelerator.print(f"pushed to {result.hub_url}")
    return result


def _gathered_model(setup: _TrainingSetup) -> torch.nn.Module | None:
    """The trained model, whole, on the main process (None elsewhere): a sharded one's full weights gathered into a
    plain copy (:func:`ssmhub.training.fsdp.unsharded_copy`, every process must call it), else the unwrapped one."""
    if setup.config.fsdp:
        from .fsdp import unsharded_copy

        return unsharded_copy(setup.model)
    return setup.accelerator.unwrap_model(setup.model)


def _save_model_folder(setup: _TrainingSetup, model, steps: int, tokens_seen: int, metrics: dict) -> None:
    """``model``, tokenizer, loss plot and model card into ``output_dir``."""
    config, output_dir = setup.config, setup.output_dir
    model.save_pretrained(output_dir, save_code=config.save_code)
    setup.tokenizer.save_pretrained(output_dir)
    plot_losses(MetricsLogger.read(output_dir), output_dir / "loss.png")
    write_model_card(
        output_dir,
        model_type=config.model_type,
        model_config=model.config.to_diff_dict(),
        train_config=config.to_dict(),
        steps=steps,
        tokens_seen=tokens_seen,
        metrics=metrics,
        repo_id=config.hub_model_id if config.push_to_hub else None,
        with_code=config.save_code,
    )
