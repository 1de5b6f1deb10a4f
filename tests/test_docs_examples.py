"""Every Python code block of README.md and docs/ runs as written, so no example rots.

The blocks of one page run in order in one namespace (a page is a tutorial: later blocks use earlier names), in a
temporary working folder that holds what the examples load: ``runs/demo`` (a tiny saved DLR language model and its
tokenizer, standing in for ``make demo``'s folder) and ``state-spaces/mamba-130m-hf`` (a tiny transformers Mamba
folder: ``from_pretrained`` reads a local folder of that name before the Hub). Blocks fenced as plain text
(shell commands, signatures) are not Python and are not run.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(page: Path) -> list[str]:
    return PYTHON_BLOCK.findall(page.read_text(encoding="utf-8"))


PAGES_WITH_CODE = [page for page in PAGES if python_blocks(page)]


@pytest.fixture(scope="module")
def example_files(tmp_path_factory) -> Path:
    """The folders the examples load, built once: runs/demo and state-spaces/mamba-130m-hf."""
    import transformers

    import ssmhub
    from ssmhub.tokenization import train_bpe_tokenizer

    root = tmp_path_factory.mktemp("example-files")
    lines = ["The history of the river", "In 1998 , the town grew", "a first document .", "and a second one ."] * 8
    tokenizer = train_bpe_tokenizer(lines, vocab_size=300, min_frequency=1)
    torch.manual_seed(0)
    config = ssmhub.DLRConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, state_size=8,
                              pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                              bos_token_id=tokenizer.bos_token_id)  # fmt: skip
    ssmhub.DLRForCausalLM(config).save_pretrained(root / "runs" / "demo")
    tokenizer.save_pretrained(root / "runs" / "demo")
    mamba = transformers.MambaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, state_size=8)
    transformers.MambaForCausalLM(mamba).save_pretrained(root / "state-spaces" / "mamba-130m-hf")
    return root


def test_the_docs_have_python_examples():
    counts = {page.relative_to(ROOT).as_posix(): len(python_blocks(page)) for page in PAGES_WITH_CODE}
    assert sum(counts.values()) >= 10 and "README.md" in counts, counts


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_python_block_of_the_page_runs(page, example_files, tmp_path, monkeypatch):
    blocks = python_blocks(page)
    if any("onnxruntime" in block for block in blocks):
        pytest.importorskip("onnxruntime")
    if any("torchao_config" in block for block in blocks):
        pytest.importorskip("torchao")  # the "quantization" extra: make test-quantization runs this page
    shutil.copytree(example_files, tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)  # examples write files (runs/..., caches, ONNX) where they run
    namespace: dict = {"__name__": "__docs_example__"}
    for index, block in enumerate(blocks):
        exec(compile(block, f"{page.relative_to(ROOT)}, python block {index + 1}", "exec"), namespace)
