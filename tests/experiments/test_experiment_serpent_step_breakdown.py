"""experiments/serpent_step_breakdown.py: its prefixes of the branches' decode step are the real step's pieces (all
of them update the stream as the step does), and a tiny run times every configuration and states the budget."""

import os
import sys

import torch

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments")
)
import serpent_step_breakdown
import serpent_vs_mamba

from ssmhub.layers.serpent_step import STREAM_FIELDS, stacked_weights, step_branches


def test_the_whole_prefix_advances_the_stream_as_the_real_step_does():
    args = serpent_vs_mamba.parse_args(["--width", "12", "--layers", "1", "--vocab-size", "32"])
    mixer = next(m for m in serpent_vs_mamba.build(args, [0.5, 0.1]).modules() if type(m).__name__ == "SerpentMixer")
    x = torch.randn(2, 9, mixer.hidden_size)
    with torch.no_grad():
        _, state = mixer(x[:, :8], return_state=True)
        stacked = mixer._part(state, "resampled")
        weights = stacked_weights(mixer, mixer.resampled)
        _, real = step_branches(weights, x[:, 8], stacked, None)
        for pieces in range(5):
            y, prefix = serpent_step_breakdown.prefix_step(pieces)(weights, x[:, 8], stacked, None)
            assert y.shape == (2, 2, mixer.branch_size) and not y.any()
            for name in STREAM_FIELDS:  # the prefix runs the real step's ops on the same inputs, in this call: exact
                assert torch.equal(prefix[name], real[name] if pieces >= 2 else stacked[name])


def test_a_tiny_run_times_every_configuration(capsys):
    threads = torch.get_num_threads()
    try:
        serpent_step_breakdown.main(
            ["--width", "12", "--layers", "1", "--vocab-size", "32", "--context", "6", "--steps", "2", "--rounds", "1",
             "--no-write"]
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    for piece in ["Mamba", "SeRpEnt", *serpent_step_breakdown.PIECES]:
        assert piece in out
    assert "leaves" in out and "× the budget" in out
