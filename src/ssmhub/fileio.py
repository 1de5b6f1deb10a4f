"""Files written so that a crash never leaves one half-written: a temporary name, fsync, then rename."""

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["append_jsonl", "atomic_path", "read_jsonl", "write_json_atomic", "write_text_atomic"]


@contextmanager
def atomic_path(path: str | os.PathLike, mode: int = 0o644) -> Iterator[Path]:
    """Yield a temporary path next to ``path`` (creating the folder); on success it becomes ``path``.

    Whatever the body writes to the temporary path is fsynced, given permissions ``mode`` (``mkstemp``
    alone would leave it readable by its owner only) and renamed over ``path``; if the body raises,
    the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike, text: str, mode: int = 0o644) -> Path:
    """Write ``text`` to ``path`` (creating its folder) through a temporary file in the same folder."""
    with atomic_path(path, mode) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json_atomic(path: str | os.PathLike, value: Any, sort_keys: bool = False) -> Path:
    """Write ``value`` as indented JSON (with a final newline) through :func:`write_text_atomic`."""
    return write_text_atomic(path, json.dumps(value, indent=2, sort_keys=sort_keys) + "\n")


def append_jsonl(path: str | os.PathLike, record: Any) -> None:
    """Append ``record`` to ``path`` (creating its folder) as one JSON line, in a single write."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, default=str) + "\n")


def read_jsonl(path: str | os.PathLike) -> list[Any]:
    """The records of a JSON-lines file (empty if there is none), up to the first line torn by a killed writer."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line torn by a killed process: everything before it is whole
            break
    return records
