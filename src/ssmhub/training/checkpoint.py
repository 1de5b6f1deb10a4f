"""Atomic, verifiable training checkpoints in ``output_dir/checkpoints/step-N``.

A checkpoint is written by ``accelerator.save_state`` (model, optimizer, registered objects such as
the LR scheduler, and every process's RNG states) plus ``trainer_state.json`` (step, data-loader
position, ...) into a temporary folder, then ``complete.json`` is written last, listing every file
with its size and SHA-256, and the folder is renamed into place. A ``step-N`` folder therefore only
exists complete; one that lacks its marker or whose files do not match it is damaged, and loading
it raises :class:`CheckpointError` naming the path (a run never silently restarts from scratch).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from ..fileio import write_json_atomic

__all__ = [
    "MARKER",
    "STATE_FILE",
    "CheckpointError",
    "list_checkpoints",
    "load_checkpoint",
    "newest_checkpoint",
    "save_checkpoint",
    "verify_checkpoint",
]

MARKER = "complete.json"
STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_TMP_PREFIX = ".tmp-"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt."""


def checkpoints_dir(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / "checkpoints"


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The ``step-N`` folders under ``output_dir/checkpoints``, oldest first (complete or not)."""
    root = checkpoints_dir(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return [path for _, path in sorted(found)]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class _TiedWeightsFilter(logging.Filter):
    """Drops accelerate's "Removed shared tensor {'lm_head.weight'} while saving" at every checkpoint: safetensors
    stores a tied tensor once, and loading the state back into the model (whose LM head is its embedding
    matrix) restores both names, as :func:`load_checkpoint` does."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Removed shared tensor" not in record.getMessage()


@contextlib.contextmanager
def _quiet_about_tied_weights():
    logger, note = logging.getLogger("accelerate.utils.other"), _TiedWeightsFilter()
    logger.addFilter(note)
    try:
        yield
    finally:
        logger.removeFilter(note)


def save_checkpoint(
    accelerator,
    output_dir: str | os.PathLike,
    step: int,
    state: dict,
    keep_last: int = 0,
    write_process_files: Callable[[Path], None] | None = None,
) -> Path:
    """Save the accelerator's state and ``state`` as ``step-{step}`` atomically; keep the newest ``keep_last``.

    Every process must call it (``save_state`` writes each process's RNG state). ``write_process_files(folder)``,
    if given, runs on every process after ``save_state``: what each process writes into ``folder`` (e.g. the
    states a stateful run carries for its rows) is checksummed in the marker like every other file.
    """
    root = checkpoints_dir(output_dir)
    final = root / f"step-{step}"
    tmp = root / f"{_TMP_PREFIX}step-{step}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    with _quiet_about_tied_weights():
        accelerator.save_state(str(tmp))
    if write_process_files is not None:
        write_process_files(tmp)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_json_atomic(tmp / STATE_FILE, {"step": step, **state})
        files = {
            str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": _sha256(p)}
            for p in sorted(tmp.rglob("*"))
            if p.is_file()
        }
        write_json_atomic(tmp / MARKER, {"step": step, "files": files})  # written last: the folder is complete
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        if keep_last > 0:
            for old in list_checkpoints(output_dir)[:-keep_last]:
                shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


def _marker(path: Path) -> Path:
    """The completion marker of the checkpoint folder ``path``; CheckpointError if it has none."""
    marker = path / MARKER
    if not marker.is_file():
        raise CheckpointError(
            f"checkpoint {path} is incomplete or damaged: it has no {MARKER} marker (delete the folder to resume "
            "from an older checkpoint)"
        )
    return marker


def newest_checkpoint(output_dir: str | os.PathLike) -> Path:
    """The newest ``step-N`` folder under ``output_dir``, which must carry its completion marker (cheap:
    the checksums are verified when it loads). Raises CheckpointError when there is none or it is unmarked."""
    found = list_checkpoints(output_dir)
    if not found:
        raise CheckpointError(
            f"--resume: no checkpoint in {checkpoints_dir(output_dir)} (run without --resume to start from scratch)"
        )
    _marker(found[-1])
    return found[-1]


def verify_checkpoint(path: str | os.PathLike) -> dict:
    """Check a checkpoint folder against its marker; return its trainer state or raise CheckpointError."""
    path = Path(path)
    marker = _marker(path)
    try:
        files = json.loads(marker.read_text(encoding="utf-8"))["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise CheckpointError(f"checkpoint {path}: its marker {marker} is unreadable ({err})") from None
    for name, expected in files.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is damaged: file {file} is missing")
        if file.stat().st_size != expected["size"] or _sha256(file) != expected["sha256"]:
            raise CheckpointError(f"checkpoint {path} is damaged: file {file} does not match its recorded checksum")
    try:
        return json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"checkpoint {path}: cannot read {path / STATE_FILE} ({err})") from None


def load_checkpoint(accelerator, output_dir: str | os.PathLike) -> tuple[Path, dict]:
    """Restore the newest checkpoint under ``output_dir`` into ``accelerator``; return (path, trainer state).

    Raises CheckpointError when there is none or the newest is damaged.
    """
    path = newest_checkpoint(output_dir)
    state = verify_checkpoint(path)
    try:
        accelerator.load_state(str(path))
    except Exception as err:  # a file that passed the checksum can still fail to deserialize
        raise CheckpointError(f"checkpoint {path} could not be loaded: {type(err).__name__}: {err}") from err
    return path, state
