"""benchmarks/speculative.py: the 2-layer draft it trains copies the target's size, also for a target that went on
from a saved model (whose run records no model_config, only --model_name_or_path)."""

import os
import sys

import ssmhub
from ssmhub.training import TrainConfig, build_model_config

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import speculative

HYBRID = {"hidden_size": 48, "num_hidden_layers": 4, "attention_layers": [1, 3], "num_attention_heads": 2}


def test_the_draft_has_the_targets_size_and_two_layers(tmp_path):
    ssmhub.H3Config(vocab_size=64, max_kernel_length=32, **HYBRID).save_pretrained(tmp_path)
    fresh = {"model_type": "h3", "model_config": dict(HYBRID)}
    continued = {"model_type": "h3", "model_config": {}, "model_name_or_path": "runs/base"}
    default_length = ssmhub.H3Config().max_kernel_length  # the fresh run's model_config does not set it
    for run, kernel_length in ((fresh, default_length), (continued, 32)):
        model_config = speculative.draft_model_config(tmp_path, run)
        draft = build_model_config(TrainConfig(model_type="h3", model_config=model_config))
        assert (draft.hidden_size, draft.num_hidden_layers, draft.attention_layers) == (48, 2, [1])
        assert draft.max_kernel_length == kernel_length


def test_the_mamba_peer_table_has_both_libraries_and_ssmhubs_rows_keep_greedys_tokens():
    """``--mamba-peer`` at a tiny size: every method for both libraries, and ssmhub's prompt lookup with its greedy
    tokens and transformers Mamba's (greedy token ids: promised equal), bytes held for its crops."""
    args = speculative.parse_args(["--mamba-peer", "--no-write", "--repeats", "1", "--new-tokens", "16",
                                   "--peer-width", "32", "--peer-layers", "1", "--peer-vocab", "64",
                                   "--peer-prompt", "12"])  # fmt: skip
    setup, table = speculative.mamba_peer_sections(args)
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ssmhub")]
    assert "(32 tokens)" in setup and len(rows) == 3 and table.count("| transformers Mamba |") == 3
    for row in rows:
        assert row[5:7] == ["yes", "yes"]
        assert row[1] == "greedy" or int(row[7].rstrip(" |")) > 0
