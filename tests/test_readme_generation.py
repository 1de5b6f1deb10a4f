"""The README's "Assisted decoding, prompt lookup and saved prompt caches" snippets run as written, in order: the
assisted and prompt-lookup asserts, then the prompt cache saved, loaded and continued (greedy and prompt lookup)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_generation_snippets_run_as_written(tmp_path, monkeypatch):
    text = README.read_text(encoding="utf-8")
    section = text.split("### Assisted decoding, prompt lookup and saved prompt caches", 1)[1].split("\n### ", 1)[0]
    snippets = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(snippets) == 2
    monkeypatch.chdir(tmp_path)  # the second writes document.cache.safetensors
    namespace: dict = {}
    for snippet in snippets:
        exec(compile(snippet, "README.md", "exec"), namespace)
    assert (tmp_path / "document.cache.safetensors").is_file()
    assert namespace["looked_up"].shape == (1, 200 + 2 + 10)  # the last question's prompt and 10 new tokens
