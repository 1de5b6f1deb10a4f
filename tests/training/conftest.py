"""Fixtures for the training tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from training_helpers import write_tiny_pg19, write_tiny_wikitext


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory) -> Path:
    return write_tiny_wikitext(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def tiny_pg19_dir(tmp_path_factory) -> Path:
    return write_tiny_pg19(tmp_path_factory.mktemp("pg19data"))
