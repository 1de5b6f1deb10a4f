"""The `evaluate` module of the nll_perplexity metric: ``evaluate.load`` of this folder (see ssmhub.metrics)."""
