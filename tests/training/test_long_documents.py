"""``ssmhub-train --packing`` and ``--stateful`` (issue 26): what the rows hold, resumes to the same losses, bad
input."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from comparisons import MODEL_REL, scaled_close
from test_launch import _KILL_SCRIPT, VENV_BIN
from training_helpers import TRAINING_REL, losses, same_losses, tiny_args

from ssmhub import DLRConfig, DLRForCausalLM
from ssmhub.data import PackedWindows, TokenStream, packed_position_ids
from ssmhub.training.batches import window_inputs
from ssmhub.training.checkpoint import list_checkpoints, verify_checkpoint
from ssmhub.training.cli import main
from ssmhub.training.config import TrainConfig, config_from_args
from ssmhub.training.stateful import DocumentStreams, StatefulBatches, states_file
from ssmhub.training.trainer import train

DOCUMENT_LENGTHS = [5, 12, 1, 30, 7, 3]


def _stream(lengths=DOCUMENT_LENGTHS) -> TokenStream:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = (np.arange(offsets[-1], dtype=np.int32) * 7 + 3) % 61 + 2
    return TokenStream(tokens, offsets)


def _model() -> DLRForCausalLM:
    torch.manual_seed(0)
    config = DLRConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, state_size=8, intermediate_size=32)
    return DLRForCausalLM(config).train()


def _document_token_losses(model, stream: TokenStream) -> list[torch.Tensor]:
    """Each document alone, one forward: the loss of each of its tokens after the first."""
    out = []
    for d in range(len(stream)):
        ids = torch.from_numpy(stream.read(d, 0, stream.document_length(d)))[None]
        logits = model(ids).logits[0, :-1]
        out.append(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none"))
    return out


def test_packed_windows_restart_positions_at_each_document_and_window():
    stream, seq_len = _stream(), 8
    windows = PackedWindows(stream, seq_len)
    assert len(windows) == sum(DOCUMENT_LENGTHS) // seq_len
    both = [windows[i] for i in range(len(windows))]
    ids = torch.cat([w["input_ids"] for w in both])
    assert ids.tolist() == stream.tokens[: len(ids)].tolist()  # back to back, no padding
    starts = set(stream.offsets[:-1].tolist()) | set(range(0, len(ids), seq_len))
    zeros = {i for i, p in enumerate(torch.cat([w["position_ids"] for w in both]).tolist()) if p == 0}
    assert zeros == {s for s in starts if s < len(ids)}
    # window 2: the cut end of document 1, document 2 (one token), then document 3
    assert packed_position_ids(stream.offsets, 16, 8).tolist() == [0, 0, 0, 1, 2, 3, 4, 5]


def test_a_packed_batch_has_no_state_across_documents():
    """The loss of a packed batch is the mean loss of its documents' tokens, each run alone (first tokens skipped)."""
    model = _model()
    lengths = [5, 12, 1, 14]  # 32 tokens: two windows of 16, the 12-token document cut by the window edge
    stream = _stream(lengths)
    windows = PackedWindows(stream, 16)
    batch = torch.utils.data.default_collate([windows[0], windows[1]])
    packed = model(**window_inputs(batch)).loss
    pieces = _stream([5, 11, 1, 1, 14])  # the cut document is two documents: 11 tokens in window 0, 1 in window 1
    alone = torch.cat(_document_token_losses(model, pieces)).mean()
    # the tiny model computed two ways (packed rows, each document alone): a cross-entropy moves by at most twice its
    # logits' round-off, MODEL_REL of the largest logit, which is below the loss (~log 64) at initialization
    scaled_close(packed, alone, rel=MODEL_REL, what="packed loss")


