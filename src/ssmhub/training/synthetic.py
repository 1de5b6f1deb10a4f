"""Train any family on a synthetic task and score it on a fixed held-out set (``ssmhub-synthetic``).

The protocol of the DLR paper for its atomic tasks (arXiv:2212.00768, §3.3 and §A.6): a fresh batch
every step, AdamW at a constant learning rate with no weight decay, no warmup or clipping (over the
backbone's own parameter groups, so a ``recurrence_learning_rate`` in ``model_config`` applies;
``--lr_schedule cosine`` decays every group's rate to 0 at ``max_steps`` instead, so that a short run
ends on a settled model rather than wherever its last constant-rate step left it); the
regression tasks minimize the MSE and are scored by R² (``1 − MSE/Var`` with the batch mean, averaged
over the evaluation batches). The token-recall tasks (MQAR, associative recall, induction head) minimize
the cross entropy at their labelled positions and are scored by accuracy there (Zoology's metric).

Every family goes through ``AutoModel.from_config`` (see :mod:`ssmhub.training.synthetic_models`), and
``model_type="attention"`` is transformers' GPT-2, so families compare on identical data and budget.
A run ends with a one-line JSON row (task, family, L, layers, width, steps, metric, value, wall time,
...) printed and, with ``--results``, appended to a JSON-lines file::

    ssmhub-synthetic --task shift --model_type dlr --seq_len 512 --num_layers 6 --hidden_size 128 \\
        --max_steps 11000 --results runs/synthetic.jsonl

The paper's budgets are hours per run on a CPU. With ``--checkpoint FILE`` the run saves its model, optimizer,
data-generator and RNG states every ``--checkpoint_every`` steps and after its last step (the loop of
:mod:`ssmhub.training.online`, shared with ``ssmhub-regular``), and a later call with the same settings resumes
there, as the run it would have been without the interruption (the same batches and random draws; losses to float32
round-off). ``max_steps`` may grow between calls, so a budget can be raised after looking at a result, or spread over
several sessions.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..command_line import CommandLineParser, json_object
from ..data.synthetic import SYNTHETIC_TASK_NAMES, fixed_eval_set, get_synthetic_task, r2_score
from ..fileio import append_jsonl
from ..metrics.functional import accuracy_counts
from ..ops.precision import MATMUL_PRECISIONS, float32_matmul_precision
from ..preflight import check_device, check_output_file
from .online import OnlineRun, train_online
from .run_state import load_run_state
from .schedule import lr_lambda
from .synthetic_models import (
    ATTENTION_FAMILY,
    SyntheticRegressionModel,
    SyntheticTokenModel,
    backbone_config,
    family_defaults,
)

__all__ = ["RESUMABLE_CHANGES", "SyntheticRunConfig", "default_learning_rate", "main", "run_synthetic", "validate_run"]

LR_SCHEDULES = ("constant", "cosine")
# Settings that may differ between a run and the run that resumes its checkpoint: the budget, where and
# how often it is saved, logging, and the device.
RESUMABLE_CHANGES = ("max_steps", "checkpoint", "checkpoint_every", "log_every", "device")


@dataclass
class SyntheticRunConfig:
    """One run; ``lr=None`` takes :func:`default_learning_rate`."""

    task: str = "shift"
    model_type: str = "dlr"
    seq_len: int = 512
    num_layers: int = 2
    hidden_size: int = 128
    max_steps: int = 1000
    lr: float | None = None
    lr_schedule: str = "constant"  # or "cosine": decay to 0 at max_steps (no warmup)
    weight_decay: float = 0.0
    batch_size: int = 64
    seed: int = 0
    eval_examples: int = 1024
    eval_batch_size: int = 64
    eval_seed: int = 1234
    vocab_size: int = 8192  # token tasks
    num_kv_pairs: int = 8  # MQAR
    power_a: float = 0.01  # MQAR
    random_non_queries: bool = True  # MQAR: random tokens between the queries (Zoology's default), else 0
    model_config: dict[str, Any] = field(default_factory=dict)  # overrides of the family config
    device: str = "auto"
    log_every: int = 0
    matmul_precision: str = "high"  # torch.set_float32_matmul_precision during the run (ops.precision)
    checkpoint: str | None = None  # file to save the run's progress to, and to resume from
    checkpoint_every: int = 100  # steps between checkpoints (and one after the last step)


def default_learning_rate(task_kind: str, model_type: str, seq_len: int) -> float:
    """The paper's Table 7 for the regression tasks (DLR: 5e-5 at L ≤ 2^9, 1e-4 beyond; attention and
    the other families 1e-3); 1e-3 for the token tasks (inside Zoology's sweep)."""
    if task_kind == "regression" and model_type == "dlr":
        return 5e-5 if seq_len <= 512 else 1e-4
    return 1e-3


def validate_run(config: SyntheticRunConfig):
    """Check every argument and build the task and the backbone config (cheap), before any training.

    Returns ``(task, backbone_config, device)``. Raises ValueError naming the bad argument.
    """
    if config.task not in SYNTHETIC_TASK_NAMES:
        raise ValueError(f"task must be one of {list(SYNTHETIC_TASK_NAMES)}, got {config.task!r}")
    positive = ("seq_len", "num_layers", "hidden_size", "max_steps", "batch_size", "eval_examples", "eval_batch_size")
    for name in (*positive, "checkpoint_every"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    for name in ("log_every", "seed", "eval_seed"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if config.seed == config.eval_seed:
        raise ValueError(
            f"seed must differ from eval_seed ({config.eval_seed}): "
            "the held-out set would repeat the first training batch"
        )
    if config.lr is not None and not (
        isinstance(config.lr, (int, float)) and config.lr > 0 and math.isfinite(config.lr)
    ):
        raise ValueError(f"lr must be a positive number, got {config.lr!r}")
    if config.lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {config.lr_schedule!r}")
    if not config.weight_decay >= 0:
        raise ValueError(f"weight_decay must be >= 0, got {config.weight_decay!r}")
    if config.matmul_precision not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul_precision must be one of {MATMUL_PRECISIONS}; got {config.matmul_precision!r}")
    check_output_file(config.checkpoint, "--checkpoint", example="run.pt")
    if config.task in ("mqar", "associative_recall", "induction_head"):
        options = {"vocab_size": config.vocab_size}
        if config.task == "mqar":
            options |= {
                "num_kv_pairs": config.num_kv_pairs,
                "power_a": config.power_a,
                "random_non_queries": config.random_non_queries,
            }
        task = get_synthetic_task(config.task, config.seq_len, **options)
        input_length, vocab = task.seq_len, task.vocab_size
    else:
        task = get_synthetic_task(config.task, config.seq_len)
        input_length, vocab = task.input_length, 1
    model_config = backbone_config(
        config.model_type, config.hidden_size, config.num_layers, input_length, vocab, config.model_config
    )
    return task, model_config, check_device(config.device, "--device")


def _build_model(task, model_config) -> torch.nn.Module:
    if task.kind == "regression":
        return SyntheticRegressionModel(model_config, task.input_dim, task.output_dim, task.output_length)
    return SyntheticTokenModel(model_config, task.num_labels)


def _build_optimizer(model, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over the model's groups: the backbone's own (its recurrence learning rate, no decay on
    recurrences, norms and biases), then the task heads'."""
    return torch.optim.AdamW(model.optimizer_param_groups(weight_decay, lr), lr=lr, weight_decay=weight_decay)


def _step_loss(model, task, batch_size: int, device: torch.device):
    """The loss of a training step on a fresh batch of ``batch_size`` drawn with the generator it is given: the
    MSE for a regression task, the cross entropy at the labelled positions for a token task."""

    def loss(generator: torch.Generator) -> torch.Tensor:
        inputs, targets = task.sample(batch_size, generator)
        inputs, targets = inputs.to(device), targets.to(device)
        if task.kind == "regression":
            return torch.nn.functional.mse_loss(model(inputs), targets)
        return model(inputs, targets)[0]

    return loss


@torch.no_grad()
def evaluate(model, task, inputs, targets, batch_size: int, device: torch.device) -> dict[str, float]:
    """Score ``model`` on a held-out set, ``batch_size`` examples at a time.

    Regression: ``r2`` is the paper's metric, the mean over the evaluation batches of each batch's R²;
    ``r2_pooled`` the R² of the whole set at once; ``mse`` the mean squared error. Token tasks:
    ``accuracy`` over every labelled position of the set.
    """
    was_training = model.training
    model.eval()
    r2s, squared, count, correct, labelled = [], 0.0, 0, 0, 0
    predictions = []
    for start in range(0, len(inputs), batch_size):
        x, y = inputs[start : start + batch_size].to(device), targets[start : start + batch_size].to(device)
        if task.kind == "regression":
            pred = model(x).float()
            r2s.append(r2_score(pred, y))
            squared += float((pred - y).double().pow(2).sum())
            count += y.numel()
            predictions.append(pred.cpu())
        else:
            _, logits = model(x, y)
            hits, scored = accuracy_counts(logits.argmax(-1), y[y != -100])  # logits of the labelled positions
            correct, labelled = correct + hits, labelled + scored
    model.train(was_training)
    if task.kind == "regression":
        return {
            "r2": sum(r2s) / len(r2s),
            "r2_pooled": r2_score(torch.cat(predictions), targets.float()),
            "mse": squared / count,
        }
    return {"accuracy": correct / labelled}


def run_synthetic(config: SyntheticRunConfig, log=print) -> dict[str, Any]:
    """Train and evaluate one run (see the module docstring); returns the results row.

    Deterministic given ``config.seed`` on the CPU. Raises ValueError for bad arguments before any work.
    """
    task, model_config, device = validate_run(config)
    lr = config.lr if config.lr is not None else default_learning_rate(task.kind, config.model_type, config.seq_len)
    saved = _saved_run_state(config)
    started = time.perf_counter()
    eval_inputs, eval_targets = fixed_eval_set(task, config.eval_examples, seed=config.eval_seed)

    torch.manual_seed(config.seed)
    model = _build_model(task, model_config).to(device)
    optimizer = _build_optimizer(model, lr, config.weight_decay)
    data = torch.Generator().manual_seed(config.seed)
    run = OnlineRun(model, optimizer, data, asdict(config), config.checkpoint, started=started)
    if saved is not None:
        run.resume(saved)
        log(f"resuming from {config.checkpoint} after step {run.progress['step']}")
    resumed_from_step = run.progress["step"]
    with float32_matmul_precision(config.matmul_precision):
        train_online(
            run,
            _step_loss(model, task, config.batch_size, device),
            config.max_steps,
            lr_factor=_cosine(config.max_steps) if config.lr_schedule == "cosine" else None,
            log=log,
            log_every=config.log_every,
            checkpoint_every=config.checkpoint_every,
        )
        scores = evaluate(model, task, eval_inputs, eval_targets, config.eval_batch_size, device)
    outcome = {
        "wall_s": run.wall_s(),
        "s_per_step": run.progress["train_s"] / config.max_steps,
        "final_train_loss": run.progress["loss"],
        "resumed_from_step": resumed_from_step,
        "lr": lr,
    }
    return _results_row(config, task, scores, outcome, sum(p.numel() for p in model.parameters()), device)


def _saved_run_state(config: SyntheticRunConfig) -> dict[str, Any] | None:
    """The checkpoint to resume from (checked against ``config``), or None when there is none to resume."""
    if config.checkpoint is None or not Path(config.checkpoint).exists():
        return None
    saved = load_run_state(config.checkpoint, asdict(config), RESUMABLE_CHANGES, asdict(SyntheticRunConfig()))
    if saved["progress"]["step"] > config.max_steps:
        raise ValueError(
            f"max_steps must be at least the {saved['progress']['step']} steps the checkpoint "
            f"{config.checkpoint} has already run, got {config.max_steps}"
        )
    return saved


def _cosine(max_steps: int):
    """The ``--lr_schedule cosine`` factor of a 0-based step: from 1 down to 0 at ``max_steps``, no warmup."""
    return lambda step: lr_lambda(step, 0, max_steps, 0.0)


def _results_row(
    config: SyntheticRunConfig, task, scores: dict, outcome: dict, num_parameters: int, device: torch.device
) -> dict[str, Any]:
    """The results row of a run: what was trained, its scores (``metric`` and ``value`` name the task's
    headline one), ``outcome`` (wall time, time per step, final loss, resumed step, learning rate) and settings."""
    metric = "r2" if task.kind == "regression" else "accuracy"
    input_length = task.input_length if task.kind == "regression" else task.seq_len
    row = {
        "task": config.task,
        "family": config.model_type,
        "L": config.seq_len,
        "input_length": input_length,
        "layers": config.num_layers,
        "width": config.hidden_size,
        "steps": config.max_steps,
        "metric": metric,
        "value": scores[metric],
        **{k: v for k, v in scores.items() if k != metric},
        **outcome,
        "batch_size": config.batch_size,
        "matmul_precision": config.matmul_precision,
        "seed": config.seed,
        "eval_examples": config.eval_examples,
        "num_parameters": num_parameters,
        "device": str(device),
        "model_config": {**family_defaults(config.model_type, input_length), **config.model_config},
    }
    if task.kind == "token":
        row |= {"vocab_size": task.vocab_size}
        if config.task == "mqar":
            row |= {
                "num_kv_pairs": task.num_kv_pairs,
                "power_a": task.power_a,
                "random_non_queries": task.random_non_queries,
            }
    row["config"] = asdict(config)
    return row


def _parser() -> CommandLineParser:
    parser = CommandLineParser(
        prog="ssmhub-synthetic",
        description="Train a family on a synthetic task (the DLR paper's atomic tasks, MQAR, associative recall, "
        "induction head) and report R² or accuracy on a fixed held-out set.",
    )
    d = SyntheticRunConfig()
    parser.add_argument("--task", default=d.task, help=f"one of {', '.join(SYNTHETIC_TASK_NAMES)}")
    parser.add_argument(
        "--model_type",
        default=d.model_type,
        help=f"dlr, h3, serpent, bdlrnn, transformers' mamba (any AutoConfig model_type) or {ATTENTION_FAMILY}",
    )
    parser.add_argument("--seq_len", type=int, default=d.seq_len, help="the task's L (Reverse/Sort inputs are 2L)")
    for name in ("num_layers", "hidden_size", "max_steps", "batch_size", "seed", "eval_examples", "eval_batch_size"):
        parser.add_argument(f"--{name}", type=int, default=getattr(d, name))
    parser.add_argument("--eval_seed", type=int, default=d.eval_seed)
    parser.add_argument("--lr", type=float, default=None, help="default: the paper's Table 7 value (see docs)")
    parser.add_argument(
        "--lr_schedule",
        default=d.lr_schedule,
        choices=LR_SCHEDULES,
        help="constant (the paper's protocol) or cosine (decay to 0 at max_steps)",
    )
    parser.add_argument("--weight_decay", type=float, default=d.weight_decay)
    parser.add_argument("--vocab_size", type=int, default=d.vocab_size, help="token tasks")
    parser.add_argument("--num_kv_pairs", type=int, default=d.num_kv_pairs, help="MQAR")
    parser.add_argument("--power_a", type=float, default=d.power_a, help="MQAR gap power law")
    parser.add_argument(
        "--random_non_queries",
        action=argparse.BooleanOptionalAction,
        default=d.random_non_queries,
        help="MQAR: random tokens between the queries (default) or 0s (--no-random_non_queries)",
    )
    parser.add_argument(
        "--model_config",
        type=json_object,
        default={},
        metavar="JSON",
        help='JSON overrides, e.g. {"state_size": 256, "kernel_type": "prod"}',
    )
    parser.add_argument("--device", default=d.device, help="auto (CUDA when available), cpu or cuda")
    parser.add_argument(
        "--matmul_precision",
        default=d.matmul_precision,
        choices=MATMUL_PRECISIONS,
        help="float32 matmuls: 'medium' runs them as bfloat16 passes on CPUs with AVX512-BF16 (ops.precision)",
    )
    parser.add_argument("--log_every", type=int, default=d.log_every, help="log the loss every N steps (0: never)")
    parser.add_argument("--checkpoint", help="save progress to this file and resume from it (see above)")
    parser.add_argument("--checkpoint_every", type=int, default=d.checkpoint_every, help="steps between saves")
    parser.add_argument("--results", help="append the JSON row to this JSON-lines file")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Console entry point of ``ssmhub-synthetic``: returns 0, or exits with one error line (status 2) for bad
    input, found before training."""
    parser = _parser()
    args = vars(parser.parse_args(argv))
    results = args.pop("results")
    with parser.bad_input_errors():
        check_output_file(results, "--results", example="results.jsonl")
        row = run_synthetic(SyntheticRunConfig(**args), log=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(row, default=str))
    if results:
        append_jsonl(results, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
