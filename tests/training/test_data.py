"""The dataset registry and window building."""

from __future__ import annotations

import pytest

from ssmhub.tokenization import train_bpe_tokenizer
from ssmhub.training.data import DATASETS, build_windows, check_data_dir, load_documents


def test_registry_has_wikitext_and_a_pg19_placeholder():
    assert {"wikitext-2", "wikitext-103", "pg19"} <= set(DATASETS)
    with pytest.raises(NotImplementedError, match="'pg19' is not available yet"):
        load_documents("pg19", "train", None)
    with pytest.raises(ValueError, match="unknown dataset 'c4'"):
        load_documents("c4", "train", None)


def test_missing_data_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"data folder {tmp_path / 'nope'}"):
        check_data_dir(tmp_path / "nope")


def test_windows_from_tiny_wikitext(tiny_data_dir):
    train_docs = load_documents("wikitext-2", "train", tiny_data_dir)
    valid_docs = load_documents("wikitext-2", "validation", tiny_data_dir)
    assert len(train_docs) == 12 and len(valid_docs) == 3
    tokenizer = train_bpe_tokenizer(train_docs, vocab_size=300)
    train, valid = build_windows(tokenizer, train_docs, valid_docs, seq_len=16, max_eval_windows=5)
    assert train.shape[1] == 16 and len(train) > 20 and valid.shape == (5, 16)
    with pytest.raises(ValueError, match="seq_len 100000 is longer than the whole tokenized split"):
        build_windows(tokenizer, train_docs, valid_docs, seq_len=100_000)
