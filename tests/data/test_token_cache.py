"""Tokenized-window cache: equal to the in-memory packers, reused without re-tokenizing, atomic, streaming."""

from __future__ import annotations

import gc
import io
import os
import random
import tracemalloc
from pathlib import Path

import pytest
import torch

import ssmhub.data.pg19 as pg19_module
from ssmhub.data import (
    CorpusSource,
    cached_token_windows,
    files_fingerprint,
    pack_token_windows,
    pg19_source,
    pg19_token_windows,
    tokenizer_fingerprint,
)
from ssmhub.tokenization import encode_document, train_bpe_tokenizer

TEXTS = [f"document {i}: " + " ".join(f"w{(i * 7 + j) % 23}" for j in range(20 + 13 * i)) for i in range(9)]


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer(TEXTS, vocab_size=300)


def source(texts, packing="stream", fingerprint="texts-v1", calls=None):
    def documents():
        if calls is not None:
            calls.append(1)
        return iter(texts)

    return CorpusSource("unit/texts", documents, fingerprint, packing)


def test_stream_packing_equals_pack_token_windows(tokenizer, tmp_path):
    windows = cached_token_windows(source(TEXTS), tokenizer, seq_len=16, cache_dir=tmp_path)
    oracle = pack_token_windows([encode_document(tokenizer, t) for t in TEXTS], 16, eos_token_id=tokenizer.eos_token_id)
    assert len(windows) == len(oracle) > 10
    assert torch.equal(windows[range(len(windows))], oracle)
    assert torch.equal(windows[3], oracle[3]) and windows[3].dtype == torch.long
    assert torch.equal(windows[2:9:3], oracle[2:9:3])
    assert torch.equal(windows[[5, 0, 5]], oracle[[5, 0, 5]])
    assert torch.equal(windows.head(4)[range(4)], oracle[:4]) and len(windows.head(0)) == len(oracle)


