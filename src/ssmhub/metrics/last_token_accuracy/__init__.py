"""The `evaluate` module of the last_token_accuracy metric: ``evaluate.load`` of this folder (see ssmhub.metrics)."""
