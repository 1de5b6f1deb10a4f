"""WikiText loading (local layout and mocked Hub fallback), article splitting and window packing."""

from __future__ import annotations

import os
from pathlib import Path

import datasets
import pytest
import torch

from ssmhub.data import DATA_DIR_ENV, HUB_DATASET, load_wikitext, pack_token_windows, wikitext_articles


def _shared_data_dir() -> Path:
    root = os.environ.get(DATA_DIR_ENV)
    if not root:
        pytest.skip(f"${DATA_DIR_ENV} is not set: the offline WikiText copy is needed (the Makefile exports it)")
    if not (Path(root) / "wikitext-2").is_dir():
        pytest.skip(f"${DATA_DIR_ENV}={root} has no wikitext-2 folder")
    return Path(root)


@pytest.fixture
def fake_root(tmp_path: Path) -> Path:
    """A tiny folder in the official layout: one article with a section and an equation-like line."""
    folder = tmp_path / "wikitext-2"
    folder.mkdir()
    lines = [" \n", " = Alpha = \n", " \n", " Alpha is a letter . \n", " \n", " = = Use = = \n", " \n"]
    lines += [" It is used . \n", " = x + 1 = \n", " More text . \n", " \n", " = Beta = \n", " \n", " Beta too . \n"]
    (folder / "wiki.valid.tokens").write_text("".join(lines), encoding="utf-8")
    return tmp_path


# ----------------------------------------------------------------------------- local files
def test_local_layout_rows_match_hub_format(fake_root, monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    rows = load_wikitext("wikitext-2", "validation", data_dir=fake_root)
    assert rows[:4] == ["", " = Alpha = \n", "", " Alpha is a letter . \n"]
    assert len(rows) == 14
    # "valid", the Hub config name and the environment variable reach the same file
    assert load_wikitext("wikitext-2-v1", "valid", data_dir=str(fake_root)) == rows
    monkeypatch.setenv(DATA_DIR_ENV, str(fake_root))
    assert load_wikitext(split="validation") == rows


def test_articles_split_at_level1_headings_only(fake_root):
    rows = load_wikitext("wikitext-2", "validation", data_dir=fake_root)
    articles = wikitext_articles(rows)
    assert len(articles) == 2  # not split at " = = Use = = " nor at the equation " = x + 1 = "
    assert articles[0].startswith(" = Alpha = \n Alpha is a letter .")
    assert " = x + 1 = \n" in articles[0]
    assert articles[1] == " = Beta = \n Beta too . \n"
    assert "".join(articles) == "".join(rows)


def test_missing_split_names_the_file(fake_root):
    with pytest.raises(FileNotFoundError, match=r"wiki\.train\.tokens"):
        load_wikitext("wikitext-2", "train", data_dir=fake_root)
    with pytest.raises(FileNotFoundError, match=r"wikitext-103-raw.*wiki\.test\.raw"):
        load_wikitext("wikitext-103-raw", "test", data_dir=fake_root)


def test_unknown_name_or_split():
    with pytest.raises(ValueError, match="variant"):
        load_wikitext("wikitext-3", data_dir=".")
    with pytest.raises(ValueError, match="split"):
        load_wikitext("wikitext-2", "dev", data_dir=".")


def test_shared_wikitext2_splits():
    root = _shared_data_dir()
    expected = {"train": (36718, 600), "validation": (3760, 60), "test": (4358, 60)}
    for split, (num_rows, num_articles) in expected.items():
        rows = load_wikitext("wikitext-2", split, data_dir=root)
        assert len(rows) == num_rows
        assert len(wikitext_articles(rows)) == num_articles
    rows = load_wikitext("wikitext-2", "test", data_dir=root)
    assert rows[:3] == ["", " = Robert <unk> = \n", ""]
    assert sum(len(row.split()) for row in rows) == 241211  # the official test word count, <eos> excluded


def test_shared_wikitext103_has_no_full_train_split():
    root = _shared_data_dir()
    if not (root / "wikitext-103").is_dir():
        pytest.skip(f"{root} has no wikitext-103 folder")
    assert len(load_wikitext("wikitext-103", "validation", data_dir=root)) > 0
    with pytest.raises(FileNotFoundError, match=r"wiki\.train\.tokens \(that folder holds .*wiki\.train\.tokens\.head"):
        load_wikitext("wikitext-103", "train", data_dir=root)


# ----------------------------------------------------------------------------- Hub fallback (mocked)
@pytest.mark.parametrize(
    ("name", "split", "config", "hub_split"),
    [
        ("wikitext-2", "train", "wikitext-2-v1", "train"),
        ("wikitext-2", "valid", "wikitext-2-v1", "validation"),
        ("wikitext-103", "test", "wikitext-103-v1", "test"),
        ("wikitext-2-raw", "validation", "wikitext-2-raw-v1", "validation"),
        ("wikitext-103-raw-v1", "train", "wikitext-103-raw-v1", "train"),
    ],
)
def test_hub_fallback_calls_load_dataset(monkeypatch, name, split, config, hub_split):
    calls = []

    def fake_load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return datasets.Dataset.from_dict({"text": ["", " = T = \n"]})

    monkeypatch.setenv(DATA_DIR_ENV, "")  # the Makefile exports it empty when there is no local copy
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert load_wikitext(name, split) == ["", " = T = \n"]
    assert calls == [((HUB_DATASET, config), {"split": hub_split})]


# ----------------------------------------------------------------------------- packing
def test_pack_token_windows_with_eos():
    windows = pack_token_windows([[1, 2, 3], [4, 5], [6, 7, 8, 9]], seq_len=4, eos_token_id=0)
    # stream 1 2 3 0 4 5 0 6 7 8 9: two full windows, the 3-token tail is dropped
    assert windows.dtype == torch.long
    assert windows.tolist() == [[1, 2, 3, 0], [4, 5, 0, 6]]


def test_pack_token_windows_without_eos_and_edge_cases():
    windows = pack_token_windows([[1, 2, 3], [4, 5], [6, 7, 8, 9]], seq_len=3)
    assert windows.tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert pack_token_windows(iter([range(5)]), seq_len=5).tolist() == [[0, 1, 2, 3, 4]]
    assert pack_token_windows([[1, 2]], seq_len=3).shape == (0, 3)
    with pytest.raises(ValueError, match="seq_len"):
        pack_token_windows([[1]], seq_len=0)
