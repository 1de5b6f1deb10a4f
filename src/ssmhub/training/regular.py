"""Train any ssmhub family on a regular-language task and measure length extrapolation (``ssmhub-regular``).

The protocol of Fan, Chi & Rudnicky (arXiv:2309.07412, §4.1-4.2, Table 1 and the Table 2 caption). The paper
gives only the lengths, the 40,000 updates and the best-test-accuracy metric; the optimizer and the evaluation
schedule below are those of the authors' code (github.com/tinghanf/RegluarLRNN):

- online training: a fresh batch of i.i.d. sequences at the training length every step (Sum and
  EvenPair 40, ModArith 39), cross-entropy over every supervised position, Adam at a constant
  learning rate with L2 weight decay (the authors' code: 1e-4 / 0 for Sum, 2e-4 / 0 for EvenPair,
  2e-4 / 1e-4 for ModArith), no warmup, schedule or clipping;
- every ``eval_steps``, last-position accuracy on a batch of 128 sequences at the test length (500,
  499 for ModArith); the run keeps the best weights and stops once that accuracy reaches
  ``1 - 1e-5`` (the paper reports the best such accuracy: :attr:`RegularResult.best_eval_accuracy`);
- then the kept weights are scored on a fixed, seeded test set of ``test_sequences`` sequences at the
  test length: accuracy on the last token (:attr:`RegularResult.test_accuracy`) and, since every
  position's label is the answer for the prefix ending there, accuracy per prefix-length bucket.

The paper's budget is 40,000 steps, hours per run on a CPU. With ``checkpoint`` set, the run saves everything it
needs to go on (weights, optimizer, data-generator state, best weights so far) at every evaluation, and a later call
with the same settings resumes there: the training is that of an uninterrupted run (the same batches and random
draws; losses to float32 round-off), and the budget ``steps`` may be raised between calls (the earlier budget's last
step is then one extra evaluation, unless it was a multiple of ``eval_steps``). The loop and its one-file
checkpoints are :mod:`ssmhub.training.online`'s, shared with ``ssmhub-synthetic``.

``matmul_precision`` is ``torch.set_float32_matmul_precision`` for the run: the authors' ``"high"``
(TF32 on CUDA; plain float32 on CPU) by default. On a CPU with AVX512-BF16, ``"medium"`` lets oneDNN
split each float32 matmul into bfloat16 passes, faster at close to float32 accuracy
(:func:`ssmhub.ops.precision.float32_matmul_precision`).

Every family goes through ``AutoModelForTokenClassification`` with the same data, budget and network
around its mixer (the code's: no residual around the last layer, a ReLU MLP head of width
``hidden_size``, torch.nn's default init; :func:`build_model`), so families compare on identical terms.
"""

from __future__ import annotations

import copy
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..command_line import CommandLineParser, json_object
from ..data.regular import IGNORE_INDEX, TASK_NAMES, fixed_test_set, get_task
from ..fileio import write_json_atomic
from ..metrics.functional import last_token_accuracy  # the metric's one implementation; imported from here too
from ..ops.precision import MATMUL_PRECISIONS, float32_matmul_precision
from ..preflight import check_model_config_keys, check_output_file, make_model_config, model_config_class
from .online import OnlineRun, new_progress, train_online
from .run_state import load_run_state

__all__ = [
    "LENGTH_BUCKETS",
    "RegularResult",
    "RegularRunConfig",
    "bucket_accuracy",
    "float32_matmul_precision",
    "length_buckets",
    "main",
    "run_regular",
]

# The authors' optimizer settings per task (from their code; the paper gives none): (learning rate, weight decay).
TASK_OPTIMIZER = {"sum": (1e-4, 0.0), "even_pair": (2e-4, 0.0), "mod_arith": (2e-4, 1e-4)}
# The paper's model per task (§4.4): 1 layer of width 64 (3 layers for ModArith), blocks of 8.
TASK_LAYERS = {"mod_arith": 3}
# Prefix-length buckets of the per-prefix accuracy (length_buckets): 1-40, the training lengths (39 for
# ModArith), then every 100 up to the test length, whatever it is; the last bucket ends at it.
FIRST_BUCKET_END = 40
BUCKET_WIDTH = 100
# --model_config keys the run sets itself from --task (they would clash with the task's data).
_SET_BY_THE_TASK = {"vocab_size": "--task", "num_labels": "--task"}
# Settings that may differ between a run and the run that resumes its checkpoint: the budget, where
# the checkpoint lives, and the final test set (used only after training).
RESUMABLE_CHANGES = ("steps", "checkpoint", "test_sequences", "test_seed")


