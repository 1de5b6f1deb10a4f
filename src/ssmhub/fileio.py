"""Files written so that a crash never leaves one half-written: a temporary name, fsync, then rename."""

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["write_json_atomic", "write_text_atomic"]


def write_text_atomic(path: str | os.PathLike, text: str, mode: int = 0o644) -> Path:
    """Write ``text`` to ``path`` (creating its folder) through a temporary file in the same folder.

    The file gets permissions ``mode`` (``mkstemp`` alone would leave it readable by its owner only).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | os.PathLike, value: Any, sort_keys: bool = False) -> Path:
    """Write ``value`` as indented JSON (with a final newline) through :func:`write_text_atomic`."""
    return write_text_atomic(path, json.dumps(value, indent=2, sort_keys=sort_keys) + "\n")
