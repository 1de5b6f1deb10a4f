"""``ssmhub-eval --stateful`` end to end on tiny saved models (PG-19 from a mocked Hub), and its bad inputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import datasets
import pytest
import torch
from comparisons import MODEL_REL
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

import ssmhub
from ssmhub.data import DATA_DIR_ENV
from ssmhub.evaluation import evaluate_perplexity_stateful
from ssmhub.evaluation.cli import main, run_evaluation
from ssmhub.tokenization import encode_document, train_bpe_tokenizer

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A linear recurrence reads one token at a time and keeps a fixed-size state.",
    "A book is read from its first page to its last; the state carries what came before.",
] * 20
BOOKS = [" ".join(SENTENCES[:3]), " ".join(SENTENCES[:9])]


def _save(folder: Path, model, tokenizer) -> Path:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Tiny saved models sharing one BPE tokenizer: a DLR and an H3 hybrid causal LM, a DLR classifier, GPT-2."""
    root = tmp_path_factory.mktemp("stateful-eval")
    tokenizer = train_bpe_tokenizer(SENTENCES, vocab_size=300)
    vocab, torch_seed = len(tokenizer), torch.manual_seed(0)
    del torch_seed
    small = {"vocab_size": vocab, "hidden_size": 16, "num_hidden_layers": 2}
    return {
        "dlr": _save(root / "dlr", ssmhub.DLRForCausalLM(ssmhub.DLRConfig(**small, state_size=8)), tokenizer),
        "hybrid": _save(
            root / "hybrid",
            ssmhub.H3ForCausalLM(
                ssmhub.H3Config(**small, attention_layers=[1], num_attention_heads=2, max_kernel_length=16)
            ),
            tokenizer,
        ),
        "classifier": _save(
            root / "classifier", ssmhub.DLRForSequenceClassification(ssmhub.DLRConfig(**small)), tokenizer
        ),
        "gpt2": _save(
            root / "gpt2", GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=16, n_layer=1, n_head=2)), tokenizer
        ),
    }


@pytest.fixture
def mocked_pg19(monkeypatch):
    """PG-19 "from the Hub": the two books of :data:`BOOKS`."""
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    rows = [{"short_book_title": "T", "publication_date": 1900, "url": "http://x/ebooks/1", "text": t} for t in BOOKS]
    monkeypatch.setattr(datasets, "load_dataset", lambda path, split, streaming: iter(rows))


def test_stateful_scores_whole_books_and_names_the_protocol(folders, mocked_pg19, tmp_path, capsys):
    """Windows of 7 tokens carry the state through each book: the JSON holds the numbers of
    ``evaluate_perplexity_stateful`` on the books' tokens (every token but each book's first), by position too."""
    output = tmp_path / "stateful.json"
    argv = [str(folders["dlr"]), "--dataset", "pg19", "--split", "test", "--max_length", "7", "--stateful"]
    assert main([*argv, "--output", str(output)]) == 0
    printed = capsys.readouterr().out
    assert "scoring: stateful" in printed and "position in document" in printed and "0-1K" in printed
    payload = json.loads(output.read_text())
    assert payload["scoring"] == "stateful" and payload["stride"] is None and payload["max_length"] == 7
    tokenizer = AutoTokenizer.from_pretrained(folders["dlr"])
    docs = [encode_document(tokenizer, text) for text in BOOKS]
    model = ssmhub.DLRForCausalLM.from_pretrained(folders["dlr"])
    expected = evaluate_perplexity_stateful(model, docs, max_length=7)
    results = payload["results"]
    assert results["num_documents"] == 2 and results["num_tokens"] == sum(len(d) - 1 for d in docs)
    # the CLI's model (on its default device, a GPU where there is one) and this one: to float32 round-off
    assert math.isclose(results["total_nll"], expected.total_nll, rel_tol=MODEL_REL)
    first, *rest = results["by_position"]
    assert first["positions"] == "0-1K" and first["num_tokens"] == results["num_tokens"]
    assert [b["num_tokens"] for b in rest] == [0, 0, 0, 0] and rest[0]["token_perplexity"] is None  # strict JSON


