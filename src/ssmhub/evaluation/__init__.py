"""Evaluation of causal language models: sliding-window and stateful (whole-document) perplexity, overall and
by position in the document, and the ``ssmhub-eval`` CLI."""

from .perplexity import evaluate_perplexity, sliding_windows
from .scores import POSITION_BUCKETS, PerplexityResult, PositionPerplexityResult
from .stateful import evaluate_perplexity_stateful

__all__ = [
    "POSITION_BUCKETS",
    "PerplexityResult",
    "PositionPerplexityResult",
    "evaluate_perplexity",
    "evaluate_perplexity_stateful",
    "sliding_windows",
]
