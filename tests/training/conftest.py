"""Fixtures for the training tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from training_helpers import tiny_args, write_tiny_pg19, write_tiny_wikitext


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory) -> Path:
    return write_tiny_wikitext(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def tiny_pg19_dir(tmp_path_factory) -> Path:
    return write_tiny_pg19(tmp_path_factory.mktemp("pg19data"))


@pytest.fixture(scope="module")
def finished_run(tiny_data_dir, tmp_path_factory) -> Path:
    """A run of ``tiny_args`` to its end: 6 steps (warmup 2), checkpoints at steps 3 and 6. Tests copy it."""
    from ssmhub.training.cli import main

    out = tmp_path_factory.mktemp("run")
    main(tiny_args(tiny_data_dir, out))
    return out
