"""benchmarks/h3_distillation.py: the language-model section's truncation control computes with exactly the
original kernels' first taps and zero beyond, and saves a model that loads."""

import os
import sys

import pytest
import torch

import ssmhub

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from h3_distillation import _parse_config, parse_args, truncated_copy


def _tiny_h3(folder) -> ssmhub.H3ForCausalLM:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = ssmhub.H3Config(
        vocab_size=32,
        hidden_size=16,
        num_hidden_layers=2,
        max_kernel_length=48,
        num_attention_heads=2,
        attention_layers=[],
    )
    model = ssmhub.H3ForCausalLM(config).eval()
    model.save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(32)}
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0"))).save_pretrained(folder)
    return model


def test_the_truncated_copy_keeps_the_first_taps_and_zeros_the_rest(tmp_path):
    model = _tiny_h3(tmp_path / "exact")
    truncated_copy(str(tmp_path / "exact"), 8, str(tmp_path / "cut"))  # checks itself that the logits on 8 tokens agree
    cut = ssmhub.H3ForCausalLM.from_pretrained(tmp_path / "cut").eval()
    assert cut.config.max_kernel_length == 8
    originals = [m for m in model.modules() if type(m).__name__ == "LongConvKernel" and m.max_kernel_length == 48]
    cuts = [m for m in cut.modules() if type(m).__name__ == "LongConvKernel" and m.max_kernel_length == 8]
    assert len(originals) == len(cuts) == 2
    with torch.no_grad():
        for original, short in zip(originals, cuts):
            # the cut's raw taps are a copy of the original's regularized ones, which this process computes again
            # by the same op on the same weights: exact
            assert torch.equal(short(48)[:, :8], original(48)[:, :8])
            assert not short(48)[:, 8:].any() and original(48)[:, 8:].abs().sum() > 0
        ids = torch.randint(0, 32, (1, 40))
        assert not torch.allclose(cut(ids).logits[:, 8:], model(ids).logits[:, 8:], atol=1e-6)


def test_configs_parse_with_and_without_a_tolerance_and_an_eigensolver():
    assert _parse_config("best:64") == ("best", 64, None, "truncated")
    assert _parse_config("hankel:16:0.05") == ("hankel", 16, 0.05, "truncated")
    assert _parse_config("best:16/dense") == ("best", 16, None, "dense")
    assert _parse_config("best:64:0.1/dense") == ("best", 64, 0.1, "dense")
    args = parse_args(["--model", "m", "--modes", "8", "16"])
    assert args.truncate_taps == [64] and args.configs is None


def test_speed_benchmark_rows_compare_the_two_eigensolvers_on_the_same_channels():
    from h3_distillation_speed import measure_size
    from h3_distillation_speed import parse_args as speed_args

    argv = ["--sizes", "16x1", "--modes", "4", "--max-kernel-length", "320", "--sample", "4", "--long-sample", "2"]
    args = speed_args(argv)
    args.dense_sample, args.repeats = 2, 1
    timing, errors = measure_size("16x1", args)
    assert timing[:3] == ["16x1", "16", 320]  # one H3 layer of 16 heads, every one fitted
    assert timing[8] == "not run" and errors[0][:2] == ["16x1", 2]
    assert errors[1][0].startswith("16x1, long support (") and errors[1][1] == 2  # supports of ≥ 80 taps (N 4)


def test_a_long_sample_larger_than_the_models_long_channels_is_refused_before_any_fit():
    from h3_distillation_speed import measure_size
    from h3_distillation_speed import parse_args as speed_args

    argv = ["--sizes", "16x1", "--modes", "4", "--max-kernel-length", "320", "--sample", "4", "--long-sample", "99"]
    with pytest.raises(SystemExit, match=r"--long-sample 99: this model has only \d+ channels of long support"):
        measure_size("16x1", speed_args(argv))
