"""What every command-line tool shares (ssmhub.command_line, ssmhub.preflight): one-line errors with exit
status 2, the one check of --model_config keys, both flag spellings, no abbreviations."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import ssmhub.evaluation.cli as eval_cli
import ssmhub.training.cli as train_cli
import ssmhub.training.regular as regular
import ssmhub.training.synthetic as synthetic
from ssmhub.training.config import build_arg_parser

ENTRY_POINTS = {  # prog -> (main, arguments a run needs besides the ones tested)
    "ssmhub-train": (train_cli.main, ["--max_steps", "1", "--cpu"]),
    "ssmhub-eval": (eval_cli.main, ["some-model", "--dataset", "wikitext-2"]),
    "ssmhub-regular": (regular.main, ["--steps", "1", "--test_sequences", "4"]),
    "ssmhub-synthetic": (synthetic.main, ["--seq_len", "16", "--max_steps", "1", "--device", "cpu"]),
}
PARSERS = {
    "ssmhub-train": build_arg_parser,
    "ssmhub-eval": eval_cli.build_parser,
    "ssmhub-regular": regular._parser,
    "ssmhub-synthetic": synthetic._parser,
}


def run_main(prog: str, args: list[str], capsys) -> str:
    """Run an entry point in-process, expecting a refusal: returns its one stderr line (exit status 2)."""
    main, needed = ENTRY_POINTS[prog]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main([*needed, *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{prog}: error: ") and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("prog", "model_config", "message"),
    [
        ("ssmhub-train", '{"num_hidden_layer": 1}', "did you mean 'num_hidden_layers'?"),
        ("ssmhub-regular", '{"num_hidden_layer": 1}', "did you mean 'num_hidden_layers'?"),
        ("ssmhub-synthetic", '{"state_sise": 4}', "did you mean 'state_size'?"),
        ("ssmhub-synthetic", '{"zzz": 4}', "valid keys: "),
    ],
)
def test_every_entry_point_refuses_an_unknown_model_config_key_by_name(prog, model_config, message, capsys, tmp_path):
    key = next(iter(json.loads(model_config)))
    output = ["--output_dir", str(tmp_path / "run")] if prog == "ssmhub-train" else []
    err = run_main(prog, [*output, "--model_config", model_config], capsys)
    assert f"--model_config key {key!r} is not a field of the" in err and message in err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_ssmhub_eval_takes_no_model_config(capsys):
    """ssmhub-eval loads a saved model: a --model_config there is an unrecognized argument, not ignored."""
    err = run_main("ssmhub-eval", ["--model_config", '{"num_hidden_layer": 1}'], capsys)
    assert "unrecognized arguments: --model_config" in err


@pytest.mark.parametrize("prog", ["ssmhub-train", "ssmhub-regular", "ssmhub-synthetic"])
def test_an_unknown_model_type_is_a_short_line_naming_the_families(prog, capsys, tmp_path):
    err = run_main(prog, ["--model_type", "foo"], capsys)
    assert "--model_type 'foo' is not a registered model type" in err
    assert "bdlrnn, dlr, h3, serpent" in err and "any transformers model_type" in err and len(err) < 400


@pytest.mark.parametrize("prog", ["ssmhub-train", "ssmhub-regular", "ssmhub-synthetic"])
def test_a_model_config_value_of_the_wrong_type_is_one_line(prog, capsys, tmp_path):
    output = ["--output_dir", str(tmp_path / "run")] if prog == "ssmhub-train" else []
    err = run_main(prog, [*output, "--model_config", '{"state_size": "abc"}', "--model_type", "dlr"], capsys)
    assert "--model_config does not fit the 'dlr' config" in err and "state_size" in err


@pytest.mark.parametrize("prog", list(ENTRY_POINTS))
def test_argparse_errors_are_one_line_with_a_pointer_to_help(prog, capsys):
    message = "unknown command-line argument '--bogus_flag'" if prog == "ssmhub-train" else "unrecognized arguments"
    err = run_main(prog, ["--bogus_flag", "1"], capsys)
    assert message in err and "usage:" not in err


@pytest.mark.parametrize("prog", ["ssmhub-eval", "ssmhub-regular", "ssmhub-synthetic"])
def test_a_bad_flag_value_is_one_line_naming_the_flag(prog, capsys):
    flag = {"ssmhub-eval": "--max_length", "ssmhub-regular": "--steps", "ssmhub-synthetic": "--max_steps"}[prog]
    err = run_main(prog, [flag, "many"], capsys)
    assert f"argument {flag}: invalid int value: 'many' (see {prog} --help)" in err


def test_a_missing_required_argument_is_one_line(capsys):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        eval_cli.main([])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    required = "the following arguments are required: model, --dataset"
    assert err == f"ssmhub-eval: error: {required} (see ssmhub-eval --help)\n"


@pytest.mark.parametrize(
    ("prog", "underscore", "dashes", "value"),
    [
        ("ssmhub-train", "--data_dir", "--data-dir", "/d"),
        ("ssmhub-train", "--per_device_train_batch_size", "--per-device-train-batch-size", "3"),
        ("ssmhub-eval", "--max_documents", "--max-documents", "3"),
        ("ssmhub-eval", "--batch_size", "--batch-size", "3"),
        ("ssmhub-regular", "--test_length", "--test-length", "61"),
        ("ssmhub-synthetic", "--num_kv_pairs", "--num-kv-pairs", "3"),
        ("ssmhub-synthetic", "--no-random_non_queries", "--no-random-non-queries", None),
    ],
)
def test_both_flag_spellings_mean_the_same(prog, underscore, dashes, value):
    extra = ["model", "--dataset", "pg19"] if prog == "ssmhub-eval" else []
    values = [] if value is None else [value]
    parse = PARSERS[prog]().parse_args
    assert parse([*extra, underscore, *values]) == parse([*extra, dashes, *values])
    if value is not None:
        assert parse([*extra, f"{dashes}={value}"]) == parse([*extra, underscore, value])


@pytest.mark.parametrize("prog", list(PARSERS))
def test_help_shows_the_underscore_spelling_only(prog):
    shown = set(re.findall(r"--[\w-]+", PARSERS[prog]().format_help()))
    dashed = {flag for flag in shown if "-" in flag[2:] and not flag.startswith("--no-")}
    assert not dashed, f"{prog} --help shows {sorted(dashed)}"


def test_flags_are_never_abbreviated(capsys):
    err = run_main("ssmhub-eval", ["--max_len", "64"], capsys)
    assert "unrecognized arguments: --max_len" in err


def test_a_real_process_fails_in_one_line(tmp_path):
    """The console entry point as a user runs it: exit status 2, one line on stderr, no traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "ssmhub.training.synthetic", "--model_config", '{"state_sise": 4}'],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "did you mean 'state_size'?" in done.stderr, done.stderr
    assert done.stdout == "" and list(tmp_path.iterdir()) == []