def test_document_packing_never_crosses_a_document(tokenizer, tmp_path):
    windows = cached_token_windows(source(TEXTS, packing="document"), tokenizer, seq_len=8, cache_dir=tmp_path)
    oracle = torch.stack(list(pg19_token_windows(TEXTS, tokenizer, 8)))
    assert torch.equal(windows[range(len(windows))], oracle)
    # every window is a slice of one document's tokens, at a multiple of seq_len
    per_doc = [encode_document(tokenizer, t) for t in TEXTS]
    expected = sum(len(ids) // 8 for ids in per_doc)
    assert len(windows) == expected
    assert not (windows[range(len(windows))] == tokenizer.eos_token_id).any()


def test_second_call_reuses_the_cache_and_keys_change_with_inputs(tokenizer, tmp_path):
    calls: list[int] = []
    first = cached_token_windows(source(TEXTS, calls=calls), tokenizer, 16, cache_dir=tmp_path)
    again = cached_token_windows(source(TEXTS, calls=calls), tokenizer, 16, cache_dir=tmp_path)
    assert calls == [1]  # the documents were read (and tokenized) once
    assert again.path == first.path and torch.equal(again[range(len(again))], first[range(len(first))])
    cached_token_windows(source(TEXTS, calls=calls), tokenizer, 32, cache_dir=tmp_path)
    cached_token_windows(source(TEXTS, calls=calls, fingerprint="texts-v2"), tokenizer, 16, cache_dir=tmp_path)
    other_tokenizer = train_bpe_tokenizer(TEXTS, vocab_size=265)
    assert tokenizer_fingerprint(other_tokenizer) != tokenizer_fingerprint(tokenizer)
    cached_token_windows(source(TEXTS, calls=calls), other_tokenizer, 16, cache_dir=tmp_path)
    assert calls == [1, 1, 1, 1]
    entries = sorted(p.name for p in (tmp_path / "token_windows").iterdir())
    assert len(entries) == 4 and all(name.startswith("unit-texts-L") for name in entries)


def test_tokenizer_fingerprint_survives_save_load_and_use(tokenizer, tmp_path):
    from ssmhub.tokenization import load_tokenizer

    tokenizer.save_pretrained(tmp_path / "tok")
    fresh = load_tokenizer(tmp_path / "tok")
    before = tokenizer_fingerprint(fresh)
    assert before == tokenizer_fingerprint(tokenizer)
    fresh(["a b", "c"], padding=True, truncation=True, max_length=4)  # changes the backend's settings
    assert tokenizer_fingerprint(fresh) == before


def test_an_interrupted_build_leaves_no_entry(tokenizer, tmp_path):
    def documents():
        yield TEXTS[0]
        raise RuntimeError("disk full")

    broken = CorpusSource("unit/broken", documents, "broken", "stream")
    with pytest.raises(Exception) as failure:  # datasets wraps the generator's error
        cached_token_windows(broken, tokenizer, 8, cache_dir=tmp_path)
    assert "disk full" in repr(failure.value) + repr(failure.value.__cause__)
    assert list((tmp_path / "token_windows").iterdir()) == []  # no entry, no leftover work folder


def test_bad_arguments(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="packing must be one of"):
        CorpusSource("x", lambda: iter(()), "f", "books")
    with pytest.raises(ValueError, match="seq_len must be a positive integer"):
        cached_token_windows(source(TEXTS), tokenizer, 0, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="holds no documents"):
        cached_token_windows(source([], fingerprint="empty"), tokenizer, 8, cache_dir=tmp_path)


def test_files_fingerprint_follows_content_changes(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("one")
    before = files_fingerprint([path])
    assert files_fingerprint([path]) == before
    path.write_text("one two")
    os.utime(path, ns=(1, 1))
    assert files_fingerprint([path]) != before


def write_books(root: Path, books: dict[str, str], split: str = "train") -> Path:
    folder = root / "pg19" / split
    folder.mkdir(parents=True, exist_ok=True)
    for book_id, text in books.items():
        (folder / f"{book_id}.txt").write_bytes(text.replace("\n", "\r\n").encode("utf-8"))
    return root


def test_pg19_source_reads_the_local_split_book_by_book(tokenizer, tmp_path):
    books = {str(100 + i): text for i, text in enumerate(TEXTS)}
    root = write_books(tmp_path / "data", books)
    src = pg19_source("train", root)
    assert src.packing == "document" and list(src.documents()) == [books[k] for k in sorted(books)]
    windows = cached_token_windows(src, tokenizer, 8, cache_dir=tmp_path / "cache")
    oracle = torch.stack(list(pg19_token_windows([books[k] for k in sorted(books)], tokenizer, 8)))
    assert torch.equal(windows[range(len(windows))], oracle)
    assert len(list(pg19_source("train", root, max_books=2).documents())) == 2
    with pytest.raises(FileNotFoundError, match="missing folder"):
        pg19_source("validation", root)
    with pytest.raises(ValueError, match="unknown PG-19 split"):
        pg19_source("dev", root)


def random_books(count: int, lines_per_book: int, seed: int = 0) -> dict[str, str]:
    """``count`` books (id -> text), each of ``lines_per_book`` lines of 12 words drawn from 500."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(500)]
    line = lambda: " ".join(rng.choice(words) for _ in range(12)) + "\n"  # noqa: E731
    return {str(1000 + i): "".join(line() for _ in range(lines_per_book)) for i in range(count)}


def count_book_texts_alive(monkeypatch) -> dict[str, int]:
    """Make the texts the PG-19 reader reads count themselves. The returned counts are kept up to date:
    "read" (books read) and "most_alive" (the most book texts alive at once; a split read at once keeps
    all of them alive)."""
    counts = {"read": 0, "alive": 0, "most_alive": 0}

    class BookText(str):
        def __del__(self):
            counts["alive"] -= 1

    class BookFile(io.StringIO):
        def read(self, size=-1):
            text = BookText(super().read(size))
            counts["read"] += 1
            counts["alive"] += 1
            counts["most_alive"] = max(counts["most_alive"], counts["alive"])
            return text

    def open_book(path, *args, **kwargs):
        with open(path, *args, **kwargs) as handle:
            return BookFile(handle.read())

    monkeypatch.setattr(pg19_module, "open", open_book, raising=False)  # shadows the builtin in that module
    return counts


def traced_peak_bytes(build) -> int:
    """Peak bytes of Python objects (tracemalloc) alive while ``build()`` runs, above those alive before.

    A corpus held in memory is held as Python objects (book texts, token-id lists), so this sees a split
    read or tokenized at once; memory of Arrow and of the Rust tokenizer is not counted.
    """
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        gc.collect()
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        build()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        if not tracing:
            tracemalloc.stop()


def test_pg19_windows_stream_book_by_book_and_equal_the_in_memory_windows(tokenizer, tmp_path, monkeypatch):
    """The windows of 40 books of 8 KiB are built without loading the split: at most 9 of the texts the reader
    reads are alive at once (the document writer's 8, and the book being read), and building them takes about
    as much Python memory as building the windows of 8 books: less than half the 270 KiB of text of the 32
    extra books, which tokenizing them at once would cost many times over. The windows equal
    pg19_token_windows over the books' texts in memory (so none crosses a book boundary). The slow test
    below checks the process's memory on 48 MB of books."""
    books = random_books(40, lines_per_book=150)
    few = write_books(tmp_path / "few", dict(list(books.items())[:8]))
    many = write_books(tmp_path / "many", books)
    cached_token_windows(pg19_source("train", few), tokenizer, 64, cache_dir=tmp_path / "warm-up")  # lazy imports

    def build(root, cache):
        return lambda: cached_token_windows(pg19_source("train", root), tokenizer, 64, cache_dir=tmp_path / cache)

    texts = count_book_texts_alive(monkeypatch)
    peak_of_many = traced_peak_bytes(build(many, "many"))
    assert texts["read"] == 40
    assert texts["most_alive"] <= 8 + 1, f"{texts['most_alive']} of the 40 books' texts were alive at once"
    extra = peak_of_many - traced_peak_bytes(build(few, "few"))
    extra_books_bytes = sum(len(text) for text in list(books.values())[8:])
    assert extra < extra_books_bytes / 2, f"32 more books ({extra_books_bytes} bytes) cost {extra} bytes"

    windows = cached_token_windows(pg19_source("train", many), tokenizer, 64, cache_dir=tmp_path / "many")
    oracle = torch.stack(list(pg19_token_windows([books[k] for k in sorted(books)], tokenizer, 64)))
    assert len(windows) == len(oracle) > 40 * 10
    assert torch.equal(windows[range(len(windows))], oracle)


_RSS_SCRIPT = """
import re, sys, threading, time
from ssmhub.data import cached_token_windows, pg19_source
from ssmhub.tokenization import train_bpe_tokenizer

def anon_kib():
    return int(re.search(r"RssAnon:\\s+(\\d+)", open("/proc/self/status").read()).group(1))

root, cache, max_books = sys.argv[1], sys.argv[2], int(sys.argv[3])
tokenizer = train_bpe_tokenizer([" ".join(f"w{i}" for i in range(500))] * 3, vocab_size=600)
base, peak = anon_kib(), [0]

def sample():
    while True:
        peak[0] = max(peak[0], anon_kib())
        time.sleep(0.005)

threading.Thread(target=sample, daemon=True).start()
windows = cached_token_windows(pg19_source("train", root, max_books=max_books), tokenizer, 512, cache_dir=cache)
time.sleep(0.05)
print(len(windows), (peak[0] - base) * 1024)
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads RssAnon from /proc")
def test_building_pg19_windows_streams_instead_of_loading_the_split(tmp_path):
    """Peak anonymous memory while tokenizing 12 vs 48 books of 1 MB: the extra 36 MB of books (about
    20M tokens, which as Python lists alone would take 700 MB) must cost less than their own size."""
    import subprocess
    import sys

    root = write_books(tmp_path / "data", random_books(48, lines_per_book=20_000))
    book_bytes = sum(p.stat().st_size for p in (root / "pg19" / "train").iterdir()) / 48

    def run(max_books: int) -> tuple[int, int]:
        args = [str(root), str(tmp_path / f"cache{max_books}"), str(max_books)]
        out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, *args], capture_output=True, text=True, check=True)
        num_windows, growth = map(int, out.stdout.split()[-2:])
        return num_windows, growth

    (few, few_growth), (many, many_growth) = run(12), run(48)
    assert many > 4 * few - 48 > 1000
    extra = many_growth - few_growth
    assert extra < 36 * book_bytes, f"36 more books ({36 * book_bytes / 2**20:.0f} MiB) cost {extra / 2**20:.0f} MiB"
