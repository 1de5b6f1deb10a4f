"""Last-token accuracy as an ``evaluate`` module: each row is scored at its last supervised position.

For tasks labelled at every prefix (regular languages, ``ssmhub-regular``) the full-sequence answer is
the label at the last position not equal to -100; rows may differ in length. The math:
``ssmhub.metrics.functional.last_token_accuracy``.
"""

import datasets
import evaluate

from ssmhub.metrics.functional import last_token_accuracy

_DESCRIPTION = __doc__
_KWARGS_DESCRIPTION = """
Args:
    predictions: per row, the predicted class at every position.
    references: per row, the label at every position (-100: not supervised); every row has one label.
Returns:
    last_token_accuracy.
Example:
    >>> metric = evaluate.load("src/ssmhub/metrics/last_token_accuracy")
    >>> metric.compute(predictions=[[1, 2, 3], [0, 4]], references=[[1, 2, -100], [-100, 5]])
    {'last_token_accuracy': 0.5}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class LastTokenAccuracy(evaluate.Metric):
    """Accuracy of each row's full-sequence answer."""

    def _info(self):
        sequence = datasets.Sequence(datasets.Value("int64"))
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": sequence, "references": sequence}),
        )

    def _compute(self, predictions, references):
        if any(len(p) != len(r) for p, r in zip(predictions, references)):
            raise ValueError("predictions and references must have rows of equal lengths")
        width = max((len(row) for row in references), default=0)
        padded_predictions = [list(row) + [0] * (width - len(row)) for row in predictions]
        padded_references = [list(row) + [-100] * (width - len(row)) for row in references]
        return {"last_token_accuracy": last_token_accuracy(padded_predictions, padded_references)}
