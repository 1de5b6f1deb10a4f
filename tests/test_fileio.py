"""fileio: a file is either whole and in place or not there; a failed write leaves the old one."""

from __future__ import annotations

import stat

import pytest

from ssmhub.fileio import atomic_path, write_text_atomic


def test_atomic_path_renames_into_place_with_readable_permissions(tmp_path):
    target = tmp_path / "sub" / "file.bin"
    with atomic_path(target) as tmp:
        assert tmp.parent == target.parent and tmp != target
        tmp.write_bytes(b"payload")
        assert not target.exists()
    assert target.read_bytes() == b"payload"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in target.parent.iterdir()] == ["file.bin"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "file.txt"
    write_text_atomic(target, "old")
    with pytest.raises(RuntimeError, match="interrupted"):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("interrupted")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["file.txt"]
