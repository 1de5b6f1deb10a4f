"""benchmarks/serving.py without an engine: its prompts, its models of equal parameters, its tables and targets."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import serving
from _generate_floor import generate_floor_table, generate_floor_targets, median_rows
from _serving_chat import ANSWER_TOKENS, MESSAGE_TOKENS, chat_context, chat_table, chat_targets
from _serving_models import (
    SIZES,
    Size,
    _mamba2,
    _ssmhub_model,
    dlr_mlp_width,
    h3_mlp_width,
    non_embedding_parameters,
    save_models,
)
from _step_floor import decode_weights, median_rounds, state_per_request


def test_prompts_have_the_asked_lengths_and_no_pad_id():
    batch = serving.prompts(50, vocab=100, low=64, high=512)
    assert len(batch) == 50 and all(64 <= len(p) <= 512 for p in batch)
    assert all(0 < t < 100 for p in batch for t in p) and serving.prompts(50, 100, 64, 512) == batch  # seeded


def test_gpt2_takes_the_depth_whose_non_embedding_parameters_are_dlrs(tmp_path):
    tiny = Size("tiny", 64, 2, 128)
    counts = save_models(tiny, ["dlr", "gpt2", "mamba2"], tmp_path, max_len=256)
    per_layer = 12 * 64 * 64  # a GPT-2 block's weights: attention 4d², MLP 8d² (and biases, norms)
    assert abs(counts["gpt2"][1] - counts["dlr"][1]) <= per_layer
    assert all((tmp_path / name / "config.json").exists() for name in counts)


def test_non_embedding_parameters_leave_out_the_tables_and_the_head():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    tables = 50 * 16 + 32 * 16
    assert non_embedding_parameters(model) == sum(p.numel() for p in model.parameters()) - tables


def _rows():
    def row(model, engine, c, tok_s):
        return {"model": model, "engine": engine, "C": c, "tok_s": tok_s, "tpot_ms": 1.0, "wall_s": 1.0}

    return [row("dlr", "vLLM", 32, 900.0), row("dlr", "generate", 32, 100.0), row("mamba2", "vLLM", 32, 1000.0)]


def test_the_tables_and_targets_read_the_rows():
    params = {"dlr": (2_000_000, 1_000_000), "mamba2": (2_100_000, 1_050_000)}
    table = "\n".join(serving.concurrency_table(_rows(), params))
    assert "| dlr | 2.00M (1.00M) | vLLM | 900 (1.0) | 9.0× | 0.9× |" in table
    long = [
        {"model": "gpt2", "prompt": 8192, "fit": 3, "served": 3, "tok_s": 100.0},
        {"model": "dlr", "prompt": 8192, "fit": 120, "served": 12, "tok_s": 150.0},
    ]
    assert "| dlr | 8192 | 120 | 40.0× | 12 | 150 | 1.5× |" in "\n".join(serving.long_table(long))
    targets = "\n".join(serving.target_lines(_rows(), long))
    assert "dlr: vLLM ≥ 10× generate at 32 requests: **missed** (9.0×)" in targets
    assert "dlr: ≥ 0.8× vLLM's Mamba-2 at 32 requests: **met** (0.90×)" in targets
    assert "≥ 4× GPT-2's requests **met** (40×), ≥ 2× its tokens/s **missed** (1.5×" in targets


@pytest.mark.parametrize("argv", [["--concurrency", "0"], ["--repeats", "0"], ["--long-factor", "0"],
                                  ["--step-floor", "-1"], ["--generate-floor", "0"], ["--chat-turns", "-1"],
                                  ["--chat-conversations", "0"], ["--baseline-src", "/nonexistent"],
                                  ["--step-floor-rounds", "0"]])  # fmt: skip
def test_bad_arguments_are_refused_by_name(argv, capsys):
    with pytest.raises(SystemExit):
        serving.parse_args(argv)
    assert argv[0] in capsys.readouterr().err


def test_both_sizes_are_defined():
    assert SIZES["small"].hidden < SIZES["100m"].hidden and SIZES["100m"].vocab % 64 == 0


def test_dlr_h3_and_serpent_are_compared_to_mamba2_at_equal_decode_weights_and_state():
    """Issue 71's equal footing: DLR's and H3's decode weights within one 64-wide MLP block per layer of Mamba-2's,
    and every recurrent state within 5% of Mamba-2's bytes per request (its conv window is the difference)."""
    tiny = Size("tiny", 128, 2, 256)
    assert (dlr_mlp_width(768), h3_mlp_width(768)) == (1920, 896)
    mamba2 = _mamba2(tiny)
    models = {name: _ssmhub_model(name, tiny) for name in ("dlr", "h3-ssm", "serpent-mamba")}
    weights = {name: sum(w.numel() for w in decode_weights(model))
               for name, model in [*models.items(), ("mamba2", mamba2)]}  # fmt: skip
    dlr_ssm_weights = 2 * tiny.hidden * 128 * tiny.layers  # DLR's w, read by its step but 3-d (H, N, 2)
    assert abs(weights["dlr"] + dlr_ssm_weights - weights["mamba2"]) <= 2 * tiny.hidden * 64 * tiny.layers
    assert abs(weights["h3-ssm"] - weights["mamba2"]) <= 2 * tiny.hidden * 64 * tiny.layers
    reference = state_per_request("mamba2", mamba2, context=0)["bytes"]
    for name in ("dlr", "h3-ssm", "serpent-mamba"):
        state = state_per_request(name, models[name], context=0)
        assert state["writes"] and abs(state["bytes"] - reference) <= 0.05 * reference


