"""The dataset registry and window building (through the tokenized-window cache)."""

from __future__ import annotations

import pytest
import torch

from ssmhub.data import pack_token_windows, pg19_token_windows
from ssmhub.tokenization import encode_document, train_bpe_tokenizer
from ssmhub.training.data import DATASETS, build_windows, check_data_dir, corpus_source, iter_documents


def test_registry():
    assert {"wikitext-2", "wikitext-103", "pg19"} <= set(DATASETS)
    with pytest.raises(ValueError, match="unknown dataset 'c4'"):
        corpus_source("c4", "train", None)


def test_missing_data_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"data folder {tmp_path / 'nope'}"):
        check_data_dir(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="missing file"):
        corpus_source("wikitext-103", "train", tmp_path)
    with pytest.raises(FileNotFoundError, match="PG-19 split 'train': missing folder"):
        corpus_source("pg19", "train", tmp_path)


def test_windows_from_tiny_wikitext(tiny_data_dir, tmp_path):
    train_source = corpus_source("wikitext-2", "train", tiny_data_dir)
    valid_source = corpus_source("wikitext-2", "validation", tiny_data_dir)
    train_docs, valid_docs = list(iter_documents(train_source)), list(iter_documents(valid_source))
    assert len(train_docs) == 12 and len(valid_docs) == 3
    tokenizer = train_bpe_tokenizer(train_docs, vocab_size=300)
    train, valid = build_windows(tokenizer, train_source, valid_source, 16, max_eval_windows=5, cache_dir=tmp_path)
    oracle = pack_token_windows([encode_document(tokenizer, d) for d in train_docs], 16, tokenizer.eos_token_id)
    assert torch.equal(train[range(len(train))], oracle) and len(train) > 20 and valid[range(5)].shape == (5, 16)
    assert len(valid) == 5
    with pytest.raises(ValueError, match="seq_len 100000 is longer than the whole tokenized split"):
        build_windows(tokenizer, train_source, valid_source, seq_len=100_000, cache_dir=tmp_path)


def test_pg19_windows_stay_inside_books(tiny_pg19_dir, tmp_path):
    train_source = corpus_source("pg19", "train", tiny_pg19_dir)
    valid_source = corpus_source("pg19", "validation", tiny_pg19_dir)
    books = list(iter_documents(train_source))
    tokenizer = train_bpe_tokenizer(books, vocab_size=300)
    train, valid = build_windows(tokenizer, train_source, valid_source, 16, cache_dir=tmp_path)
    oracle = torch.stack(list(pg19_token_windows(books, tokenizer, 16)))
    assert torch.equal(train[range(len(train))], oracle)
    assert len(valid) == len(list(pg19_token_windows(iter_documents(valid_source), tokenizer, 16))) > 0
