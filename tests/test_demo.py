"""The demo's schedule (fast) and a tiny end-to-end run (slow: `make test-all`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ssmhub.demo import lr_factor, main


def test_lr_factor_warmup_then_cosine():
    assert lr_factor(0, 0.0, warmup_steps=10) == pytest.approx(0.1)
    assert lr_factor(9, 0.0, warmup_steps=10) == pytest.approx(1.0)
    assert lr_factor(10, 0.0, warmup_steps=10) == pytest.approx(1.0)
    assert lr_factor(50, 0.5, warmup_steps=10) == pytest.approx(0.55)
    assert lr_factor(99, 1.0, warmup_steps=10) == pytest.approx(0.1)


@pytest.mark.slow
def test_demo_end_to_end_tiny(tmp_path, capsys):
    root = os.environ.get("SSMHUB_DATA_DIR")
    if not root or not (Path(root) / "wikitext-2").is_dir():
        pytest.skip("$SSMHUB_DATA_DIR with wikitext-2/ is needed (the demo would otherwise download from the Hub)")
    out = tmp_path / "demo"
    tiny_model = ["--hidden-size", "32", "--num-layers", "1", "--state-size", "8", "--intermediate-size", "0"]
    short_run = ["--max-steps", "5", "--seq-len", "32", "--batch-size", "4", "--vocab-size", "512", "--log-every", "1"]
    main(["--output-dir", str(out), *tiny_model, *short_run, "--eval-windows", "8", "--max-new-tokens", "5"])
    printed = capsys.readouterr().out
    assert "perplexity" in printed and "reload check:" in printed
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
