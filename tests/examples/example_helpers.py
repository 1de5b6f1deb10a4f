"""Helpers of the examples' tests: a script's ``main`` is run in the test's process (a subprocess would spend
its seconds importing torch again)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LINES = [
    "the cat sat on the mat and the dog sat on the log",
    "a long sequence model reads the whole book and remembers the start",
    "every state restarts at the start of a document in a packed row",
    "the dog and the cat read the book on the mat",
] * 6


def load_example(relative_path: str):
    """The module of ``examples/<relative_path>``, imported fresh from its file."""
    path = EXAMPLES / relative_path
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
