"""A tiny end-to-end run of the demo (train, evaluate, reload, generate); slow: `make test-all`."""

import os
from pathlib import Path

import pytest

from ssmhub.demo import main


@pytest.mark.slow
def test_demo_end_to_end_tiny(tmp_path, capsys):
    root = os.environ.get("SSMHUB_DATA_DIR")
    if not root or not (Path(root) / "wikitext-2").is_dir():
        pytest.skip("$SSMHUB_DATA_DIR with wikitext-2/ is needed (the demo would otherwise download from the Hub)")
    out = tmp_path / "demo"
    tiny_model = ["--hidden-size", "32", "--num-layers", "1", "--state-size", "8", "--intermediate-size", "0"]
    short_run = ["--max-steps", "6", "--seq-len", "32", "--batch-size", "4", "--vocab-size", "512"]
    main(["--output-dir", str(out), *tiny_model, *short_run, "--eval-windows", "8", "--eval-max-length", "64",
          "--max-new-tokens", "5"])  # fmt: skip
    printed = capsys.readouterr().out
    assert "word ppl" in printed and "reloaded DLRForCausalLM" in printed
    assert "greedy continuations in the padded batch equal those generated one prompt at a time" in printed
    for name in ("config.json", "tokenizer.json", "README.md", "model.safetensors", "eval_wikitext-2_validation.json"):
        assert (out / name).is_file(), name
