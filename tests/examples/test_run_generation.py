"""examples/generation/run_generation.py streams what model.generate gives, greedy or sampled."""

from __future__ import annotations

import pytest
import torch
from example_helpers import load_example
from transformers import AutoModelForCausalLM, AutoTokenizer

from ssmhub.models.modeling_recurrent import RecurrentForCausalLM


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


@pytest.mark.parametrize("flags", [["--prompt_lookup_num_tokens", "2"], ["--assistant_model", "SELF"]])
def test_prompt_lookup_and_assisted_decoding_give_greedys_tokens(tiny_lm, tmp_path, monkeypatch, flags):
    (tmp_path / "prompt.txt").write_text("the cat sat on the mat and the cat sat", encoding="utf-8")
    argv = [
        "--model_name_or_path",
        str(tiny_lm),
        "--prompt_file",
        str(tmp_path / "prompt.txt"),
        "--max_new_tokens",
        "8",
    ]
    run = load_example("generation/run_generation.py").main
    plain = run(argv)
    as_flag = ["--model_name_or_path", str(tiny_lm), "--prompt", "the cat sat on the mat and the cat sat"]
    assert plain == run([*as_flag, "--max_new_tokens", "8"])  # the file's text is the prompt
    seen = []
    generate = RecurrentForCausalLM.generate

    def spy(self, *args, **kwargs):
        seen.append(kwargs)
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(RecurrentForCausalLM, "generate", spy)
    assert run(argv + [str(tiny_lm) if flag == "SELF" else flag for flag in flags]) == plain
    option = flags[0].removeprefix("--")
    assert seen[0][option] is not None  # the decoding it asked for, not plain greedy


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--prompt_lookup_num_tokens", "0"], "--prompt_lookup_num_tokens is out of range"),
        (["--prompt_lookup_num_tokens", "2", "--assistant_model", "x"], "exclude each other"),
    ],
)
def test_bad_speculative_flags_are_named(tiny_lm, capsys, flags, message):
    with pytest.raises(SystemExit):
        load_example("generation/run_generation.py").main(["--model_name_or_path", str(tiny_lm), *flags])
    assert message in capsys.readouterr().err
