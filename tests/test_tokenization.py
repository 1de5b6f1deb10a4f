"""Byte-level BPE training, saving/reloading through AutoTokenizer, padding, and loading existing tokenizers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from ssmhub.tokenization import ENDOFTEXT, load_tokenizer, train_bpe_tokenizer

SENTENCES = [
    "The quick brown fox jumps over the lazy dog .",
    "The history of the lobster is long and the lobster is blue .",
    "In 1998 , the team played in the league for the first time .",
    "A tokenizer splits text into tokens , and the tokens into ids .",
] * 10


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer(SENTENCES, vocab_size=320)


def _shared_tokenizers() -> Path:
    root = os.environ.get("SSMHUB_DATA_DIR")
    if not root or not (Path(root) / "tokenizers").is_dir():
        pytest.skip("$SSMHUB_DATA_DIR is not set or has no tokenizers/ folder (offline GPT-2 / NeoX tokenizers)")
    return Path(root) / "tokenizers"


def test_trained_tokenizer_basics(tokenizer):
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    assert 257 < len(tokenizer) <= 320
    assert tokenizer.convert_ids_to_tokens(0) == ENDOFTEXT
    for role in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert getattr(tokenizer, role) == ENDOFTEXT
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == 0
    # merges were learned: a frequent word is a single token
    assert len(tokenizer.tokenize(" lobster")) == 1


@pytest.mark.parametrize("text", ["The quick brown fox .", "  leading spaces\nand lines\n", "café – naïve 日本 🙂"])
def test_round_trip(tokenizer, text):
    ids = tokenizer(text)["input_ids"]
    assert ENDOFTEXT not in tokenizer.convert_ids_to_tokens(ids)  # bytes cover everything: no unk, no bos/eos added
    assert tokenizer.decode(ids) == text


def test_save_pretrained_and_auto_reload(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    for reloaded in (AutoTokenizer.from_pretrained(tmp_path), load_tokenizer(tmp_path)):
        assert isinstance(reloaded, PreTrainedTokenizerFast)
        assert reloaded.get_vocab() == tokenizer.get_vocab()
        assert reloaded(SENTENCES[:4])["input_ids"] == tokenizer(SENTENCES[:4])["input_ids"]
        assert (reloaded.eos_token, reloaded.pad_token, reloaded.bos_token) == (ENDOFTEXT,) * 3
    # a bare tokenizer.json gets the same special-token roles
    from_file = load_tokenizer(tmp_path / "tokenizer.json")
    assert (from_file.eos_token_id, from_file.pad_token_id) == (0, 0)
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "missing")


@pytest.mark.parametrize("side", ["right", "left"])
def test_batched_padding(side):
    tok = train_bpe_tokenizer(SENTENCES, vocab_size=300, padding_side=side)
    assert tok.padding_side == side
    batch = tok(["The fox", "The history of the lobster"], padding=True, return_tensors="pt")
    short = len(tok("The fox")["input_ids"])
    width = batch["input_ids"].shape[1]
    assert width > short
    mask = batch["attention_mask"][0].tolist()
    pads = width - short
    assert mask == ([1] * short + [0] * pads if side == "right" else [0] * pads + [1] * short)
    padded = batch["input_ids"][0].tolist()
    assert (padded[short:] if side == "right" else padded[:pads]) == [tok.pad_token_id] * pads
    assert batch["attention_mask"][1].all()


def test_invalid_arguments():
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe_tokenizer(SENTENCES, vocab_size=200)
    with pytest.raises(ValueError, match="padding_side"):
        train_bpe_tokenizer(SENTENCES, vocab_size=300, padding_side="middle")


def test_shared_gpt2_folder():
    folder = _shared_tokenizers() / "gpt2"
    tok = load_tokenizer(folder)
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert tok("Hello world")["input_ids"] == [15496, 995]
    assert tok.eos_token_id == 50256


def test_shared_neox_tokenizer_json():
    path = _shared_tokenizers() / "gpt-neox-20b" / "tokenizer.json"
    tok = load_tokenizer(path)
    assert tok("Hello world")["input_ids"] == [12092, 1533]
    assert tok.eos_token == tok.pad_token == ENDOFTEXT
    assert tok.eos_token_id == 0
