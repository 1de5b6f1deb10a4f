"""Helpers of the training tests: a tiny synthetic WikiText-2 folder, the flags of a run of seconds, and the
comparison of two training runs that should agree."""

from __future__ import annotations

import math
import random
from pathlib import Path

import torch
from comparisons import MODEL_GRAD_REL, same_values

from ssmhub.training.metrics import MetricsLogger

# Two computations of the same few optimizer steps of a tiny model (a run resumed from a checkpoint against an
# uninterrupted one, two processes against one, accumulated micro-batches against one batch) are not promised the
# same bits (tests/comparisons.py): each step's loss is a forward of the tiny model, whose float32 round-off
# (MODEL_REL, 2e-4 of the largest logit, as a bound; a cross-entropy averaged over the batch keeps a few 1e-6 of
# it in practice) feeds the next step's weights, so the difference grows with the steps. A handful of steps at the
# tests' learning rates stay well within 1e-4 of the loss and of each weight tensor's largest entry. What the
# runs count (steps, epochs, tokens seen, the data order and random draws) stays exact.
TRAINING_REL = 1e-4

# Adam's moments hold gradients (and their squares, which double a gradient's relative round-off): gradients of a
# tiny model computed two ways agree within MODEL_GRAD_REL of the largest entry.
OPTIMIZER_REL = 2 * MODEL_GRAD_REL

WORDS = [
    *"the of and in to a was is for on as by with he at from his an were are which that it".split(),
    "history",
    "river",
    "battle",
    "album",
    "church",
    "season",
    "village",
    "song",
    "king",
    "city",
    "game",
    "war",
]


def write_tiny_wikitext(root: Path, seed: int = 0) -> Path:
    """``root/wikitext-2/wiki.{train,valid,test}.tokens`` with a few articles of random words."""
    rng = random.Random(seed)
    folder = root / "wikitext-2"
    folder.mkdir(parents=True, exist_ok=True)
    for split, articles in (("train", 12), ("valid", 3), ("test", 3)):
        lines = []
        for a in range(articles):
            lines += ["", f" = {split.title()} article {a} = ", ""]
            for _ in range(6):
                lines.append(" " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 40))) + " ")
        (folder / f"wiki.{split}.tokens").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def write_tiny_pg19(root: Path, seed: int = 0) -> Path:
    """``root/pg19/{train,validation}/ID.txt`` (CRLF, official layout) and metadata.csv: a few short books."""
    rng = random.Random(seed)
    metadata = []
    for split, books in (("train", 6), ("validation", 2)):
        folder = root / "pg19" / split
        folder.mkdir(parents=True, exist_ok=True)
        for b in range(books):
            book_id = f"{split[0]}{100 + b}"
            lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 14))) for _ in range(rng.randint(30, 60))]
            (folder / f"{book_id}.txt").write_bytes(("\r\n".join(lines) + "\r\n").encode("utf-8"))
            metadata.append(f"{book_id},Book {book_id},1900,http://www.gutenberg.org/ebooks/{book_id}\n")
    (root / "pg19" / "metadata.csv").write_text("".join(metadata), encoding="utf-8")
    return root


TINY_MODEL = '{"hidden_size": 16, "num_hidden_layers": 1, "state_size": 4}'


def tiny_args(data_dir: Path, output_dir: Path, /, **overrides) -> list[str]:
    """CLI flags of a run of a few seconds; ``overrides`` replace or add flags (value None: a bare flag)."""
    options = {
        "data_dir": str(data_dir),
        "output_dir": str(output_dir),
        "vocab_size": "300",
        "seq_len": "16",
        "model_config": TINY_MODEL,
        "per_device_train_batch_size": "4",
        "max_steps": "6",
        "warmup_steps": "2",
        "learning_rate": "0.01",
        "eval_steps": "3",
        "save_steps": "3",
        "logging_steps": "1",
        "max_eval_windows": "8",
        "cpu": None,
    }
    options.update(overrides)
    args = []
    for key, value in options.items():
        if value is False:
            continue
        args += [f"--{key}"] if value is None or value is True else [f"--{key}", str(value)]
    return args


def losses(output_dir: Path, split: str = "train") -> dict[int, float]:
    """step -> loss of one split in a run's metrics.jsonl."""
    return {r["step"]: r["loss"] for r in MetricsLogger.read(output_dir) if r["split"] == split}


def same_losses(got: dict[int, float], expected: dict[int, float], rel: float = TRAINING_REL, what: str = "") -> None:
    """Two runs logged the same steps (exactly), each step's loss within ``rel`` of the other's (TRAINING_REL)."""
    assert got.keys() == expected.keys(), what
    for step, loss in expected.items():
        assert math.isclose(got[step], loss, rel_tol=rel), f"{what} step {step}: {got[step]!r} vs {loss!r}"


def same_run_state(got: dict, expected: dict, rel: float = TRAINING_REL) -> None:
    """Two one-file run checkpoints (``ssmhub.training.run_state``) of runs that trained the same steps: each weight
    within ``rel`` of its tensor's largest entry, each optimizer moment within OPTIMIZER_REL (counters exactly), the
    data generator's state (bytes) exactly."""
    assert got["model"].keys() == expected["model"].keys()
    for name, tensor in expected["model"].items():
        same_values(got["model"][name], tensor, rel=rel, what=name)
    assert got["optimizer"]["state"].keys() == expected["optimizer"]["state"].keys()
    for key, state in expected["optimizer"]["state"].items():
        assert got["optimizer"]["state"][key].keys() == state.keys(), key
        for name, tensor in state.items():
            if name == "step":  # a count of steps, held in a float tensor: integer values, exact
                assert torch.equal(got["optimizer"]["state"][key][name], tensor), key
            else:
                same_values(got["optimizer"]["state"][key][name], tensor, rel=OPTIMIZER_REL, what=f"{key} {name}")
    same_values(got["data_generator"], expected["data_generator"], what="data_generator")  # a ByteTensor: exact
