"""Top-k accuracy as an ``evaluate`` module: is the reference among the k best-ranked predictions?

A prediction is the ranked candidate ids of one scored position, best first (``logits.topk(k).indices``:
a language model's next token, or a classifier's classes); rows whose reference is -100 are skipped.
Storing k ids per position instead of the logits keeps a language model's evaluation small. The math:
``ssmhub.metrics.functional.top_k_hit_counts``.
"""

import datasets
import evaluate

from ssmhub.metrics.functional import top_k_hit_counts

_DESCRIPTION = __doc__
_KWARGS_DESCRIPTION = """
Args:
    predictions: per scored position, candidate ids best first (at least max(k) of them).
    references: the true id per position (-100: not scored).
    k: an int or a list of ints (default 1 and 5).
Returns:
    top_{k}_accuracy for each k, and num_scored.
Example:
    >>> metric = evaluate.load("src/ssmhub/metrics/top_k_accuracy")
    >>> metric.compute(predictions=[[3, 1], [2, 0]], references=[1, 1], k=[1, 2])
    {'top_1_accuracy': 0.0, 'top_2_accuracy': 0.5, 'num_scored': 2}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class TopKAccuracy(evaluate.Metric):
    """Top-k accuracy from ranked candidate ids."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Sequence(datasets.Value("int64")), "references": datasets.Value("int64")}
            ),
        )

    def _compute(self, predictions, references, k=(1, 5)):
        ks = (k,) if isinstance(k, int) else tuple(k)
        if not predictions:
            return {**{f"top_{n}_accuracy": float("nan") for n in ks}, "num_scored": 0}
        width = min(len(row) for row in predictions)  # rows may carry more candidates than the shortest
        counts = top_k_hit_counts([row[:width] for row in predictions], references, ks)
        scored = sum(1 for reference in references if reference != -100)
        result = {f"top_{n}_accuracy": counts[n] / scored if scored else float("nan") for n in ks}
        result["num_scored"] = scored
        return result
