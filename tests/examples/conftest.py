"""Fixtures of the examples' tests: a tiny corpus and tokenizer, and a tiny saved model."""

from __future__ import annotations

from pathlib import Path

import pytest
from example_helpers import LINES


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> dict[str, Path]:
    """``train`` and ``validation`` text files (one document a line) and a 300-token BPE ``tokenizer`` folder."""
    from ssmhub.tokenization import train_bpe_tokenizer

    root = tmp_path_factory.mktemp("corpus")
    (root / "train.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    (root / "validation.txt").write_text("\n".join(LINES[:4]) + "\n", encoding="utf-8")
    train_bpe_tokenizer(LINES, vocab_size=300, min_frequency=1).save_pretrained(root / "tokenizer")
    return {"train": root / "train.txt", "validation": root / "validation.txt", "tokenizer": root / "tokenizer"}


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory, tiny_corpus) -> Path:
    """A saved tiny DLR language model folder with its tokenizer and its code (lm-eval loads it as remote code)."""
    import torch
    from transformers import AutoTokenizer

    import ssmhub

    tokenizer = AutoTokenizer.from_pretrained(tiny_corpus["tokenizer"])
    torch.manual_seed(0)
    config = ssmhub.DLRConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        state_size=8,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    folder = tmp_path_factory.mktemp("tiny-lm")
    ssmhub.DLRForCausalLM(config).save_pretrained(folder, save_code=True)
    tokenizer.save_pretrained(folder)
    return folder
