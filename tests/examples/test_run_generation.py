"""examples/generation/run_generation.py streams what model.generate gives, greedy or sampled."""

from __future__ import annotations

import pytest
import torch
from example_helpers import load_example
from transformers import AutoModelForCausalLM, AutoTokenizer


def test_greedy_stream_is_model_generate(tiny_lm, capsys):
    texts = load_example("generation/run_generation.py").main(
        ["--model_name_or_path", str(tiny_lm), "--prompt", "the cat", "--max_new_tokens", "6"]
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm).eval()
    inputs = tokenizer("the cat", return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(**inputs, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    expected = tokenizer.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert texts == [expected]
    assert capsys.readouterr().out.strip() == expected.strip()


def test_sampling_is_seeded_and_prints_every_sequence(tiny_lm, capsys):
    argv = ["--model_name_or_path", str(tiny_lm), "--do_sample", "--top_p", "0.9", "--temperature", "1.5",
            "--num_return_sequences", "2", "--max_new_tokens", "5", "--seed", "3"]  # fmt: skip
    first = load_example("generation/run_generation.py").main(argv)
    assert first == load_example("generation/run_generation.py").main(argv) and len(first) == 2
    assert "=== sequence 2 ===" in capsys.readouterr().out


def test_out_of_range_sampling_flag_is_named(tiny_lm, capsys):
    with pytest.raises(SystemExit):
        load_example("generation/run_generation.py").main(["--model_name_or_path", str(tiny_lm), "--top_p", "0"])
    assert "--top_p" in capsys.readouterr().err
