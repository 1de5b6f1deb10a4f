"""The `evaluate` module of the top_k_accuracy metric: ``evaluate.load`` of this folder (see ssmhub.metrics)."""
