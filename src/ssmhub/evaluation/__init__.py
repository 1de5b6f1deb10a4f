"""Evaluation of causal language models: sliding-window perplexity and the ``ssmhub-eval`` CLI."""

from .perplexity import PerplexityResult, evaluate_perplexity, sliding_windows

__all__ = ["PerplexityResult", "evaluate_perplexity", "sliding_windows"]
