"""``ssmhub-eval`` end to end on a tiny saved DLR model, on local WikiText-2 / PG-19 and a mocked Hub."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import datasets
import pytest
import torch

import ssmhub
from ssmhub.data import DATA_DIR_ENV, iter_pg19_books, load_wikitext, pg19_word_count, wikitext_articles
from ssmhub.evaluation.cli import _wikitext_texts, main, run_evaluation
from ssmhub.tokenization import train_bpe_tokenizer

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A linear recurrence reads one token at a time and keeps a fixed-size state.",
    "Books are long; windows never cross from one book into the next.",
] * 20


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny DLR causal LM and a byte-level BPE tokenizer saved in one folder."""
    folder = tmp_path_factory.mktemp("tiny-dlr")
    tokenizer = train_bpe_tokenizer(SENTENCES, vocab_size=300)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = ssmhub.DLRConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, state_size=8)
    ssmhub.DLRForCausalLM(config).save_pretrained(folder)
    return folder


def data_root() -> Path:
    root = os.environ.get(DATA_DIR_ENV)
    if not root:
        pytest.skip(f"${DATA_DIR_ENV} is not set: the offline WikiText-2 / PG-19 copy is needed")
    return Path(root)


def token_count(model_dir: Path, text: str) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(model_dir)(text, add_special_tokens=False)["input_ids"])