@dataclass
class RegularRunConfig:
    """One training run; ``None`` fields take the task's defaults from the paper and its code."""

    task: str = "sum"
    modulus: int = 5
    model_type: str = "bdlrnn"
    model_config: dict[str, Any] = field(default_factory=dict)  # overrides of the family config
    steps: int = 40_000
    batch_size: int = 128
    learning_rate: float | None = None
    weight_decay: float | None = None
    eval_steps: int = 1000
    eval_batch_size: int = 128
    test_sequences: int = 2000
    train_length: int | None = None
    test_length: int | None = None
    target_accuracy: float = 1 - 1e-5
    seed: int = 0
    test_seed: int = 1234
    matmul_precision: str = "high"  # torch.set_float32_matmul_precision during the run
    checkpoint: str | None = None  # file to save the run's progress to at every evaluation, and resume from

    def validate(self) -> None:
        if self.task not in TASK_NAMES:
            raise ValueError(f"task must be one of {TASK_NAMES}; got {self.task!r}")
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise ValueError(f"matmul_precision must be one of {MATMUL_PRECISIONS}; got {self.matmul_precision!r}")
        for name in ("steps", "batch_size", "eval_steps", "eval_batch_size", "test_sequences"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        for name in ("train_length", "test_length"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        if self.learning_rate is not None and self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be positive; got {self.learning_rate}")
        check_model_config_keys(model_config_class_of(self), self.model_config, set_by=_SET_BY_THE_TASK)
        check_output_file(self.checkpoint, "--checkpoint", example="run.pt")


@dataclass
class RegularResult:
    """What a run measured (accuracies are fractions in [0, 1])."""

    task: str
    model_type: str
    seed: int
    train_length: int
    test_length: int
    steps: int  # optimizer steps taken (fewer than the budget after an early stop)
    best_step: int  # step of the kept weights
    best_eval_accuracy: float  # the paper's metric: best last-token accuracy of the periodic evaluations
    test_accuracy: float  # last-token accuracy of the kept weights on the fixed test set
    bucket_accuracy: dict[str, float]  # "41-100" -> accuracy of the answers for prefixes of those lengths
    final_train_loss: float
    num_parameters: int
    wall_s: float
    config: dict[str, Any]


def model_config_class_of(config: RegularRunConfig) -> type:
    """The config class of ``config.model_type``, which must have a token-classification model (ValueError)."""
    from transformers import AutoModelForTokenClassification

    return model_config_class(config.model_type, AutoModelForTokenClassification, "a token-classification model")


def build_model_config(config: RegularRunConfig, task):
    """The family config of :func:`build_model`: the authors' network, then ``config.model_config``, then the
    task's vocabulary and classes. Raises ValueError (one line) for a value the family's config rejects."""
    defaults = {
        "hidden_size": 64,
        "num_hidden_layers": TASK_LAYERS.get(config.task, 1),
        "classifier_intermediate_size": 64,
        "last_layer_residual": False,
        "init_scheme": "pytorch",
        "use_cache": False,
    }
    fields = {**defaults, **config.model_config, "vocab_size": task.vocab_size, "num_labels": task.num_classes}
    return make_model_config(model_config_class_of(config), fields)


def build_model(config: RegularRunConfig, task):
    """The family's token classifier shaped like the authors' network (their code's ``*MultiBlock`` classes):
    width 64, the paper's depth (§4.4), no residual around the last layer, the ReLU MLP head, torch.nn's default
    init.

    The last two matter for length extrapolation: the shared stack's defaults (a residual on every layer,
    N(0, 0.02) init) fit the training length but extrapolate worse (benchmarks/results/regular_languages.md,
    "Ablation: the network around the mixer" and "Earlier runs in the shared stack's network").
    """
    from transformers import AutoModelForTokenClassification

    return AutoModelForTokenClassification.from_config(build_model_config(config, task))


@torch.no_grad()
def _predictions(model, input_ids: torch.Tensor, batch_size: int = 250) -> torch.Tensor:
    """Argmax label of every position, (N, L), in chunks of ``batch_size`` sequences."""
    was_training = model.training
    model.eval()
    out = torch.cat(
        [model(input_ids[i : i + batch_size]).logits.argmax(-1) for i in range(0, len(input_ids), batch_size)]
    )
    model.train(was_training)
    return out


def length_buckets(length: int) -> list[tuple[int, int]]:
    """The prefix-length buckets ``(low, high)`` (both included) that cover ``1..length`` with no gap:
    ``1-40``, ``41-100``, then one every 100, the last one ending at ``length``.

    Example: ``length_buckets(1000)`` is ``[(1, 40), (41, 100), (101, 200), ..., (901, 1000)]`` and
    ``length_buckets(60)`` is ``[(1, 40), (41, 60)]``. Raises ValueError for a ``length`` below 1.
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be a positive integer; got {length!r}")
    ends = [end for end in (FIRST_BUCKET_END, *range(BUCKET_WIDTH, length, BUCKET_WIDTH)) if end < length]
    ends.append(length)
    return list(zip([1, *(end + 1 for end in ends[:-1])], ends))


# The buckets at the paper's test length, 500.
LENGTH_BUCKETS = tuple(length_buckets(500))


def bucket_accuracy(predictions: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Accuracy of the per-prefix answers grouped by prefix length (position t answers length t + 1).

    Args:
        predictions, labels: (N, L) class ids; ``labels`` is :data:`IGNORE_INDEX` where a position is not
            supervised.

    Returns:
        ``"low-high"`` -> accuracy over the supervised positions whose prefix length is in that bucket of
        :func:`length_buckets` ``(L)`` (a bucket without one is left out).
    """
    length = labels.shape[1]
    prefix_length = torch.arange(1, length + 1)
    result = {}
    for low, high in length_buckets(length):
        in_bucket = (prefix_length >= low) & (prefix_length <= high)
        supervised = (labels != IGNORE_INDEX) & in_bucket
        if supervised.any():
            result[f"{low}-{high}"] = (predictions[supervised] == labels[supervised]).float().mean().item()
    return result


def run_regular(config: RegularRunConfig, log=print) -> RegularResult:
    """Train and evaluate one run (see the module docstring); deterministic given ``config.seed``.

    With ``config.checkpoint`` set and the file present, the run resumes from it (same settings
    required, except those in :data:`RESUMABLE_CHANGES`) and ends as an uninterrupted run would (losses to
    float32 round-off).
    """
    config.validate()
    task = get_task(config.task, config.modulus)
    train_length = config.train_length or task.train_length
    test_length = config.test_length or task.test_length
    default_lr, default_wd = TASK_OPTIMIZER.get(config.task, (2e-4, 0.0))
    lr = config.learning_rate if config.learning_rate is not None else default_lr
    weight_decay = config.weight_decay if config.weight_decay is not None else default_wd
    # Checked now so that a bad length or model config value fails before training (ModArith needs odd lengths).
    task.sample(1, train_length, torch.Generator().manual_seed(0))
    build_model_config(config, task)
    eval_set = fixed_test_set(task, config.eval_batch_size, test_length, seed=config.test_seed + 1)
    test_ids, test_labels = fixed_test_set(task, config.test_sequences, test_length, seed=config.test_seed)
    resume = config.checkpoint is not None and Path(config.checkpoint).exists()
    saved = load_run_state(config.checkpoint, asdict(config), RESUMABLE_CHANGES) if resume else None

    started = time.perf_counter()
    torch.manual_seed(config.seed)
    model = build_model(config, task)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    data = torch.Generator().manual_seed(config.seed)
    # the best periodic accuracy, its step and weights, and whether it reached the target (the run is then over)
    progress = new_progress(best_accuracy=-1.0, best_step=0, best_state=None, reached_target=False)
    run = OnlineRun(model, optimizer, data, asdict(config), config.checkpoint, progress, started)
    if saved is not None:
        run.resume(saved)
        log(f"resuming from {config.checkpoint} after step {run.progress['step']}")
    with float32_matmul_precision(config.matmul_precision):
        if not run.progress["reached_target"]:
            train_online(
                run,
                lambda generator: _loss(model, *task.sample(config.batch_size, train_length, generator)),
                config.steps,
                evaluate=_evaluator(run, eval_set, config.target_accuracy, log),
                eval_every=config.eval_steps,
                checkpoint_every=config.eval_steps,
            )
        model.load_state_dict(run.progress["best_state"])
        predictions = _predictions(model, test_ids)
    return RegularResult(
        task=config.task,
        model_type=config.model_type,
        seed=config.seed,
        train_length=train_length,
        test_length=test_length,
        steps=run.progress["step"],
        best_step=run.progress["best_step"],
        best_eval_accuracy=run.progress["best_accuracy"],
        test_accuracy=last_token_accuracy(predictions, test_labels),
        bucket_accuracy=bucket_accuracy(predictions, test_labels),
        final_train_loss=run.progress["loss"],
        num_parameters=sum(p.numel() for p in model.parameters()),
        wall_s=run.wall_s(),
        config={**asdict(config), "learning_rate": lr, "weight_decay": weight_decay},
    )


def _loss(model, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The training loss of a batch: cross entropy over every supervised position."""
    return model(input_ids, labels=labels).loss


def _evaluator(run: OnlineRun, eval_set: tuple[torch.Tensor, torch.Tensor], target_accuracy: float, log):
    """The periodic evaluation of :func:`run_regular`: last-token accuracy on ``eval_set`` ``(ids, labels)``; keeps
    the best weights in ``run.progress``, logs, and returns whether the accuracy reached ``target_accuracy``."""
    eval_ids, eval_labels = eval_set

    def evaluate(step: int) -> bool:
        progress = run.progress
        accuracy = last_token_accuracy(_predictions(run.model, eval_ids), eval_labels)
        if accuracy > progress["best_accuracy"]:
            progress |= {"best_accuracy": accuracy, "best_step": step}
            progress["best_state"] = copy.deepcopy(run.model.state_dict())
        progress["reached_target"] = accuracy >= target_accuracy
        length = eval_ids.shape[1]
        log(f"step {step}: loss {progress['loss']:.4f}, last-token accuracy at {length}: {accuracy:.4f}")
        return progress["reached_target"]

    return evaluate


def _parser() -> CommandLineParser:
    parser = CommandLineParser(
        prog="ssmhub-regular",
        description="Train an ssmhub family on a regular-language task; report length-extrapolation accuracy.",
    )
    defaults = RegularRunConfig()
    parser.add_argument("--task", default=defaults.task, choices=TASK_NAMES)
    parser.add_argument("--modulus", type=int, default=defaults.modulus)
    parser.add_argument("--model_type", default=defaults.model_type, help="any registered family, e.g. bdlrnn, dlr")
    parser.add_argument(
        "--model_config", type=json_object, default={}, metavar="JSON", help='overrides, e.g. {"block_size": 4}'
    )
    for name in ("steps", "batch_size", "eval_steps", "eval_batch_size", "test_sequences", "seed", "test_seed"):
        parser.add_argument(f"--{name}", type=int, default=getattr(defaults, name))
    for name in ("train_length", "test_length"):
        parser.add_argument(f"--{name}", type=int, default=None)
    for name in ("learning_rate", "weight_decay"):
        parser.add_argument(f"--{name}", type=float, default=None, help="default: the authors' value for the task")
    parser.add_argument("--matmul_precision", default=defaults.matmul_precision, choices=MATMUL_PRECISIONS)
    parser.add_argument("--checkpoint", help="save progress to this file at every evaluation; resume from it")
    parser.add_argument("--output", help="write the result as JSON to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Console entry point of ``ssmhub-regular``: returns 0, or exits with one error line (status 2) for bad
    input, found before training."""
    parser = _parser()
    args = vars(parser.parse_args(argv))
    output = args.pop("output")
    with parser.bad_input_errors(KeyError):
        check_output_file(output, "--output")
        result = run_regular(RegularRunConfig(**args))
    buckets = ", ".join(f"{k}: {v:.3f}" for k, v in result.bucket_accuracy.items())
    print(
        f"{result.model_type} on {result.task}: test accuracy at length {result.test_length} "
        f"{result.test_accuracy:.4f} (best periodic {result.best_eval_accuracy:.4f} at step {result.best_step}; "
        f"{result.steps} steps, {result.wall_s:.0f} s); by prefix length: {buckets}"
    )
    if output:
        write_json_atomic(output, asdict(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