def test_stateful_windows_score_every_document_as_one_long_forward():
    """A row reads documents window by window, its state carried: every token's loss is its loss in its
    document's single forward (each document's first token unscored); values equal, gradients truncated by design."""
    model = _model()
    stream = _stream()
    streams = DocumentStreams(stream, rows=1, seq_len=8, seed=0)
    order = streams._queue_order().tolist()  # the documents of epoch 0, in the order the row reads them
    alone = _document_token_losses(model, stream)
    expected = torch.cat([alone[d] for d in order])
    batches = StatefulBatches(streams, slice(0, 1), model.config.num_hidden_layers, "cpu")
    got = []
    for _ in range(sum(DOCUMENT_LENGTHS) // 8 + 1):  # 8 windows of 8 >= 58 tokens: every document is read
        inputs = batches.next_inputs()
        logits = model(**{k: v for k, v in inputs.items() if k not in ("labels", "shift_labels")}).logits[0]
        targets = inputs["shift_labels"][0]
        token_losses = torch.nn.functional.cross_entropy(logits, targets, reduction="none", ignore_index=-100)
        got.append(token_losses[targets != -100])
        batches.truncate()
    got = torch.cat(got)[: len(expected)]
    scaled_close(got, expected, rel=MODEL_REL, what="token losses")  # windows with a carried state vs one forward


def test_document_streams_resume_where_they_stood():
    streams = DocumentStreams(_stream(), rows=3, seq_len=5, seed=1)
    for _ in range(3):
        streams.next_window()
    again = DocumentStreams(_stream(), rows=3, seq_len=5, seed=1)
    again.load_state_dict(json.loads(json.dumps(streams.state_dict())))
    for _ in range(20):  # past an epoch end
        one, other = streams.next_window(), again.next_window()
        for name in one:
            assert (one[name] == other[name]).all(), name
    with pytest.raises(ValueError, match="rows=3; this run has 2"):
        DocumentStreams(_stream(), rows=2, seq_len=5, seed=1).load_state_dict(streams.state_dict())


def _train_in_a_process(args):
    """``ssmhub-train args`` in its own process (mixed precision fixes Accelerate's state for a whole process)."""
    done = subprocess.run([sys.executable, "-m", "ssmhub.training.cli", *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def _interrupted_and_resumed(args, kill_step):
    """Run ``args`` in a process that SIGKILLs itself while writing checkpoint ``kill_step``; then resume it."""
    done = subprocess.run(
        [sys.executable, "-c", _KILL_SCRIPT, str(kill_step), "files-written", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == -signal.SIGKILL, f"the kill hook did not fire:\n{done.stderr[-3000:]}"
    _train_in_a_process([*args, "--resume"])


STATEFUL = {
    "stateful": None,
    "max_steps": 6,
    "save_steps": 2,
    "eval_steps": 2,
    "gradient_accumulation_steps": 2,
    "mixed_precision": "bf16",
}


@pytest.mark.parametrize(
    "options", [STATEFUL, {"packing": None, "max_steps": 6, "save_steps": 2}], ids=["stateful", "packing"]
)
def test_a_sigkilled_run_resumes_to_the_same_losses(tiny_data_dir, tmp_path, options):
    """Stateful (gradient accumulation, bf16 autocast, carried states and row positions in the checkpoint) and
    packed runs, killed while writing step 4's checkpoint, resume from step 2 to the uninterrupted losses."""
    _train_in_a_process(tiny_args(tiny_data_dir, tmp_path / "full", **options))
    killed = tmp_path / "killed"
    _interrupted_and_resumed(tiny_args(tiny_data_dir, killed, **options), 4)
    # the same steps; each loss to round-off. The stateful run computes under bf16 autocast: bf16 keeps 8 significant
    # bits (u = 2^-9), and a float32 input one ulp apart can round to the neighbouring bf16 value, 2u ~ 4e-3 of
    # that term; the loss averages many terms, 1e-2 bounds it. The packed run is float32 (TRAINING_REL).
    rel = 1e-2 if options.get("mixed_precision") == "bf16" else TRAINING_REL
    same_losses(losses(killed), losses(tmp_path / "full"), rel=rel, what="train")
    same_losses(losses(killed, "validation"), losses(tmp_path / "full", "validation"), rel=rel, what="validation")
    if "stateful" in options:
        last = list_checkpoints(killed)[-1]
        assert "streams" in verify_checkpoint(last) and states_file(last, 0).is_file()


def test_stateful_two_processes_each_their_rows_match_one(tiny_pg19_dir, tmp_path):
    """PG-19 books streamed by 2 CPU processes x 2 rows give the losses of 1 process x 4 rows."""
    launch = [str(VENV_BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    launch += ["--mixed_precision", "no", "--dynamo_backend", "no", "-m", "ssmhub.training.cli"]
    options = {"dataset": "pg19", "stateful": None, "max_steps": 4, "save_steps": 2}
    two = tmp_path / "two"
    done = subprocess.run(
        [*launch, *tiny_args(tiny_pg19_dir, two, per_device_train_batch_size=2, **options)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert states_file(list_checkpoints(two)[-1], 1).is_file()
    main(tiny_args(tiny_pg19_dir, tmp_path / "one", per_device_train_batch_size=4, **options))
    same_losses(losses(two), losses(tmp_path / "one"))  # two computations of the same training: to round-off
    with pytest.raises(ValueError, match=r"num_processes is 1 but the run in .* used 2 .*one state per batch row"):
        train(config_from_args([*tiny_args(tiny_pg19_dir, two, per_device_train_batch_size=2, **options), "--resume"]))


def test_a_stateful_resume_with_another_batch_size_is_refused_before_any_work(tiny_data_dir, tmp_path):
    out = tmp_path / "run"
    main(tiny_args(tiny_data_dir, out, stateful=None, max_steps=2, save_steps=2))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(ValueError, match=r"per_device_train_batch_size is 2 but the run in .* used 4"):
        train(
            config_from_args([*tiny_args(tiny_data_dir, out, stateful=None, per_device_train_batch_size=2), "--resume"])
        )
    with pytest.raises(ValueError, match=r"stateful is False but the run in .* used True"):
        train(config_from_args([*tiny_args(tiny_data_dir, out, max_steps=4), "--resume"]))
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_packing_and_stateful_together_are_refused_by_name():
    with pytest.raises(ValueError, match="packing and stateful exclude each other"):
        TrainConfig(packing=True, stateful=True)


@pytest.mark.parametrize(
    ("model_type", "model_config", "says"),
    [
        ("gpt2", {"n_embd": 16, "n_layer": 1, "n_head": 2}, r"--stateful needs an ssmhub recurrent model .* 'gpt2'"),
        (
            "h3",
            {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "attention_layers": [1]},
            r"attention layers \[1\].*attention_window",
        ),
    ],
    ids=["gpt2", "hybrid-without-window"],
)
def test_stateful_training_refuses_a_model_whose_cache_grows(tiny_data_dir, tmp_path, model_type, model_config, says):
    """A cache that keeps every key and value of a book cannot be carried window to window: refused by name,
    before any data is read or anything written."""
    out = tmp_path / "run"
    args = tiny_args(tiny_data_dir, out, stateful=None, model_type=model_type, model_config=json.dumps(model_config))
    with pytest.raises(ValueError, match=says):
        train(config_from_args(args))
    assert not out.exists()


def test_a_hybrid_with_a_sliding_window_trains_statefully(tiny_data_dir, tmp_path):
    config = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "attention_layers": [1]}
    config["attention_window"] = 8
    main(tiny_args(tiny_data_dir, tmp_path / "run", stateful=None, max_steps=2, model_type="h3",
                   model_config=json.dumps(config)))  # fmt: skip
    assert losses(tmp_path / "run")


def test_carried_states_are_the_caches_one_format_and_old_checkpoints_still_load(tmp_path):
    """A checkpoint's carried states are the cache's ``state_dict`` as safetensors; a checkpoint written before
    (``stateful_states-<p>.pt``, ``torch.save`` of the layer dicts) loads into the same states."""
    model = _model()
    batches = StatefulBatches(DocumentStreams(_stream(), rows=2, seq_len=8, seed=0), slice(0, 2), 2, "cpu")
    with torch.no_grad():
        model(**{k: v for k, v in batches.next_inputs().items() if k not in ("labels", "shift_labels")})
    batches.save(tmp_path, 0)
    assert states_file(tmp_path, 0).suffix == ".safetensors"
    old = tmp_path / "old"
    old.mkdir()
    legacy = {"layers": [{k: v.clone() for k, v in layer.items()} for layer in batches.cache.layers],
              "seen_tokens": batches.cache.seen_tokens}  # fmt: skip
    torch.save(legacy, old / "stateful_states-0.pt")
    for folder in (tmp_path, old):
        resumed = StatefulBatches(DocumentStreams(_stream(), rows=2, seq_len=8, seed=0), slice(0, 2), 2, "cpu")
        resumed.load(folder, 0, batches.streams.state_dict())
        assert resumed.cache.seen_tokens == batches.cache.seen_tokens == 8
        for got, saved in zip(resumed.cache.layers, batches.cache.layers):
            assert got.keys() == saved.keys()
            assert all(torch.equal(got[k], saved[k]) for k in saved)  # a copy: the same bits
