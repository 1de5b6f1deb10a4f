"""ssmhub's metrics: their math (:mod:`.functional`, written once) and ``evaluate`` modules shipped with the
package, loadable with no network.

``load_metric("nll_perplexity")`` is ``evaluate.load(metric_path("nll_perplexity"))``; the folders are
``nll_perplexity`` (token and word perplexity from summed NLL), ``top_k_accuracy``, ``last_token_accuracy``
and ``listops_accuracy`` (config ``"subtrees"`` for ListOps-SubTrees). ``evaluate`` is imported only by
:func:`load_metric`, so ssmhub runs without it.
"""

from __future__ import annotations

from pathlib import Path

from .functional import accuracy_counts, last_token_accuracy, perplexity, token_nll, top_k_hit_counts, top_k_ids

__all__ = [
    "METRIC_NAMES",
    "accuracy_counts",
    "last_token_accuracy",
    "load_metric",
    "metric_path",
    "perplexity",
    "token_nll",
    "top_k_hit_counts",
    "top_k_ids",
]

METRIC_NAMES = ("last_token_accuracy", "listops_accuracy", "nll_perplexity", "top_k_accuracy")


def metric_path(name: str) -> str:
    """The folder of the ``evaluate`` module ``name`` (one of :data:`METRIC_NAMES`) inside the package."""
    if name not in METRIC_NAMES:
        raise ValueError(f"name must be one of {METRIC_NAMES}; got {name!r}")
    return str(Path(__file__).resolve().parent / name)


def load_metric(name: str, config_name: str | None = None, **kwargs):
    """``evaluate.load`` of the packaged module ``name``, kept in memory (no cache files); ``kwargs`` go to
    ``evaluate.load`` (``experiment_id``, ``num_process``, ...)."""
    import evaluate  # imported here: ssmhub runs without evaluate

    return evaluate.load(metric_path(name), config_name, keep_in_memory=True, **kwargs)