def test_decode_weights_count_the_head_once_and_transpose_gpt2s_conv1d():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    shapes = sorted(tuple(w.shape) for w in decode_weights(model))
    assert shapes == sorted([(50, 16), (48, 16), (16, 16), (64, 16), (16, 64)])  # head, qkv, proj, fc, fc-proj
    kv = state_per_request("gpt2", model, context=10)
    assert kv == {"bytes": 2 * 1 * 16 * 4 * 10, "writes": False}


def _floor_row(model, step_ms, floor_ms, round_index=0):
    """One engine's row as ``_step_floor.py`` prints it, with the round ``serving.step_floor_rows`` adds."""
    return {"model": model, "rows": 32, "decode_params": 84e6, "state_bytes": 9_695_232, "step_ms": step_ms,
            "forward_ms": step_ms - 8, "products_ms": floor_ms - 1, "products_alone_ms": floor_ms - 3,
            "state_ms": 1.0, "state_fresh_ms": 1.5, "floor_ms": floor_ms, "floor_fraction": floor_ms / step_ms,
            "tok_s": 32e3 / step_ms, "round": round_index}  # fmt: skip


def test_the_step_floor_table_and_targets_read_the_rows():
    row = _floor_row
    rows = median_rounds([row("dlr", 40.0, 30.0), row("bdlrnn", 50.0, 36.0), row("mamba2", 35.0, 30.0)])
    table = "\n".join(serving.step_floor_table(rows))
    assert (
        "| dlr | 84.00M | 9,695,232 | 40.0 | 32.0 | 800 | 0.88× | 29.00 | 27.00 | 1.00 | 1.50 | 30.00 | 75% |" in table
    )
    targets = "\n".join(serving.step_floor_targets(rows))
    assert "dlr: ≥ 1.0× vLLM's Mamba-2 decode tokens/s at 32 requests: **missed** (0.88×)" in targets
    assert "dlr: ≥ 80% of its byte floor: **missed** (75%)" in targets
    assert "bdlrnn: ≥ 70% of its byte floor: **met** (72%)" in targets and "bdlrnn: ≥ 1.0×" not in targets
    change = serving.step_floor_change_table([rows[0], rows[2]], median_rounds([row("dlr", 50.0, 30.0)]))
    assert change[2:] == ["| dlr | 50.0 | 40.0 | 1.25× | 60% | 75% |"]  # mamba2: no baseline row, none here


def test_rounds_of_step_floor_rows_read_as_medians_and_each_rounds_ratio_to_mamba2():
    """DLR's step is the median of its rounds, its range beside it, and its ratio to Mamba-2 the median of each
    round's ratio, so that a slow round moves both engines it timed."""
    steps = [(100.0, 110.0), (120.0, 118.0), (105.0, 112.0)]  # (dlr, mamba2) per round
    rows = median_rounds([_floor_row(model, step, 90.0, i) for i, pair in enumerate(steps)
                          for model, step in zip(("dlr", "mamba2"), pair)])  # fmt: skip
    dlr = rows[0]
    assert (dlr["step_ms"], dlr["step_range"], dlr["rounds"]) == (105.0, (100.0, 120.0), 3)
    assert dlr["floor_fraction"] == 90.0 / 105.0 and dlr["tok_s"] == 32e3 / 105.0
    assert dlr["vs_mamba2"] == pytest.approx(112.0 / 105.0, rel=1e-12)  # per round 1.10, 0.98, 1.07
    table = "\n".join(serving.step_floor_table(rows))
    assert "| dlr | 84.00M | 9,695,232 | 105.0 (100.0-120.0) | 97.0 | 305 | 1.07× |" in table
    drifting = [(100.0, 110.0), (200.0, 180.0), (300.0, 330.0)]  # per round 1.1, 0.9, 1.1; medians 200 and 180
    rows = median_rounds([_floor_row(model, step, 90.0, i) for i, pair in enumerate(drifting)
                          for model, step in zip(("dlr", "mamba2"), pair)])  # fmt: skip
    assert rows[0]["vs_mamba2"] == pytest.approx(110.0 / 100.0, rel=1e-12)  # not 180 / 200, the medians' ratio
    alone = median_rounds([_floor_row("dlr", 40.0, 30.0)])
    assert alone[0]["vs_mamba2"] is None and "| 40.0 | 32.0 | 800 | – |" in serving.step_floor_table(alone)[2]


