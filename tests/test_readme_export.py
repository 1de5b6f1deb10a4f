"""The README's "Export and serve" snippet runs as written: it exports an H3 hybrid's decode step to ONNX, runs it
with onnxruntime and checks the tokens against generate's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_export_snippet_runs_as_written(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    section = README.read_text(encoding="utf-8").split("### Export and serve", 1)[1].split("\n## ", 1)[0]
    (snippet,) = re.findall(r"```python\n(.*?)```", section, re.S)
    monkeypatch.chdir(tmp_path)  # it writes h3_step.onnx
    namespace: dict = {}
    exec(compile(snippet, "README.md", "exec"), namespace)
    assert namespace["tokens"].shape == (1, 16)
    assert (tmp_path / "h3_step.onnx").is_file()
    assert isinstance(namespace["tokens"], torch.Tensor)
