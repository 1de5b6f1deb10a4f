"""Every function in ``src/ssmhub/training`` fits on one screen: fewer than :data:`MAX_LINES` lines.

Read from the source with :mod:`ast`: a function's length runs from its first decorator (or ``def``) to
its last line, docstring, comments and blank lines included; methods and nested functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

TRAINING_SOURCES = Path(__file__).resolve().parents[2] / "src" / "ssmhub" / "training"
MAX_LINES = 80


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """``(name, first line, number of lines)`` of every function and method in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(decorator.lineno for decorator in node.decorator_list)])
            found.append((node.name, first, node.end_lineno - first + 1))
    return found


def test_the_count_spans_decorators_docstring_and_nested_functions():
    body = "\n".join(f"    x{i} = {i}" for i in range(75))
    source = f'@decorator\ndef outer():\n    """Doc."""\n    def inner():\n        pass\n{body}\n'
    assert sorted(function_lengths(source)) == [("inner", 4, 2), ("outer", 1, 80)]


def test_no_function_in_training_has_80_lines_or_more():
    files = sorted(TRAINING_SOURCES.rglob("*.py"))
    assert files, f"no sources under {TRAINING_SOURCES}"
    too_long = [
        f"{path.relative_to(TRAINING_SOURCES.parents[1])}:{line}: {name} has {length} lines"
        for path in files
        for name, line, length in function_lengths(path.read_text(encoding="utf-8"))
        if length >= MAX_LINES
    ]
    assert not too_long, f"functions of {MAX_LINES} lines or more (split them into named steps):\n" + "\n".join(
        too_long
    )
