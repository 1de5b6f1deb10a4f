"""The README's "Long documents" snippets run as written: packed rows with transformers' Trainer and collator, and
a truncated-BPTT loop by hand (which truncates)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def _snippet_with(text: str) -> str:
    """The README's python block under "## Long documents" that contains ``text``."""
    section = README.read_text(encoding="utf-8").split("## Long documents", 1)[1].split("\n## ", 1)[0]
    blocks = [b for b in re.findall(r"```python\n(.*?)```", section, re.S) if text in b]
    assert len(blocks) == 1, f"expected one python block with {text!r} under 'Long documents'; found {len(blocks)}"
    return blocks[0]


def test_the_tbptt_snippet_runs_as_written():
    torch.manual_seed(0)
    namespace: dict = {}
    exec(compile(_snippet_with("cache.detach_()"), "README.md", "exec"), namespace)
    cache = namespace["cache"]
    assert cache.get_seq_length() == 4 * 64
    assert all(not t.requires_grad for layer in cache.layers for t in layer.values())


def test_the_packed_trainer_snippet_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # it writes runs/packed-demo
    namespace: dict = {}
    exec(compile(_snippet_with("DataCollatorWithFlattening()"), "README.md", "exec"), namespace)
    assert namespace["trainer"].state.global_step == 2
    assert (tmp_path / "runs" / "packed-demo").is_dir()
