"""``ssmhub-train``: train an ssmhub language model from a config file and/or flags.

Examples::

    ssmhub-train --dataset wikitext-2 --model_config '{"hidden_size": 256, "num_hidden_layers": 4}' \\
        --max_steps 2000 --output_dir runs/dlr-wt2
    ssmhub-train --config run.yaml --resume
    accelerate launch --multi_gpu --num_processes 2 -m ssmhub.training.cli --config run.yaml --cpu
    torchrun --nproc_per_node 2 -m ssmhub.training.cli --config run.yaml --fsdp --mixed_precision bf16  # FSDP2

A bad option, a missing data folder, an output folder that holds another run, a push that could not
work, a damaged checkpoint or a failed push ends the run with a one-line ``ssmhub-train: error: ...`` on
stderr and exit status 2 (bad input, found before anything is written) or 1 (checkpoint, push).
"""

from __future__ import annotations

from .checkpoint import CheckpointError
from .config import build_arg_parser, config_from_args
from .model_card import HubPushError
from .trainer import train

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), train, and return 0; exit with one line on errors:
    status 2 for bad input (found before the first step), 1 for a damaged checkpoint or a failed push."""
    parser = build_arg_parser()
    try:
        with parser.bad_input_errors(NotImplementedError):
            train(config_from_args(argv, parser))
    except (CheckpointError, HubPushError) as err:
        parser.fail(err, status=1)
    return 0


if __name__ == "__main__":
    main()
