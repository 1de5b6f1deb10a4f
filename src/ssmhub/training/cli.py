"""``ssmhub-train``: train an ssmhub language model from a config file and/or flags.

Examples::

    ssmhub-train --dataset wikitext-2 --model_config '{"hidden_size": 256, "num_hidden_layers": 4}' \\
        --max_steps 2000 --output_dir runs/dlr-wt2
    ssmhub-train --config run.yaml --resume
    accelerate launch --multi_gpu --num_processes 2 -m ssmhub.training.cli --config run.yaml --cpu

A bad option, a missing data folder, a damaged checkpoint or a failed push ends the run with a
one-line ``ssmhub-train: error: ...`` on stderr and exit status 2 (bad input) or 1 (checkpoint, push).
"""

from __future__ import annotations

import sys

from .checkpoint import CheckpointError
from .config import config_from_args
from .model_card import HubPushError
from .trainer import train

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), train, and return 0; exit non-zero with one line on errors."""
    try:
        config = config_from_args(argv)
        train(config)
    except (ValueError, FileNotFoundError, NotImplementedError) as err:
        _fail(err, status=2)
    except (CheckpointError, HubPushError) as err:
        _fail(err, status=1)
    return 0


def _fail(err: Exception, status: int) -> None:
    message = " ".join(str(err).split())  # one line
    print(f"ssmhub-train: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(status)


if __name__ == "__main__":
    main()
