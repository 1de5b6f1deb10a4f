"""Byte-level BPE training, saving/reloading through AutoTokenizer, padding, and loading existing tokenizers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from ssmhub.tokenization import ENDOFTEXT, PAD_TOKEN, load_tokenizer, train_bpe_tokenizer

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
    for role in ("bos_token", "eos_token", "unk_token"):
        assert getattr(tokenizer, role) == ENDOFTEXT
    # a pad token of its own (so that DataCollatorForLanguageModeling keeps eos labels), inside vocab_size
    assert (tokenizer.eos_token_id, tokenizer.pad_token, tokenizer.pad_token_id) == (0, PAD_TOKEN, 1)
    assert tokenizer.padding_side == "left"  # batched generation of a causal LM
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
        assert (reloaded.eos_token, reloaded.pad_token, reloaded.bos_token) == (ENDOFTEXT, PAD_TOKEN, ENDOFTEXT)
        assert reloaded.padding_side == "left"
    # a bare tokenizer.json gets the same special-token roles
    from_file = load_tokenizer(tmp_path / "tokenizer.json")
    assert (from_file.eos_token_id, from_file.pad_token_id) == (0, 1)
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "missing")


def test_trained_tokenizer_has_a_plain_chat_template_that_survives_a_save(tokenizer, tmp_path):
    """A chat request to a served model needs a template (vLLM answers HTTP 400 without one): the turns as plain
    text, ending with the assistant's cue; ``chat_template=None`` leaves it out."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    expected = "system: Be brief.\nuser: Hello\nassistant:"
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == expected
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == expected
    assert train_bpe_tokenizer(["a b c"] * 5, vocab_size=300, chat_template=None).chat_template is None


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


def test_pad_token_none_pads_with_eos_as_before():
    tok = train_bpe_tokenizer(SENTENCES, vocab_size=300, pad_token=None)
    assert tok.eos_token == tok.pad_token == ENDOFTEXT and PAD_TOKEN not in tok.get_vocab()


def test_invalid_arguments():
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe_tokenizer(SENTENCES, vocab_size=200)
    with pytest.raises(ValueError, match="padding_side"):
        train_bpe_tokenizer(SENTENCES, vocab_size=300, padding_side="middle")
    with pytest.raises(ValueError, match="pad_token"):
        train_bpe_tokenizer(SENTENCES, vocab_size=300, pad_token=ENDOFTEXT)


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


TRICKY = (
    "First line\nsecond  line \n\n  indented\nword\n\n\nx\n \ny\n'tis\n  \n"
    + "".join(f"line {i} of text, with {i % 7} commas\n" for i in range(200))
    + "A\nB\nC\n\u00e9\u0301\nend"
)


def _pieces_equal_whole(tok, text: str) -> None:
    from ssmhub.tokenization import encode_document, encode_documents

    whole = tok(text, add_special_tokens=False, verbose=False)["input_ids"]
    for piece_chars in (8, 50, 1000):
        assert encode_document(tok, text, piece_chars=piece_chars) == whole
    assert encode_documents(tok, [text, "short", text], piece_chars=50) == [
        whole,
        tok("short", add_special_tokens=False)["input_ids"],
        whole,
    ]


def test_encoding_a_long_document_in_pieces_gives_the_same_ids(tokenizer):
    _pieces_equal_whole(tokenizer, TRICKY)


@pytest.mark.parametrize("name", ["gpt2", "gpt-neox-20b"])
def test_pieces_equal_whole_for_shared_tokenizers_on_a_pg19_book(name):
    folder = _shared_tokenizers()
    tok = load_tokenizer(folder / name if name == "gpt2" else folder / name / "tokenizer.json")
    book = folder.parent / "pg19" / "validation" / "28213.txt"
    text = book.read_text(encoding="utf-8")[:300_000] if book.is_file() else TRICKY
    from ssmhub.tokenization import encode_document

    whole = tok(text, add_special_tokens=False, verbose=False)["input_ids"]
    assert encode_document(tok, text, piece_chars=4096) == whole
    _pieces_equal_whole(tok, TRICKY)


def test_tokenizers_with_a_prefix_space_encode_whole():
    from tokenizers import Tokenizer, models, pre_tokenizers

    from ssmhub.tokenization import encode_document

    backend = Tokenizer(models.WordLevel({"a": 0, "Ġa": 1, "Ċ": 2, "[UNK]": 3}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend)
    text = "a\na\n" * 10
    assert encode_document(tok, text, piece_chars=4) == tok(text, add_special_tokens=False)["input_ids"]
