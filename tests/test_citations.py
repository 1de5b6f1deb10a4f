"""Sources cite papers and code a reader can open, never the project's private spec files.

The condensed specs the library was written from (``serpent.md``, ``longconv.md``, ``regular-lrnn.md``, ...)
are not in this repository, so "spec serpent.md §3" or "spec §2c" in a docstring points nowhere. A citation
names the paper (arXiv id, section, equation or table) or the authors' code, and where the code here departs
from the paper the docstring says how. This test reads every text file under ``src/ssmhub`` and the README
and fails naming each file and line that refers to a spec file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
SOURCES = REPOSITORY / "src" / "ssmhub"
SPEC_FILES = ("longconv", "serpent", "regular-lrnn", "dlr", "hf-integration", "reference-implementations")
# "spec §3", "specs/serpent.md", "spec regular-lrnn §1.2", "spec serpent.md §1", or a spec file's name alone (not a
# page of this repository's docs: docs/families/serpent.md).
SPEC_REFERENCE = re.compile(
    r"\bspecs?\b\s*(§|/|[a-z-]+(\.md)?\s*§)|(?<![/\w-])(" + "|".join(map(re.escape, SPEC_FILES)) + r")\.md\b",
    re.IGNORECASE,
)


def spec_references(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of each line where a reference to a spec file starts (it may span lines)."""
    lines = text.splitlines()
    starts = sorted({text.count("\n", 0, match.start()) + 1 for match in SPEC_REFERENCE.finditer(text)})
    return [(line, lines[line - 1].strip()) for line in starts]


def _text_files() -> list[Path]:
    files = [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").rglob("*.md"))]
    for path in sorted(SOURCES.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and b"\0" not in path.read_bytes():
            files.append(path)
    return files


@pytest.mark.parametrize(
    "text",
    [
        "implementation spec ``shared/specs/serpent.md`` §2",
        "causal windows (spec §3),",
        "- Spec §7: O(1)-per-token decoding",
        "time-step rank R (spec serpent.md §1 [M])",
        "(spec regular-lrnn §1.2, steps 2-3)",
        "the paper never says how it stays causal: specs/serpent.md §3",
        "no smaller exact state (spec longconv.md\n§6)",
        "see regular-lrnn.md for the settings",
        "Long-conv spec\n§6",
    ],
)
def test_a_reference_to_a_spec_file_is_found(text):
    assert spec_references(text), text


@pytest.mark.parametrize(
    "text",
    [
        "spec = importlib.util.find_spec(module)",
        "for name, spec in branch.state_layout(batch_size, dtype).items()",
        "spec, spec_c = even - odd, even + odd  # K[k], K̄[M − k]",
        "SeRpEnt (arXiv 2501.11729 §4.2, Eq. 12); the specification of the API",
        "the model card (``README.md``) and benchmarks/results/block_scan.md",
    ],
)
def test_ordinary_uses_of_the_word_are_not_flagged(text):
    assert spec_references(text) == []


def test_a_reference_names_the_line_it_starts_on_once():
    text = '"""Doc.\n\nSee spec ``specs/serpent.md`` §3.\nSee the spec\n§7.\n"""\n'
    assert spec_references(text) == [(3, "See spec ``specs/serpent.md`` §3."), (4, "See the spec")]


def test_no_source_file_cites_a_spec_file():
    files = _text_files()
    assert len(files) > 1, f"no sources under {SOURCES}"
    hits = [
        f"{path.relative_to(REPOSITORY)}:{line}: {content}"
        for path in files
        for line, content in spec_references(path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert not hits, (
        "cite the paper (arXiv id, section, equation) or the authors' code, not a spec file:\n" + "\n".join(hits)
    )