def test_the_generate_floor_table_and_targets_read_both_runs():
    def row(model, batch, step_ms):
        return {"model": model, "batch": batch, "step_ms": step_ms, "floor_ms": 20.0, "tok_s": 1e3 * batch / step_ms}

    now, before = [row("dlr", 32, 40.0), row("h3", 32, 80.0), row("h3", 1, 10.0)], [row("dlr", 32, 160.0)]
    before.append(row("h3", 32, 100.0))
    table = "\n".join(generate_floor_table(now, before))
    assert "| dlr | 32 | 160.0 | 40.0 | 4.00× | 800 | 20.00 | 12% | 50% |" in table
    assert "| h3 | 1 | – | 10.0 | – | 100 | 20.00 | – | 200% |" in table  # no run before: dashes
    targets = "\n".join(generate_floor_targets(now, before))
    assert "dlr: generate at 32 rows ≥ 2× the tokens/s before: **met** (4.00×)" in targets
    assert "h3: generate at 32 rows ≥ 2× the tokens/s before: **missed** (1.25×)" in targets


def test_rounds_of_generate_floor_rows_read_as_their_medians():
    def row(batch, step_ms, floor_ms):
        return {"model": "dlr", "batch": batch, "step_ms": step_ms, "floor_ms": floor_ms, "products_ms": floor_ms,
                "state_ms": 0.0, "tok_s": 1e3 * batch / step_ms, "numba": "0.68.1"}  # fmt: skip

    rounds = [row(32, 40.0, 20.0), row(1, 10.0, 4.0), row(32, 90.0, 22.0), row(32, 50.0, 30.0), row(1, 12.0, 6.0)]
    medians = {r["batch"]: r for r in median_rows(rounds)}
    assert (medians[32]["step_ms"], medians[32]["floor_ms"], medians[32]["tok_s"]) == (50.0, 22.0, 640.0)
    assert (medians[1]["step_ms"], medians[1]["floor_ms"], medians[1]["numba"]) == (11.0, 5.0, "0.68.1")


def test_the_chat_table_and_targets_read_the_turns():
    def turn(model, t, ttft, prefilled):
        prompt = t * MESSAGE_TOKENS + (t - 1) * ANSWER_TOKENS
        return {"model": model, "turn": t, "prompt": prompt, "prefilled": prefilled, "ttft_ms": ttft,
                "ttft_p90_ms": 2 * ttft, "tok_s": 100.0}  # fmt: skip

    rows = [turn("gpt2", 1, 100, 512), turn("gpt2", 2, 300, 700), turn("gpt2", 3, 500, 900)]
    rows += [{"model": "gpt2", "fit": 4, "block": 128}, turn("dlr", 1, 90, 512), turn("dlr", 2, 80, 520)]
    rows += [turn("dlr", 3, 110, 530), {"model": "dlr", "fit": 40, "block": 16}, {"model": "mamba2", "failed": 1}]
    table = "\n".join(chat_table(rows))
    assert "| dlr | 40 | 90 (180) ms, 512 of 512, 100 tok/s | 80 (160) ms, 520 of 1152, 100 tok/s |" in table
    assert "| mamba2 (failed, exit 1) | – | – | – | – |" in table
    targets = "\n".join(chat_targets(rows))
    assert (
        "dlr: TTFT below GPT-2's at every turn from 2: **met**; flat (turn 3 ÷ turn 2 ≤ 1.5×): **met** (1.38×)"
        in targets
    )
    assert "prefilled ≤ the new 512 + a block of 16: **missed** (18 more)" in targets
    assert "dlr: ≥ 8× GPT-2's conversations at the last turn: **met** (40 against 4)" in targets
    assert chat_context(8) == 8 * (MESSAGE_TOKENS + ANSWER_TOKENS)
