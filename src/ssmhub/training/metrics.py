"""The metrics of an ``ssmhub-train`` run: ``metrics.jsonl``, ``metrics.csv``, Accelerate trackers and a loss plot.

Every record has the fields :data:`METRIC_FIELDS` (``split`` is ``"train"`` or ``"validation"``), one
line per record in both files. A resumed run first keeps the records up to its checkpoint's step and
drops the rest, so the files of a run that crashed and resumed match those of an uninterrupted one.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

from ..fileio import read_jsonl, write_text_atomic

__all__ = ["METRIC_FIELDS", "MetricsLogger", "plot_losses"]

METRIC_FIELDS = ("step", "split", "loss", "perplexity", "lr", "tokens_seen", "epoch", "elapsed_s")


class MetricsLogger:
    """Appends metric records to ``metrics.jsonl`` and ``metrics.csv`` (main process) and Accelerate trackers.

    ``resume_step``: None for a fresh run (the files start empty), else the step of the checkpoint the run
    resumes from (the records after it are dropped).
    """

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
        """Append ``record`` (its :data:`METRIC_FIELDS`; a missing one is None) to the files and the trackers."""
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
