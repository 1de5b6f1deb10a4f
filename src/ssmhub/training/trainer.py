"""The Accelerate training loop behind ``ssmhub-train``.

:func:`train` runs a :class:`~ssmhub.training.config.TrainConfig`:

1. checks the options that can be checked cheaply (data folder, dataset, model type and config keys,
   seq_len against any length limit the model config declares), before any data is read;
2. trains a BPE on the train documents, streamed (or loads ``tokenizer``), on the main process and
   saves it in ``output_dir/checkpoints/tokenizer`` so every process (and a resumed run) uses the same one;
3. tokenizes both splits into fixed-length windows once, into an on-disk cache that later runs reuse
   (:func:`ssmhub.data.cached_token_windows`; windows are memory-mapped, PG-19 is read book by
   book and its windows never cross a book), builds the model from ``AutoConfig.for_model(model_type, **model_config)``,
   AdamW over ``model.optimizer_param_groups`` (no weight decay on recurrence parameters),
   warmup + cosine schedule, gradient accumulation and clipping, mixed precision;
4. reads the data in an order fixed by ``seed`` and the epoch (:class:`EpochShuffleSampler`), so a
   resumed run and a run on N processes with 1/N of the per-device batch see the same global batches;
5. logs to ``metrics.jsonl``, ``metrics.csv``, Accelerate trackers and a tqdm bar, evaluates every
   ``eval_steps``, checkpoints every ``save_steps`` (see :mod:`.checkpoint`);
6. saves model, tokenizer, model card and a loss plot into ``output_dir``, and pushes it to the Hub
   if asked (after the local save, so a failed push leaves a complete folder).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Sampler

from ..fileio import read_jsonl, write_json_atomic, write_text_atomic
from .checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from .config import TrainConfig
from .data import build_windows, check_data_dir, corpus_source, iter_documents
from .model_card import final_metrics, push_folder_to_hub, write_model_card
from .param_groups import param_groups

__all__ = ["EpochShuffleSampler", "TrainResult", "build_model_config", "lr_lambda", "train"]

# Length limits a model config may declare; seq_len must not exceed any that is set.
_LENGTH_LIMIT_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length", "n_ctx")
TOKENIZER_SUBDIR = "tokenizer"
METRIC_FIELDS = ("step", "split", "loss", "perplexity", "lr", "tokens_seen", "epoch", "elapsed_s")


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


def lr_lambda(step: int, warmup_steps: int, max_steps: int, min_ratio: float) -> float:
    """Linear warmup over ``warmup_steps``, then cosine decay from 1 to ``min_ratio`` at ``max_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_model_config(config: TrainConfig, tokenizer=None):
    """The model config of ``model_type`` with ``model_config``; with a tokenizer, its vocabulary and special ids.

    Raises ValueError for an unknown model type or config key, a seq_len the model cannot take, or a
    tokenizer larger than a forced ``vocab_size``.
    """
    import transformers

    import ssmhub  # noqa: F401  (registers the families with the Auto classes)

    kwargs = dict(config.model_config)
    if tokenizer is not None:
        if "vocab_size" in kwargs and kwargs["vocab_size"] < len(tokenizer):
            raise ValueError(
                f"the tokenizer has {len(tokenizer)} tokens but model_config forces vocab_size={kwargs['vocab_size']}; "
                "raise vocab_size or use a smaller tokenizer"
            )
        kwargs.setdefault("vocab_size", len(tokenizer))
        eos = tokenizer.eos_token_id
        kwargs.setdefault("eos_token_id", eos)
        kwargs.setdefault("bos_token_id", tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos)
        kwargs.setdefault("pad_token_id", tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos)
    try:
        model_config = transformers.AutoConfig.for_model(config.model_type, **kwargs)
    except ValueError as err:
        raise ValueError(f"model_type {config.model_type!r} / model_config {config.model_config}: {err}") from None
    except TypeError as err:
        raise ValueError(
            f"model_config {config.model_config} does not fit model_type {config.model_type!r}: {err}"
        ) from None
    # transformers keeps unknown kwargs as attributes: compare with the fields of a default config instead
    known = set(type(model_config)().to_dict()) | set(getattr(model_config, "attribute_map", {}))
    unknown = [key for key in config.model_config if key not in known]
    if unknown:
        raise ValueError(
            f"model_config key {unknown[0]!r} is not a field of the {config.model_type!r} config; valid keys: "
            f"{', '.join(sorted(known))}"
        )
    for name in _LENGTH_LIMIT_FIELDS:
        limit = getattr(model_config, name, None)
        if isinstance(limit, int) and config.seq_len > limit:
            raise ValueError(f"seq_len {config.seq_len} exceeds the model's {name}={limit}")
    return model_config


