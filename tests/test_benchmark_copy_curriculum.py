"""benchmarks/copy_curriculum.py: a tiny hybrid passes a two-stage curriculum (an alphabet of 2 ids, then of 4) and is
saved where ``ssmhub-train --model_name_or_path`` can load it; bad --stages are refused by name."""

import os
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

import ssmhub

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import copy_curriculum


@pytest.fixture
def tiny_like(tmp_path):
    config = ssmhub.H3Config(
        vocab_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, attention_layers=[1],
        intermediate_size=64, max_kernel_length=16,
    )  # fmt: skip
    ssmhub.H3ForCausalLM(config).save_pretrained(tmp_path / "like")
    return tmp_path / "like"


def test_a_two_stage_curriculum_is_learned_and_saved(tiny_like, tmp_path):
    threads = torch.get_num_threads()
    try:
        argv = ["--like", str(tiny_like), "--output_dir", str(tmp_path / "out"), "--stages", "2:6,4:6"]
        argv += ["--min-distance", "4", "--steps", "1000", "--batch-tokens", "192", "--patience", "10"]
        argv += ["--learning-rate", "1e-2"]
        args = copy_curriculum.parse_args(argv)
        model, records = copy_curriculum.train_curriculum(args, log=lambda line: None)
    finally:
        torch.set_num_threads(threads)
    assert [r["alphabet"] for r in records] == [2, 4] and records[1]["from step"] == records[0]["to step"] + 1
    assert records[1]["repeat top-1"] >= 0.9  # the larger alphabet is copied by the end
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    for name, weight in model.state_dict().items():
        torch.testing.assert_close(saved.state_dict()[name], weight, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("stages", "message"),
    [("64", "'64' is not alphabet:max_distance"), ("1:16", "needs 2 <= alphabet <= 6"), ("all:8", "distance >= 16")],
)
def test_bad_stages_are_refused_by_name(stages, message):
    with pytest.raises(ValueError, match=f"--stages: .*{message}"):
        copy_curriculum.parse_stages(stages, vocab_size=8)
