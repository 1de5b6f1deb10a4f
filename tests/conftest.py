"""Session-wide test settings: tokenized-window caches go to a temporary folder, never ~/.cache."""

from __future__ import annotations

import os

import pytest

from ssmhub.data import CACHE_DIR_ENV


@pytest.fixture(autouse=True, scope="session")
def _token_cache_in_tmp(tmp_path_factory):
    previous = os.environ.get(CACHE_DIR_ENV)
    os.environ[CACHE_DIR_ENV] = str(tmp_path_factory.mktemp("ssmhub-cache"))  # subprocesses inherit it
    yield
    if previous is None:
        os.environ.pop(CACHE_DIR_ENV, None)
    else:
        os.environ[CACHE_DIR_ENV] = previous