def _load_or_train_tokenizer(config: TrainConfig, train_documents: Iterable[str]):
    from ..tokenization import load_tokenizer, train_bpe_tokenizer

    if config.tokenizer:
        tokenizer = load_tokenizer(config.tokenizer)
    else:
        tokenizer = train_bpe_tokenizer(train_documents, vocab_size=config.vocab_size)
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {config.tokenizer} has no eos token (needed to join documents)")
    return tokenizer


class MetricsLogger:
    """Appends metric records to ``metrics.jsonl`` and ``metrics.csv`` (main process) and Accelerate trackers."""

    def __init__(self, accelerator, output_dir: Path, resume_step: int | None):
        self.accelerator = accelerator
        self.jsonl, self.csv = output_dir / "metrics.jsonl", output_dir / "metrics.csv"
        if accelerator.is_main_process:
            kept = [r for r in self.read(output_dir) if resume_step is not None and r["step"] <= resume_step]
            write_text_atomic(self.jsonl, "".join(json.dumps(r) + "\n" for r in kept))
            table = io.StringIO(newline="")
            writer = csv.DictWriter(table, fieldnames=METRIC_FIELDS)
            writer.writeheader()
            writer.writerows(kept)
            write_text_atomic(self.csv, table.getvalue())

    @staticmethod
    def read(output_dir: str | os.PathLike) -> list[dict]:
        """The records of ``output_dir/metrics.jsonl`` (empty if there is none)."""
        return read_jsonl(Path(output_dir) / "metrics.jsonl")  # a torn last line: the run resumes before it

    def log(self, record: dict) -> None:
        record = {key: record.get(key) for key in METRIC_FIELDS}
        if self.accelerator.is_main_process:
            with open(self.jsonl, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            with open(self.csv, "a", newline="", encoding="utf-8") as f:
                csv.DictWriter(f, fieldnames=METRIC_FIELDS).writerow(record)
        split = record["split"]
        values = {f"{split}/{k}": record[k] for k in ("loss", "perplexity", "lr") if record[k] is not None}
        self.accelerator.log(values, step=record["step"])


def plot_losses(records: list[dict], path: Path) -> None:
    """A PNG of train and validation loss against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for split, style in (("train", "-"), ("validation", "o-")):
        points = [(r["step"], r["loss"]) for r in records if r["split"] == split]
        if points:
            ax.plot(*zip(*points), style, label=split)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats / token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@torch.no_grad()
def evaluate(accelerator, model, windows, batch_size: int) -> float:
    """Mean next-token loss over ``windows`` (``windows[indices]`` -> (n, seq_len) ids), shared out across
    processes (exact: sums are reduced)."""
    model = accelerator.unwrap_model(model)
    was_training = model.training
    model.eval()
    mine = range(accelerator.process_index, len(windows), accelerator.num_processes)
    total = torch.zeros(2, dtype=torch.float64, device=accelerator.device)
    for start in range(0, len(mine), batch_size):
        batch = windows[mine[start : start + batch_size]].to(accelerator.device)
        with accelerator.autocast():
            loss = model(batch, labels=batch, use_cache=False).loss
        predicted = batch.numel() - batch.shape[0]  # every token but each window's first
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
    "model_type",
    "model_config",
    "seed",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
)


def _check_resume_matches(config: TrainConfig, output_dir: Path, num_processes: int) -> None:
    """Raise ValueError when a resumed run differs from the saved run in an option that must match."""
    path = output_dir / "train_config.json"
    if not path.is_file():
        return  # load_checkpoint reports the missing checkpoint
    saved = json.loads(path.read_text(encoding="utf-8"))
    current = {**config.to_dict(), "num_processes": num_processes}
    for key in (*_RESUME_MUST_MATCH, "num_processes"):
        if key in saved and saved[key] != current[key]:
            raise ValueError(
                f"--resume: {key} is {current[key]!r} but the run in {output_dir} used {saved[key]!r} "
                "(the checkpoint's model and data order depend on it)"
            )


def _batches(loader: DataLoader, sampler: EpochShuffleSampler, epoch: int, skip: int):
    """Yield ``(epoch, position, batch)`` forever from ``epoch``, skipping its first ``skip`` batches."""
    while True:
        sampler.set_epoch(epoch)
        for position, batch in enumerate(loader, start=1):
            if position > skip:
                yield epoch, position, batch
        epoch, skip = epoch + 1, 0


def train(config: TrainConfig, on_step_end: Callable[[int], None] | None = None) -> TrainResult:
    """Run the training described by ``config``; ``on_step_end(step)`` is called after each step (tests).

    Raises ValueError / FileNotFoundError / NotImplementedError for bad options before training starts,
    :class:`~ssmhub.training.checkpoint.CheckpointError` for a checkpoint that cannot be resumed, and
    :class:`~ssmhub.training.model_card.HubPushError` when the push fails after the local save.
    """
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM

    from ..tokenization import load_tokenizer

    # 1. cheap checks, before any data is read
    config.validate()
    check_data_dir(config.data_dir)
    build_model_config(config)
    if config.tokenizer and not Path(config.tokenizer).exists():
        raise FileNotFoundError(f"tokenizer {config.tokenizer} does not exist")
    output_dir = Path(config.output_dir)
    if not config.resume and list_checkpoints(output_dir) and not config.overwrite_output_dir:
        raise ValueError(
            f"{output_dir} holds checkpoints of an earlier run: pass --resume to continue it, or "
            "--overwrite_output_dir to start again there"
        )

    accelerator = Accelerator(
        mixed_precision=config.mixed_precision,
        cpu=config.cpu,
        log_with=config.report_to or None,
        project_dir=str(output_dir),
    )
    active = {str(getattr(tracker, "value", tracker)) for tracker in accelerator.log_with}
    missing = [name for name in config.report_to if name != "all" and name not in active]
    if missing:
        raise ValueError(f"report_to: tracker {missing[0]!r} is not installed (installed trackers: {sorted(active)})")
    if config.mixed_precision != "no" and not accelerator.native_amp:
        accelerator.print(
            f"warning: mixed_precision={config.mixed_precision} has no effect on {accelerator.device} "
            "(Accelerate enables no autocast there); training in fp32"
        )
    set_seed(config.seed)

    # 2. the splits (files resolved, not read) and the tokenizer (trained once, on the main process,
    #    streaming over the train documents, and shared through the disk)
    train_source = corpus_source(config.dataset, "train", config.data_dir)
    valid_source = corpus_source(config.dataset, "validation", config.data_dir)
    tokenizer_dir = output_dir / "checkpoints" / TOKENIZER_SUBDIR
    if accelerator.is_main_process and not config.resume:
        shutil.rmtree(output_dir / "checkpoints", ignore_errors=True)  # only an overwritten run's
    if accelerator.is_main_process and not (config.resume and tokenizer_dir.is_dir()):
        _load_or_train_tokenizer(config, iter_documents(train_source)).save_pretrained(tokenizer_dir)
    accelerator.wait_for_everyone()
    tokenizer = load_tokenizer(tokenizer_dir)

    # 3. windows (tokenized once into the cache: the main process builds, the others then load),
    #    model, optimizer, schedule
    with accelerator.main_process_first():
        train_windows, valid_windows = build_windows(
            tokenizer,
            train_source,
            valid_source,
            config.seq_len,
            config.max_eval_windows,
            cache_dir=config.cache_dir,
            num_proc=config.preprocessing_num_workers or None,
        )
    model_config = build_model_config(config, tokenizer)
    set_seed(config.seed)
    model = AutoModelForCausalLM.from_config(model_config)
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
    sampler = EpochShuffleSampler(len(train_windows), config.seed)
    loader = DataLoader(train_windows, batch_size=config.per_device_train_batch_size, sampler=sampler, drop_last=True)
    # The scheduler is not prepared (Accelerate would step it once per process) but is checkpointed.
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.register_for_checkpointing(scheduler)
    if len(loader) == 0:
        raise ValueError(
            f"{len(train_windows)} train windows are too few for a global batch of "
            f"{config.per_device_train_batch_size} x {accelerator.num_processes} processes"
        )

    # 4. resume
    step, epoch, position = 0, 0, 0
    if config.resume:
        _check_resume_matches(config, output_dir, accelerator.num_processes)
        path, state = load_checkpoint(accelerator, output_dir)
        step, epoch, position = state["step"], state["epoch"], state["position"]
        accelerator.print(f"resumed from {path} at step {step}")
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        saved = {**config.to_dict(), "num_processes": accelerator.num_processes}
        write_json_atomic(output_dir / "train_config.json", saved)
    accelerator.init_trackers("ssmhub-train", config={k: str(v) for k, v in config.to_dict().items()})
    logger = MetricsLogger(accelerator, output_dir, resume_step=step if config.resume else None)

    tokens_per_step = (
        config.per_device_train_batch_size
        * accelerator.num_processes
        * config.gradient_accumulation_steps
        * config.seq_len
    )
    batches = _batches(loader, sampler, epoch, position)
    progress = tqdm(
        total=config.max_steps, initial=step, desc="training", disable=not accelerator.is_local_main_process
    )
    start_time = time.perf_counter()
    train_loss = eval_loss = None
    recent: list[float] = []
    model.train()

    def record(split: str, loss: float, lr: float | None = None) -> None:
        logger.log(
            {
                "step": step,
                "split": split,
                "loss": loss,
                "perplexity": math.exp(min(loss, 700.0)),
                "lr": lr,
                "tokens_seen": step * tokens_per_step,
                "epoch": epoch,
                "elapsed_s": time.perf_counter() - start_time,
            }
        )

    # 5. the loop: one iteration = one optimizer step over gradient_accumulation_steps micro-batches
    while step < config.max_steps:
        micro_losses = []
        for micro in range(config.gradient_accumulation_steps):
            epoch, position, batch = next(batches)
            last = micro == config.gradient_accumulation_steps - 1
            with contextlib.nullcontext() if last else accelerator.no_sync(model):
                loss = model(batch, labels=batch, use_cache=False).loss
                accelerator.backward(loss / config.gradient_accumulation_steps)
            micro_losses.append(loss.detach().float())
        if config.max_grad_norm > 0:
            accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1

        step_loss = accelerator.reduce(torch.stack(micro_losses).mean(), reduction="mean").item()
        train_loss = step_loss
        recent.append(step_loss)
        record("train", step_loss, lr)
        if step % config.logging_steps == 0 or step == config.max_steps:
            progress.set_postfix(loss=f"{sum(recent) / len(recent):.4f}", lr=f"{lr:.2e}")
            recent = []
        progress.update(1)
        if (config.eval_steps and step % config.eval_steps == 0) or step == config.max_steps:
            eval_loss = evaluate(accelerator, model, valid_windows, config.per_device_eval_batch_size)
            record("validation", eval_loss)
        if config.save_steps and step % config.save_steps == 0:
            save_checkpoint(
                accelerator, output_dir, step, {"epoch": epoch, "position": position}, config.save_total_limit
            )
        if on_step_end is not None:
            on_step_end(step)
    progress.close()

    # 6. save, card, plot, push
    tokens_seen = step * tokens_per_step
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        unwrapped.save_pretrained(output_dir)
        tokenizer.save_pretrained(output_dir)
        plot_losses(MetricsLogger.read(output_dir), output_dir / "loss.png")
        write_model_card(
            output_dir,
            model_type=config.model_type,
            model_config=unwrapped.config.to_diff_dict(),
            train_config=config.to_dict(),
            steps=step,
            tokens_seen=tokens_seen,
            metrics=final_metrics(train_loss, eval_loss),
            repo_id=config.hub_model_id if config.push_to_hub else None,
        )
    accelerator.wait_for_everyone()
    accelerator.end_training()
    result = TrainResult(output_dir, step, tokens_seen, train_loss, eval_loss)
    summary = ", ".join(f"{name} {value:.4f}" for name, value in final_metrics(train_loss, eval_loss).items())
    accelerator.print(f"trained {step} steps ({tokens_seen:,} tokens); {summary}; saved to {output_dir}")
    if config.push_to_hub and accelerator.is_main_process:
        result.hub_url = push_folder_to_hub(output_dir, config.hub_model_id, private=config.hub_private)
        accelerator.print(f"pushed to {result.hub_url}")
    return result