def test_wikitext2_validation_articles(model_dir, tmp_path, capsys):
    root = data_root()
    output = tmp_path / "out" / "results.json"
    argv = [
        str(model_dir),
        "--dataset",
        "wikitext-2",
        "--split",
        "validation",
        "--max_length",
        "64",
        "--stride",
        "32",
        "--max-documents",
        "2",
        "--batch-size",
        "4",
        "--data-dir",
        str(root),
        "--output",
        str(output),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "token ppl" in printed and "wikitext-2" in printed
    payload = json.loads(output.read_text())
    results = payload["results"]
    assert payload["protocol"] == "document" and payload["stride"] == 32
    articles = wikitext_articles(load_wikitext("wikitext-2", "validation", root))[:2]
    assert results["num_documents"] == 2
    assert results["num_tokens"] == sum(token_count(model_dir, a) - 1 for a in articles)  # each once
    # words: whitespace tokens + one <eos> per line of the rows before the third article's heading
    rows = load_wikitext("wikitext-2", "validation", root)
    third = rows.index(wikitext_articles(rows)[2].split("\n")[0] + "\n")
    assert results["num_words"] == sum(len(row.split()) + 1 for row in rows[:third])
    assert 1 < results["token_perplexity"] < 1e4
    assert results["word_perplexity"] > results["token_perplexity"]  # more tokens than words
    assert 0 <= results["top1_accuracy"] <= results["top5_accuracy"] <= 1
    assert not list(output.parent.glob("*.tmp"))  # the temporary file was renamed


def test_wikitext2_stream_and_official_word_count(model_dir, tmp_path):
    root = data_root()
    argv = [
        str(model_dir),
        "--dataset",
        "wikitext-2",
        "--max-length",
        "64",
        "--stride",
        "64",
        "--max-documents",
        "1",
        "--stream",
        "--data-dir",
        str(root),
    ]
    results = run_evaluation(argv)["results"]
    article = wikitext_articles(load_wikitext("wikitext-2", "validation", root))[0]
    tokens = token_count(model_dir, article)
    assert results["num_documents"] == 1
    assert results["num_tokens"] == tokens - 1 - (tokens - 1) // 64  # first token of each chunk unscored
    rows = load_wikitext("wikitext-2", "validation", root)
    assert [n for _, n in _wikitext_texts(rows, None, stream=True)] == [217_646]  # the official token count


def test_pg19_validation_one_book(model_dir, tmp_path, capsys):
    root = data_root()
    output = tmp_path / "pg19.json"
    argv = [
        str(model_dir),
        "--dataset",
        "pg19",
        "--split",
        "validation",
        "--max_length",
        "256",
        "--stride",
        "128",
        "--batch-size",
        "16",
        "--max-documents",
        "1",
        "--data-dir",
        str(root),
        "--output",
        str(output),
    ]
    assert main(argv) == 0
    results = json.loads(output.read_text())["results"]
    book = next(iter_pg19_books("validation", root))
    assert results["num_documents"] == 1
    assert results["num_tokens"] == token_count(model_dir, book.text) - 1
    assert results["num_words"] == pg19_word_count(book.text)
    assert "pg19" in capsys.readouterr().out


def test_pg19_from_mocked_hub(model_dir, monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    text = " ".join(SENTENCES[:3])
    rows = [{"short_book_title": "T", "publication_date": 1900, "url": "http://x/ebooks/1", "text": text}] * 3
    monkeypatch.setattr(datasets, "load_dataset", lambda path, split, streaming: iter(rows))
    payload = run_evaluation(
        [str(model_dir), "--dataset", "pg19", "--split", "test", "--max_length", "16", "--max-documents", "2"]
    )
    assert payload["data_source"] == "hub:deepmind/pg19"
    assert payload["stride"] == 8  # default max_length // 2
    assert payload["results"]["num_documents"] == 2
    assert payload["results"]["num_words"] == 2 * len(text.split())


def test_wikitext_from_mocked_hub(model_dir, monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    rows = ["", " = Alpha = \n", "", " Alpha is a letter . \n", "", " = Beta = \n", "", " Beta too . \n"]
    calls = []

    def fake_load_dataset(path, config, split):
        calls.append((path, config, split))
        return {"text": rows}

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    payload = run_evaluation([str(model_dir), "--dataset", "wikitext-2", "--split", "test", "--max_length", "8"])
    assert calls == [("Salesforce/wikitext", "wikitext-2-v1", "test")]
    assert payload["data_source"] == "hub:Salesforce/wikitext"
    assert payload["results"]["num_documents"] == 2
    assert payload["results"]["num_words"] == 14 + len(rows)  # whitespace tokens + one <eos> per line


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--stride", "65"], "stride"),
        (["--stride", "0"], "stride"),
        (["--max_length", "1", "--stride", "1"], "max_length"),
        (["--max-documents", "0"], "--max_documents must be positive"),
        (["--dataset", "wikitext-7"], "invalid choice"),
        (["--split", "train"], "invalid choice"),
        (["--stream", "--dataset", "pg19"], "--stream"),
    ],
)
def test_bad_arguments_fail_before_work(model_dir, tmp_path, capsys, extra, message):
    argv = [str(model_dir), "--dataset", "wikitext-2", "--max_length", "64", "--data-dir", str(tmp_path), *extra]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_folders_are_named(model_dir, tmp_path, capsys):
    cases = [
        ([str(model_dir), "--dataset", "pg19", "--data-dir", str(tmp_path / "nowhere")], "nowhere"),
        ([str(model_dir), "--dataset", "pg19", "--split", "test", "--data-dir", str(tmp_path)], "pg19/test"),
        ([str(model_dir), "--dataset", "wikitext-103", "--data-dir", str(tmp_path)], "wiki.valid.tokens"),
        ([str(tmp_path / "no-model"), "--dataset", "pg19", "--data-dir", str(tmp_path)], "no-model"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err


def copy_without(folder: Path, target: Path, *names: str) -> Path:
    """A copy of ``folder`` without the files ``names``."""
    shutil.copytree(folder, target, ignore=shutil.ignore_patterns(*names))
    return target


def no_work(*_args, **_kwargs):
    raise AssertionError("data or model loaded before the arguments were checked")


def classifier_dir(model_dir: Path, target: Path) -> Path:
    """A DLR sequence classifier saved with the model folder's tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = ssmhub.DLRConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, state_size=4)
    ssmhub.DLRForSequenceClassification(config).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


@pytest.mark.parametrize(
    ("make", "extra", "message"),
    [
        (lambda m, t: copy_without(m, t, "tokenizer*"), [], "has no tokenizer"),
        (lambda m, t: copy_without(m, t, "config.json"), [], "has no config.json"),
        (classifier_dir, [], "is a DLRForSequenceClassification, not a causal language model"),
        (lambda m, t: m / "model.safetensors", [], "is a file; give the folder"),
        (lambda m, t: m, ["--device", "cuda"], "--device cuda: CUDA is not available"),
        (lambda m, t: m, ["--device", "gpu"], "--device must be 'auto', 'cpu', 'cuda' or 'cuda:N'"),
        (lambda m, t: m, ["--tokenizer", "__T__"], "--tokenizer folder"),
        (lambda m, t: m, ["--output", "__T__"], "--output"),
    ],
)
def test_bad_model_folders_and_options_are_one_line_before_any_work(
    model_dir, tmp_path, capsys, monkeypatch, make, extra, message
):
    import ssmhub.evaluation.cli as cli

    monkeypatch.setattr(cli, "_prepare_data", no_work)
    monkeypatch.setattr(cli, "_load_model_and_tokenizer", no_work)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    target = tmp_path / "target"
    model = make(model_dir, target)
    target.mkdir(exist_ok=True)  # an empty folder for --tokenizer / --output
    extra = [str(target) if arg == "__T__" else arg for arg in extra]
    before = sorted(tmp_path.rglob("*"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main([str(model), "--dataset", "wikitext-2", "--data_dir", str(tmp_path), *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("ssmhub-eval: error:") and err.count("\n") == 1 and "Traceback" not in err
    assert message in err, err
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


def test_a_folder_missing_lm_weights_is_refused(model_dir, tmp_path, capsys, monkeypatch):
    """A saved base model (no LM head, untied) loads as a causal LM with a random head: refused after loading."""
    from safetensors.torch import load_file, save_file

    folder = shutil.copytree(model_dir, tmp_path / "headless")
    state = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in state.items() if "layers.1" not in k}, folder / "model.safetensors", {"format": "pt"})
    monkeypatch.setattr("ssmhub.evaluation.cli._prepare_data", lambda args: (iter(()), "none"))
    with pytest.raises(SystemExit) as exit_info:
        main([str(folder), "--dataset", "wikitext-2", "--data_dir", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err  # transformers' load report (a warning), then the error line
    last = err.strip().splitlines()[-1]
    assert last.startswith("ssmhub-eval: error: model") and err.count("ssmhub-eval: error:") == 1
    assert "lacks weights a causal LM needs" in last and "layers.1" in last and "Traceback" not in err
