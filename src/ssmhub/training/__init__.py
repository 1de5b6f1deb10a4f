"""Training ssmhub language models with Accelerate: config, data, checkpoints, the loop, the CLI, the model card.

``ssmhub-train`` (:func:`ssmhub.training.cli.main`) is the command line; :func:`train` the API::

    from ssmhub.training import TrainConfig, train
    result = train(TrainConfig(output_dir="runs/x", max_steps=100, model_config={"hidden_size": 128}))
"""

from .checkpoint import CheckpointError, list_checkpoints, load_checkpoint, save_checkpoint, verify_checkpoint
from .config import TrainConfig, config_from_args, load_config_file
from .data import DATASETS, build_windows, corpus_source, iter_documents, register_dataset
from .fsdp import load_sharded_checkpoint, save_sharded_checkpoint, shard_model
from .model_card import HubPushError, push_folder_to_hub, render_model_card
from .trainer import EpochShuffleSampler, TrainResult, build_model_config, lr_lambda, train

__all__ = [
    "DATASETS",
    "CheckpointError",
    "EpochShuffleSampler",
    "HubPushError",
    "TrainConfig",
    "TrainResult",
    "build_model_config",
    "build_windows",
    "config_from_args",
    "corpus_source",
    "iter_documents",
    "list_checkpoints",
    "load_checkpoint",
    "load_config_file",
    "load_sharded_checkpoint",
    "lr_lambda",
    "push_folder_to_hub",
    "register_dataset",
    "render_model_card",
    "save_checkpoint",
    "save_sharded_checkpoint",
    "shard_model",
    "train",
    "verify_checkpoint",
]
