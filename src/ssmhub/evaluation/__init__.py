"""Evaluation of causal language models: sliding-window and stateful (whole-document) perplexity, and the
``ssmhub-eval`` CLI."""

from .perplexity import PerplexityResult, evaluate_perplexity, sliding_windows
from .stateful import POSITION_BUCKETS, StatefulPerplexityResult, evaluate_perplexity_stateful

__all__ = [
    "POSITION_BUCKETS",
    "PerplexityResult",
    "StatefulPerplexityResult",
    "evaluate_perplexity",
    "evaluate_perplexity_stateful",
    "sliding_windows",
]
