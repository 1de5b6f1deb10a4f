"""ssmhub-train --model_name_or_path: training continues from a saved model's weights, config and tokenizer."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from training_helpers import losses, tiny_args
from transformers import AutoModelForCausalLM, AutoTokenizer

from ssmhub.training import TrainConfig
from ssmhub.training.checkpoint_model import load_checkpoint_model
from ssmhub.training.cli import main
from ssmhub.training.model_card import render_model_card


@pytest.fixture(scope="module")
def base_model(tiny_data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("base")
    main(tiny_args(tiny_data_dir, out, save_steps=0))
    return out


def continue_args(data_dir, out, base, **overrides):
    """The flags of a continued run: no model_type, model_config or vocab_size (they come from ``base``)."""
    flags = {"model_name_or_path": base, "model_config": False, "vocab_size": False, **overrides}
    return tiny_args(data_dir, out, **flags)


def test_a_continued_run_starts_from_the_saved_weights(base_model, tiny_data_dir, tmp_path):
    out = tmp_path / "continued"
    main(continue_args(tiny_data_dir, out, base_model, max_steps=1, learning_rate=1e-12, warmup_steps=0))
    base = AutoModelForCausalLM.from_pretrained(base_model).state_dict()
    continued = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert base.keys() == continued.keys()
    for name, weight in base.items():  # one step at lr 1e-12 moves nothing a fresh initialization would not
        torch.testing.assert_close(continued[name], weight, rtol=0, atol=1e-9, msg=name)
    assert AutoTokenizer.from_pretrained(out).get_vocab() == AutoTokenizer.from_pretrained(base_model).get_vocab()
    saved = json.loads((out / "train_config.json").read_text())
    assert saved["model_type"] == "dlr" and saved["model_name_or_path"] == str(base_model)
    assert f"trained with `ssmhub-train` from `{base_model}`" in (out / "README.md").read_text()


def test_a_continued_run_learns_on_from_where_the_base_stopped(base_model, tiny_data_dir, tmp_path):
    fresh, continued = tmp_path / "fresh", tmp_path / "continued"
    main(tiny_args(tiny_data_dir, fresh, max_steps=3, save_steps=0))
    main(continue_args(tiny_data_dir, continued, base_model, max_steps=3, save_steps=3))
    # the base's 6 steps are already in it: its first loss is 0.71 to 0.76 below a fresh model's (seeds 0-4, 1 or 2
    # threads, AVX2 or not); 0.3 holds on any seed, far above float32 round-off
    assert losses(continued)[1] < losses(fresh)[1] - 0.3
    tokenizer = AutoTokenizer.from_pretrained(continued / "checkpoints" / "tokenizer")
    at_step_3 = load_checkpoint_model(continued / "checkpoints" / "step-3", tokenizer).state_dict()
    main(
        [
            *continue_args(tiny_data_dir, continued, base_model, max_steps=4, save_steps=3),
            "--resume",
            "--allow_schedule_change",
        ]
    )
    assert sorted(losses(continued)) == [1, 2, 3, 4]
    assert at_step_3.keys() == AutoModelForCausalLM.from_pretrained(continued).state_dict().keys()


def test_model_config_overrides_the_saved_config(base_model, tiny_data_dir, tmp_path):
    out = tmp_path / "dropout"
    main(continue_args(tiny_data_dir, out, base_model, max_steps=1, model_config='{"dropout": 0.25}'))
    config = json.loads((out / "config.json").read_text())
    assert config["dropout"] == 0.25 and config["hidden_size"] == 16


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model_type": "h3"}, "--model_type 'h3' does not match --model_name_or_path .* \\(a 'dlr' model\\)"),
        ({"model_config": '{"hiden_size": 8}'}, "model_config key 'hiden_size' is not a field of the 'dlr' config"),
    ],
)
def test_bad_options_for_a_continued_run(base_model, tiny_data_dir, tmp_path, capsys, overrides, message):
    with pytest.raises(SystemExit) as exit_info:
        main(continue_args(tiny_data_dir, tmp_path / "bad", base_model, **overrides))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ssmhub-train: error:") and "\n" not in err and re.search(message, err), err
    assert not (tmp_path / "bad").exists()


def test_a_saved_model_without_tokenizer_or_config_is_refused(base_model, tiny_data_dir, tmp_path, capsys):
    no_tokenizer = tmp_path / "weights-only"
    AutoModelForCausalLM.from_pretrained(base_model).save_pretrained(no_tokenizer)
    with pytest.raises(SystemExit):
        main(continue_args(tiny_data_dir, tmp_path / "bad", no_tokenizer))
    assert "has no tokenizer (tokenizer.json or tokenizer_config.json); pass --tokenizer" in capsys.readouterr().err
    main(continue_args(tiny_data_dir, tmp_path / "ok", no_tokenizer, tokenizer=base_model, max_steps=1))

    with pytest.raises(SystemExit):
        main(continue_args(tiny_data_dir, tmp_path / "bad", tmp_path / "ok" / "checkpoints"))
    assert "no model config could be loaded" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_a_tokenizer_larger_than_the_saved_vocabulary_is_refused(base_model, tiny_data_dir, tmp_path, capsys):
    small = tmp_path / "small"
    shutil.copytree(base_model, small)
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 100}))
    with pytest.raises(SystemExit):
        main(continue_args(tiny_data_dir, tmp_path / "bad", small, tokenizer=base_model))
    assert "the tokenizer has 300 tokens but --model_name_or_path" in capsys.readouterr().err


def test_model_type_defaults_to_dlr_only_without_a_saved_model():
    assert TrainConfig().model_type == "dlr"
    assert TrainConfig(model_name_or_path="org/name").model_type is None


@pytest.mark.parametrize(("where", "metadata"), [("org/name", True), (".", False)])
def test_the_model_card_names_the_base_model(where, metadata):
    card = render_model_card(
        model_type="dlr", model_config={}, train_config={"dataset": "pg19", "model_name_or_path": where},
        steps=1, tokens_seen=16, metrics={},
    )  # fmt: skip
    assert f"from `{where}`" in card and f"the one of `{where}`" in card
    assert ("base_model: org/name\n---" in card) is metadata


@pytest.mark.parametrize("with_code", [True, False])
def test_the_model_card_says_how_to_load_without_ssmhub_only_when_the_code_was_saved(with_code):
    card = render_model_card(
        model_type="dlr", model_config={}, train_config={"dataset": "pg19"}, steps=1, tokens_seen=16, metrics={},
        repo_id="org/name", with_code=with_code,
    )  # fmt: skip
    assert ('from_pretrained("org/name", trust_remote_code=True)' in card) is with_code
    assert ("without `--save_code`" in card) is not with_code
