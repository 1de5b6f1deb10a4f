"""Shared by the benchmarks that score saved language models: ssmhub-eval's own code on a WikiText stream."""

from __future__ import annotations

import contextlib
import io


def score_stream(
    folder: str,
    dataset: str,
    split: str,
    max_length: int,
    stride: int,
    batch_size: int,
    data_dir=None,
    max_documents=None,
):
    """``ssmhub-eval``'s result row for ``folder`` on ``split`` scored as one stream (sliding windows), on CPU;
    ``max_documents``: only the split's first N articles (all where None)."""
    from ssmhub.evaluation.cli import run_evaluation

    argv = [folder, "--dataset", dataset, "--split", split, "--stream", "--device", "cpu"]
    argv += ["--max_length", str(max_length), "--stride", str(stride), "--batch_size", str(batch_size)]
    if data_dir:
        argv += ["--data_dir", data_dir]
    if max_documents is not None:
        argv += ["--max_documents", str(max_documents)]
    with contextlib.redirect_stdout(io.StringIO()):
        return run_evaluation(argv)["results"]