def test_the_default_stays_sliding_windows_and_says_so(folders, mocked_pg19, capsys):
    payload = run_evaluation([str(folders["dlr"]), "--dataset", "pg19", "--split", "test", "--max_length", "16"])
    assert payload["scoring"] == "sliding_window" and payload["stride"] == 8
    buckets = payload["results"]["by_position"]  # both protocols report by position in the document
    assert sum(b["num_tokens"] for b in buckets) == payload["results"]["num_tokens"] > 0
    assert "scoring: sliding_window (windows of 16 tokens, stride 8)" in capsys.readouterr().out


def test_a_hybrid_runs_statefully_with_a_sliding_attention_window(folders, mocked_pg19):
    argv = [str(folders["hybrid"]), "--dataset", "pg19", "--split", "test", "--max_length", "9", "--stateful"]
    payload = run_evaluation([*argv, "--attention_window", "4"])
    assert payload["attention_window"] == 4 and payload["scoring"] == "stateful"
    # the numbers of one forward pass over each whole book, every attention layer windowed to 4 tokens
    model = ssmhub.H3ForCausalLM.from_pretrained(folders["hybrid"]).eval()
    model.set_attention_window(4)
    tokenizer = AutoTokenizer.from_pretrained(folders["hybrid"])
    total = 0.0
    with torch.no_grad():
        for text in BOOKS:
            doc = torch.tensor(encode_document(tokenizer, text))
            logits = model(input_ids=doc[None], use_cache=False).logits[0, :-1]
            total -= torch.log_softmax(logits.float(), -1).gather(-1, doc[1:, None]).double().sum().item()
    assert payload["results"]["num_documents"] == 2
    assert math.isclose(payload["results"]["total_nll"], total, rel_tol=MODEL_REL)  # windows vs one forward


def _no_work(*_args, **_kwargs):
    raise AssertionError("data or model loaded before the arguments were checked")


def _training_checkpoint(root: Path, model_type: str) -> Path:
    """The files a training checkpoint's pre-flight reads (an H3 run: 2 layers, so attention at layer 1)."""
    checkpoint = root / "run" / "checkpoints" / "step-1"
    (root / "run" / "checkpoints" / "tokenizer").mkdir(parents=True)
    checkpoint.mkdir()
    for name in ("complete.json", "model.safetensors"):
        (checkpoint / name).write_text("{}")
    fields = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2}
    config = {"model_type": model_type, "model_config": fields}
    (root / "run" / "train_config.json").write_text(json.dumps(config))
    return checkpoint


@pytest.mark.parametrize(
    ("model", "extra", "message"),
    [
        ("dlr", ["--stateful", "--stride", "8"], "--stride is for sliding windows"),
        ("dlr", ["--stateful", "--batch_size", "2"], "--batch_size 2: --stateful streams one document"),
        ("dlr", ["--stateful", "--max_length", "0"], "--max_length must be positive"),
        ("dlr", ["--stateful", "--attention_window", "4"], "--attention_window is for ssmhub models with attention"),
        ("hybrid", ["--stateful"], "has attention layers [1], whose cache would keep every key and value"),
        ("hybrid", ["--stateful", "--attention_window", "0"], "--attention_window must be positive"),
        ("classifier", ["--stateful"], "is a DLRForSequenceClassification, not a causal language model"),
        ("gpt2", ["--stateful"], "--stateful needs an ssmhub recurrent model"),
        ("checkpoint", ["--stateful"], "has attention layers [1]"),
    ],
)
def test_bad_stateful_inputs_are_one_line_before_any_work(
    folders, tmp_path, monkeypatch, capsys, model, extra, message
):
    import ssmhub.evaluation.cli as cli

    monkeypatch.setattr(cli, "_prepare_data", _no_work)
    monkeypatch.setattr(cli, "_load_model_and_tokenizer", _no_work)
    folder = _training_checkpoint(tmp_path, "h3") if model == "checkpoint" else folders[model]
    with pytest.raises(SystemExit) as exit_info:
        main([str(folder), "--dataset", "pg19", "--data_dir", str(tmp_path), *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("ssmhub-eval: error:") and err.count("\n") == 1 and "Traceback" not in err
    assert message in err, err
