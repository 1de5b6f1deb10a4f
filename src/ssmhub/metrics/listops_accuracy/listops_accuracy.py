"""ListOps accuracy as an ``evaluate`` module: the LRA metric (the expression's value, 10 classes) and,
with the ``subtrees`` configuration, ListOps-SubTrees' token accuracy (arXiv:2212.00768 §3.4, Table 3:
every closing bracket's value; -100 positions are not scored). Pooled over all examples, not averaged
per batch. The math: ``ssmhub.metrics.functional.accuracy_counts``.
"""

import datasets
import evaluate

from ssmhub.metrics.functional import accuracy_counts

_DESCRIPTION = __doc__
_KWARGS_DESCRIPTION = """
Args:
    predictions: the predicted value per expression (default), or per token ("subtrees").
    references: the true value per expression, or per token with -100 where a token has no tag.
Returns:
    accuracy and num_scored.
Example:
    >>> metric = evaluate.load("src/ssmhub/metrics/listops_accuracy")
    >>> metric.compute(predictions=[3, 9], references=[3, 1])
    {'accuracy': 0.5, 'num_scored': 2}
"""

CONFIGS = ("default", "subtrees")


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ListOpsAccuracy(evaluate.Metric):
    """Accuracy of ListOps values (whole expressions, or every sub-tree)."""

    def _info(self):
        if self.config_name not in CONFIGS:
            raise ValueError(f"config_name must be one of {CONFIGS}; got {self.config_name!r}")
        value = datasets.Value("int64")
        feature = datasets.Sequence(value) if self.config_name == "subtrees" else value
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": feature, "references": feature}),
        )

    def _compute(self, predictions, references):
        if self.config_name == "subtrees":
            if any(len(p) != len(r) for p, r in zip(predictions, references)):
                raise ValueError("predictions and references must have rows of equal lengths")
            predictions = [value for row in predictions for value in row]
            references = [value for row in references for value in row]
        correct, scored = accuracy_counts(predictions, references)
        return {"accuracy": correct / scored if scored else float("nan"), "num_scored": scored}
