"""PG-19: local official layout, mocked Hub streaming, per-book token windows and the word count."""

from __future__ import annotations

import os
from pathlib import Path

import datasets
import pytest
import torch

from ssmhub.data import (
    DATA_DIR_ENV,
    PG19_HUB_DATASET,
    PG19Book,
    iter_pg19_books,
    pg19_book_ids,
    pg19_token_windows,
    pg19_word_count,
)

BOOKS = {"200": "Second book.\r\nTwo lines.\r\n", "1001": "First  book\r\n\r\nof three words? no, more.\r\n"}


@pytest.fixture
def fake_root(tmp_path: Path) -> Path:
    """A data folder holding pg19/ in the official layout: metadata (no header), CRLF books."""
    pg19 = tmp_path / "pg19"
    (pg19 / "validation").mkdir(parents=True)
    for book_id, text in BOOKS.items():
        (pg19 / "validation" / f"{book_id}.txt").write_bytes(text.encode("utf-8"))
    (pg19 / "metadata.csv").write_text(
        '1001,"Inferno, Canto I by Dante",1882,http://www.gutenberg.org/ebooks/1001\n'
        "200,Other by Someone,1900,http://www.gutenberg.org/ebooks/200\n",
        encoding="utf-8",
    )
    return tmp_path


class CharTokenizer:
    """Stands in for a Hugging Face tokenizer: one id per character."""

    def __call__(self, text, add_special_tokens=True, verbose=True):
        assert not add_special_tokens
        return {"input_ids": [ord(c) for c in text]}


def test_local_books_in_bucket_order_with_metadata_and_lf_text(fake_root, monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    books = list(iter_pg19_books("validation", data_dir=fake_root))
    assert [b.book_id for b in books] == ["1001", "200"]  # lexicographic file order, as in the bucket
    assert books[0].title == "Inferno, Canto I by Dante"
    assert books[0].publication_date == "1882"
    assert books[0].url.endswith("/1001")
    assert books[1].text == "Second book.\nTwo lines.\n"  # CRLF read as "\n", like the Hub copy
    assert pg19_book_ids("validation", fake_root) == ["1001", "200"]
    # the PG-19 folder itself, and the environment variable, reach the same books
    assert list(iter_pg19_books("validation", data_dir=fake_root / "pg19")) == books
    monkeypatch.setenv(DATA_DIR_ENV, str(fake_root))
    assert list(iter_pg19_books("validation", max_books=1)) == books[:1]


def test_books_are_read_one_at_a_time(fake_root):
    books = iter_pg19_books("validation", data_dir=fake_root)
    assert next(books).book_id == "1001"
    (fake_root / "pg19" / "validation" / "200.txt").write_text("changed after the first book", encoding="utf-8")
    assert next(books).text == "changed after the first book"


def test_missing_folders_and_bad_split(fake_root, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"pg19[/\\]test"):
        iter_pg19_books("test", data_dir=fake_root)
    with pytest.raises(FileNotFoundError, match=r"pg19[/\\]test"):
        pg19_book_ids("test", data_dir=fake_root)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        iter_pg19_books("validation", data_dir=tmp_path / "nowhere")
    with pytest.raises(ValueError, match="unknown PG-19 split"):
        iter_pg19_books("valid", data_dir=fake_root)
    with pytest.raises(ValueError, match="max_books"):
        iter_pg19_books("validation", data_dir=fake_root, max_books=-1)


def test_hub_path_streams_and_stops_early(monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    calls = []

    def rows():
        yield {
            "short_book_title": "A",
            "publication_date": 1850,
            "url": "http://www.gutenberg.org/ebooks/7",
            "text": "x y",
        }
        yield {
            "short_book_title": "B",
            "publication_date": 1851,
            "url": "http://www.gutenberg.org/ebooks/8",
            "text": "z",
        }
        raise AssertionError("read past max_books")

    def fake_load_dataset(path, *args, **kwargs):
        calls.append((path, args, kwargs))
        return rows()

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    books = list(iter_pg19_books("test", max_books=2))
    assert calls == [(PG19_HUB_DATASET, (), {"split": "test", "streaming": True})]
    assert books == [
        PG19Book("7", "A", "x y", "1850", "http://www.gutenberg.org/ebooks/7"),
        PG19Book("8", "B", "z", "1851", "http://www.gutenberg.org/ebooks/8"),
    ]
    with pytest.raises(ValueError, match="local data folder"):
        pg19_book_ids("test")


def test_token_windows_never_cross_a_book():
    windows = list(pg19_token_windows(["abcdefghij", "ABCDEFG", "xy"], CharTokenizer(), seq_len=4))
    assert ["".join(map(chr, w.tolist())) for w in windows] == ["abcd", "efgh", "ABCD"]  # tails dropped
    assert all(w.dtype == torch.long and w.shape == (4,) for w in windows)
    book = PG19Book("1", "t", "abcd")
    assert len(list(pg19_token_windows([book], CharTokenizer(), seq_len=4))) == 1
    with pytest.raises(ValueError, match="seq_len"):
        list(pg19_token_windows([book], CharTokenizer(), seq_len=0))


def test_word_count_is_whitespace_split():
    assert pg19_word_count("First  book\r\n\r\nof\tthree words.\n") == 5
    assert pg19_word_count("") == 0


def test_official_validation_book():
    root = os.environ.get(DATA_DIR_ENV)
    if not root or not (Path(root) / "pg19" / "validation").is_dir():
        pytest.skip(f"${DATA_DIR_ENV} is not set or has no pg19/validation: the offline PG-19 copy is needed")
    book = next(iter_pg19_books("validation", data_dir=root))
    assert book.book_id == "28213"
    assert book.title == "Harper's Young People November 25 1879 by Various"
    assert "\r" not in book.text and len(book.text) == 50997 - book.text.count("\n")
    assert pg19_word_count(book.text) == 9114
