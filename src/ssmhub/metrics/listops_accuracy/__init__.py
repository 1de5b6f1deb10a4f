"""The `evaluate` module of the listops_accuracy metric: ``evaluate.load`` of this folder (see ssmhub.metrics)."""
