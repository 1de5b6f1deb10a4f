"""TrainConfig: files, flags, overrides and the errors for unknown or bad options."""

from __future__ import annotations

import json

import pytest

from ssmhub.training.config import TrainConfig, config_from_args, load_config_file


def test_defaults_and_flags():
    config = config_from_args(
        ["--seq_len", "64", "--model_config", '{"hidden_size": 32}', "--cpu", "--report_to", "tensorboard,wandb"]
    )
    assert config.seq_len == 64 and config.model_config == {"hidden_size": 32} and config.cpu is True
    assert config.report_to == ["tensorboard", "wandb"]
    assert config.model_type == "dlr" and config.max_steps == TrainConfig().max_steps


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_file_then_flags_override(tmp_path, suffix):
    values = {"seq_len": 32, "max_steps": 7, "model_config": {"hidden_size": 8, "num_hidden_layers": 1}}
    path = tmp_path / f"run{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(values))
    else:
        import yaml

        path.write_text(yaml.safe_dump(values))
    config = config_from_args(["--config", str(path), "--max_steps", "9"])
    assert config.seq_len == 32 and config.max_steps == 9
    assert config.model_config == {"hidden_size": 8, "num_hidden_layers": 1}


def test_unknown_key_in_file_names_it_and_lists_valid(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"seq_len": 32, "sequence_length": 64}))
    with pytest.raises(ValueError, match=r"unknown option 'sequence_length'.*valid options are: .*seq_len"):
        load_config_file(path)


def test_unknown_flag_names_it():
    with pytest.raises(ValueError, match=r"unknown command-line argument '--lr'.*--learning_rate"):
        config_from_args(["--lr", "0.1"])


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"seq_len": 0}, "seq_len must be a positive integer"),
        ({"mixed_precision": "fp8"}, "mixed_precision must be one of"),
        ({"push_to_hub": True}, "push_to_hub needs hub_model_id"),
        ({"save_steps": -1}, "save_steps must be a non-negative"),
        ({"repeat_passage_probability": 1.5}, "repeat_passage_probability must be in"),
        ({"repeat_passage_probability": 0.5, "packing": True}, "repeat_passage_probability applies to plain windows"),
        ({"shuffle_repeated_passages": True}, "shuffle_repeated_passages needs repeat_passage_probability"),
    ],
)
def test_bad_values(values, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_dict(values)
