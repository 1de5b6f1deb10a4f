"""Token and word perplexity from summed negative log-likelihoods, as an ``evaluate`` module.

Each added row is a sum of NLL (nats) and the number of tokens it scores (a document, a window, a batch):
the metric adds them up and takes ``exp(Σ nll / Σ tokens)``, so the result does not depend on how the
text was cut into rows (averaging per-row perplexities would). With ``num_words`` (the evaluated text's
words), also ``exp(Σ nll / num_words)``, PG-19's word-level perplexity. The math: ``ssmhub.metrics.functional``.
"""

import datasets
import evaluate

from ssmhub.metrics.functional import perplexity

_DESCRIPTION = __doc__
_KWARGS_DESCRIPTION = """
Args:
    nll_sums: summed negative log-likelihood (nats) per row.
    num_tokens: scored tokens per row.
    num_words: words of the whole evaluated text (optional), for word perplexity.
Returns:
    nll_per_token, token_perplexity, num_tokens, and word_perplexity when num_words is given.
Example:
    >>> metric = evaluate.load("src/ssmhub/metrics/nll_perplexity")
    >>> metric.compute(nll_sums=[2.0, 4.0], num_tokens=[2, 4])["nll_per_token"]
    1.0
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class NllPerplexity(evaluate.Metric):
    """Perplexity from exact NLL sums (any causal LM, any tokenizer)."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"nll_sums": datasets.Value("float64"), "num_tokens": datasets.Value("int64")}),
        )

    def _compute(self, nll_sums, num_tokens, num_words=None):
        total_nll, total_tokens = float(sum(nll_sums)), int(sum(num_tokens))
        result = {
            "nll_per_token": total_nll / total_tokens if total_tokens else float("nan"),
            "token_perplexity": perplexity(total_nll, total_tokens),
            "num_tokens": total_tokens,
        }
        if num_words is not None:
            result["word_perplexity"] = perplexity(total_nll, num_words)
        return result
