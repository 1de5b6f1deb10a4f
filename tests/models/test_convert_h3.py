"""``ssmhub-convert-h3``: tiny models in the released checkpoints' exact key layout and shapes, converted, give the
logits the authors' own code computed for them (``tests/models/data/h3_authors``: the script that made the files
and what computed each reference are in its README), and decode through the cache as their full forward does.

Tolerances. ssmhub's H3 layer computes its projections' outputs, SSM kernels and FFT convolutions in float32 by
design (recurrence parameters and FFTs stay float32, also in a float64 model), so it is held to the authors' float64
results within float32 round-off: one layer within FP32_REL (1e-5 of max|y|: an FFT convolution and a 64-mode
kernel, ~40 rounded stages), a whole tiny model within MODEL_REL (tests/comparisons.py). The authors' float64
references are float64 except one step: their parallel path rounds the shift SSM's kernel to float32 and takes its
FFT in complex64 (``ss_kernel_shift.py`` ``k.float()``, then ``rfft`` in ``h3.py``), ≈ 1e-6 of a layer's output,
well inside both; their recurrence (``H3.step`` from zero states, ``y_recurrent_float64``) is float64 throughout.
Greedy tokens are compared exactly: the authors' decode's smallest top-1/top-2 logit gap is 7.7e-3, over 20x the
MODEL_REL bound on max|logits| ≈ 13 here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from comparisons import FP32_REL, MODEL_REL, same_values, scaled_close
from transformers import AutoModelForCausalLM

import ssmhub
from ssmhub.layers.h3 import H3Mixer
from ssmhub.models.h3.convert_h3 import convert_h3_checkpoint, main
from ssmhub.models.h3.released_checkpoint import (
    H3Architecture,
    h3_layer_weights,
    load_checkpoint,
    read_architecture,
    rename_legacy_keys,
    ssmhub_state_dict,
)
from ssmhub.tokenization import train_bpe_tokenizer

FIXTURES = Path(__file__).parent / "data" / "h3_authors"
MODELS = ["rotary", "plain"]


def _authors(name: str):
    """(checkpoint path, the authors' constructor arguments, their reference tensors) of fixture ``name``."""
    arguments = json.loads((FIXTURES / f"{name}.json").read_text())
    reference = torch.load(FIXTURES / f"{name}.reference.pt", weights_only=True)
    return FIXTURES / f"{name}.model.pt", arguments, reference


def _heads(arguments: dict) -> int:
    return arguments["attn_cfg"]["num_heads"]


def _convert(name: str, **kwargs):
    checkpoint, arguments, _ = _authors(name)
    return convert_h3_checkpoint(checkpoint, tokenizer=None, num_attention_heads=_heads(arguments), **kwargs)


@pytest.mark.parametrize("name", MODELS)
def test_the_architecture_is_read_from_the_keys(name):
    _checkpoint, arguments, _ = _authors(name)
    model = _convert(name)
    config = model.config
    assert config.hidden_size == arguments["d_model"] and config.num_hidden_layers == arguments["n_layer"]
    assert config.attention_layers == arguments["attn_layer_idx"]
    assert config.intermediate_size == arguments["d_inner"]
    assert config.vocab_size % 8 == 0 and config.vocab_size >= arguments["vocab_size"]  # padded as the authors do
    assert config.ssm_state_size == arguments["ssm_cfg"].get("d_state", 64) // 2  # d_state counts 2N
    assert config.ssm_discretization == "bilinear" and config.hidden_act == "gelu_pytorch_tanh"
    assert config.rotary_emb_dim == arguments["attn_cfg"].get("rotary_emb_dim", 0)


@pytest.mark.parametrize("name", MODELS)
def test_logits_equal_the_authors(name):
    _, _, reference = _authors(name)
    model = _convert(name)
    with torch.no_grad():
        logits = model(reference["input_ids"]).logits
    assert logits.dtype == torch.float32
    same_values(logits.double(), reference["logits_float64"], rel=MODEL_REL, what="logits")


@pytest.mark.parametrize("name", MODELS)
def test_the_written_folder_loads_with_auto_classes(name, tmp_path):
    _, arguments, reference = _authors(name)
    checkpoint = FIXTURES / f"{name}.model.pt"
    model = convert_h3_checkpoint(checkpoint, tmp_path / "out", tokenizer=None, num_attention_heads=_heads(arguments))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert isinstance(loaded, ssmhub.H3ForCausalLM)
    ids = reference["input_ids"]
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)  # the same weights, op and inputs
    assert not list(tmp_path.glob(".out.*"))  # the staging folder was renamed, nothing left beside it


@pytest.mark.parametrize("name", MODELS)
def test_cached_generation_equals_the_full_forward_greedy_and_sampled(name):
    _, _, reference = _authors(name)
    model = _convert(name)
    prompt = reference["input_ids"][:, :16]
    greedy = model.generate(prompt, max_new_tokens=8, do_sample=False, use_cache=True)
    uncached = model.generate(prompt, max_new_tokens=8, do_sample=False, use_cache=False)
    assert torch.equal(greedy, uncached)  # greedy tokens: promised equal
    assert torch.equal(greedy[:, 16:], reference["greedy_tokens"])  # the authors' own cached decode's tokens
    with torch.no_grad():
        ours = model.generate(
            prompt, max_new_tokens=8, do_sample=False, output_logits=True, return_dict_in_generate=True
        )
    theirs = reference["greedy_logits_float64"]  # their decode: a prompt forward (parallel path), then steps
    scaled_close(torch.stack(ours.logits, 1).double(), theirs, rel=MODEL_REL, what="cached decode logits")
    torch.manual_seed(0)
    sampled = model.generate(
        prompt, max_new_tokens=8, do_sample=True, top_k=0, output_logits=True, return_dict_in_generate=True
    )
    with torch.no_grad():
        full = model(sampled.sequences).logits[:, 15:-1]  # the logits each sampled token was drawn from
    same_values(torch.stack(sampled.logits, 1), full, rel=MODEL_REL, what="cached logits of a sampled sequence")
    torch.manual_seed(0)
    again = model.generate(prompt, max_new_tokens=8, do_sample=True, top_k=0, use_cache=False)
    assert torch.equal(again, sampled.sequences)


def _authors_layer(name: str = "h3_layer"):
    """ssmhub's H3 layer with the weights of the authors' lone H3 layer ``name`` (d 32, d_state 64) and the
    references their code computed for it."""
    state_dict = torch.load(FIXTURES / f"{name}.model.pt", weights_only=True)
    reference = torch.load(FIXTURES / f"{name}.reference.pt", weights_only=True)
    remaining = {f"layer.mixer.{key}": value for key, value in state_dict.items()}
    hidden, taps = state_dict["q_proj.weight"].shape[0], state_dict["ssm_k_kernel.kernel.B"].shape[-1]
    arch = H3Architecture(
        vocab_size=0, hidden_size=hidden, num_layers=1, intermediate_size=0, attention_layers=(),
        ssm_heads=state_dict["D"].shape[0], ssm_state_size=state_dict["kernel.kernel.A_imag"].shape[-1],
        shift_kernel_size=taps, rotary_emb_dim=None, rotary_emb_base=None,
    )  # fmt: skip
    weights = h3_layer_weights(lambda key: remaining.pop(key).float(), "layer", arch)
    assert not remaining  # every tensor of the authors' layer has its place
    heads = None if arch.head_dim == 1 else arch.ssm_heads
    mixer = H3Mixer(
        hidden,
        kernel_type="diagonal_ssm",
        ssm_state_size=arch.ssm_state_size,
        shift_kernel_size=taps,
        ssm_num_heads=heads,
    )  # fmt: skip  (bilinear: the default)
    mixer.load_state_dict(weights)
    return mixer.eval(), reference


def test_one_layer_equals_the_authors_forward_step_and_prefill():
    """At the authors' default configuration (bilinear, d_state 64): the forward, the O(N) step token by token and a
    prefill followed by steps, each against the authors' float64 recurrence within float32 round-off (and their
    parallel form, which differs from it by ~1e-6)."""
    mixer, reference = _authors_layer()
    u = reference["u"].float()
    exact = reference["y_recurrent_float64"]
    prefix = int(reference["prefix_len"])
    with torch.no_grad():
        forward, _ = mixer(u)
        stepped, _ = _steps(mixer, u, mixer.init_state(1))
        head, state = mixer(u[:, :prefix], return_state=True)
        tail, _ = _steps(mixer, u[:, prefix:], state)
    scaled_close(forward.double(), exact, rel=FP32_REL, what="forward vs the authors' recurrence")
    scaled_close(forward.double(), reference["y_float64"], rel=FP32_REL, what="forward vs their parallel form")
    scaled_close(stepped.double(), exact, rel=FP32_REL, what="steps vs the authors' recurrence")
    prefill = torch.cat([head, tail], 1).double()
    scaled_close(prefill, reference["y_prefix_step_float64"], rel=FP32_REL, what="prefill then steps vs theirs")


def test_a_layer_with_two_channels_per_head_equals_the_authors_forward():
    """head_dim 2 (16 SSM heads of 2×2 outer products): the output channels come in the authors' order d2·H + h and
    the converter permutes them into ssmhub's h·d_h + j; their parallel forward is the reference (their decode raises
    for head_dim > 1). The same model decodes step by step to its own forward."""
    mixer, reference = _authors_layer("h3_layer_head_dim2")
    assert mixer.num_heads == 16 and mixer.head_dim == 2
    u = reference["u"].float()
    with torch.no_grad():
        forward, _ = mixer(u)
        stepped, _ = _steps(mixer, u, mixer.init_state(1))
    scaled_close(forward.double(), reference["y_float64"], rel=FP32_REL, what="forward vs the authors'")
    scaled_close(stepped, forward, rel=FP32_REL, what="steps vs forward")


def _steps(mixer, u, state):
    outputs = []
    for t in range(u.shape[1]):
        y_t, state = mixer(u[:, t : t + 1], state=state, return_state=True)
        outputs.append(y_t)
    return torch.cat(outputs, 1), state


def test_a_lightning_checkpoint_converts_to_the_same_weights(tmp_path):
    checkpoint, _arguments, _ = _authors("plain")
    plain = torch.load(checkpoint, weights_only=True)
    lightning = {
        "pytorch-lightning_version": "1.8.6",
        "state_dict": {f"model.{key}": value for key, value in plain.items()},
        "epoch": 3,
    }
    torch.save(lightning, tmp_path / "model.pt")
    assert load_checkpoint(tmp_path / "model.pt").keys() == plain.keys()
    _assert_same_weights(load_checkpoint(tmp_path / "model.pt"), plain)


def test_old_key_names_and_the_post_norm_order_are_remapped():
    """The old layout as the authors' ``SSMLMHeadModel.load_state_dict`` reads it: ``s4seq.encoder.``, ``embedding.``
    and ``backbone.norm`` names, and the LayerNorms one slot later (``norm`` before the first layer, each layer's
    ``norm1`` after its mixer, ``norm2`` after its MLP; no ``ln_f``)."""
    checkpoint, _, _ = _authors("plain")
    current = torch.load(checkpoint, weights_only=True)
    layers = 1 + max(int(key.split(".")[2]) for key in current if key.startswith("backbone.layers."))
    old = {}
    for key, value in current.items():
        if ".norm1." in key or ".norm2." in key or key.startswith("backbone.ln_f."):
            continue
        key = key.replace("backbone.embeddings.word_embeddings.", "embedding.").replace("backbone.", "s4seq.encoder.")
        old[key] = value
    for name in ("weight", "bias"):
        old[f"s4seq.encoder.norm.{name}"] = current[f"backbone.layers.0.norm1.{name}"]
        for layer in range(layers):
            old[f"s4seq.encoder.layers.{layer}.norm1.{name}"] = current[f"backbone.layers.{layer}.norm2.{name}"]
            after_mlp = f"backbone.layers.{layer + 1}.norm1.{name}" if layer + 1 < layers else f"backbone.ln_f.{name}"
            old[f"s4seq.encoder.layers.{layer}.norm2.{name}"] = current[after_mlp]
    renamed = rename_legacy_keys(old)
    assert renamed.keys() == current.keys()
    assert all(torch.equal(renamed[key], current[key]) for key in current)  # moved, not recomputed


def _assert_same_weights(state_dict, reference):
    arch = read_architecture(reference)
    converted, expected = ssmhub_state_dict(state_dict, arch), ssmhub_state_dict(reference, arch)
    assert converted.keys() == expected.keys()
    assert all(torch.equal(converted[key], expected[key]) for key in expected)


# ------------------------------------------------------------------------------------------- bad checkpoints


def _broken(tmp_path, edit):
    checkpoint, _, _ = _authors("plain")
    state_dict = torch.load(checkpoint, weights_only=True)
    edit(state_dict)
    torch.save(state_dict, tmp_path / "model.pt")
    return tmp_path / "model.pt"


EMBEDDINGS = "backbone.embeddings.word_embeddings.weight"
BROKEN = [  # (an edit of the checkpoint, the message naming its key)
    (
        lambda sd: sd.pop("backbone.layers.0.mixer.kernel.kernel.log_dt"),
        r"'backbone\.layers\.0\.mixer\.kernel\.kernel\.log_dt' is missing",
    ),
    (
        lambda sd: sd.update({"backbone.layers.2.mlp.fc1.weight": torch.zeros(7, 32)}),
        r"'backbone\.layers\.2\.mlp\.fc1\.weight' has shape \[7, 32\], expected \[64, 32\]",
    ),
    (
        lambda sd: sd.update({"backbone.layers.0.mixer.extra": torch.zeros(3)}),
        r"'backbone\.layers\.0\.mixer\.extra' .*has no place in an ssmhub H3",
    ),
    (
        lambda sd: sd.update({"backbone.embeddings.position_embeddings.weight": torch.zeros(8, 32)}),
        r"position_embeddings\.weight'.*no ssmhub H3 counterpart",
    ),
    (
        lambda sd: sd.update({"lm_head.weight": torch.zeros_like(sd[EMBEDDINGS])}),
        r"'lm_head\.weight' differs from the word embeddings",
    ),
]


@pytest.mark.parametrize(("edit", "message"), BROKEN)
def test_a_checkpoint_that_does_not_fit_is_refused_naming_the_key(tmp_path, edit, message):
    path = _broken(tmp_path, edit)
    with pytest.raises(ValueError, match=message):
        convert_h3_checkpoint(path, tmp_path / "out", tokenizer=None, num_attention_heads=4)
    assert not (tmp_path / "out").exists()  # nothing written


def test_arguments_the_checkpoint_contradicts_or_needs_are_refused(tmp_path):
    checkpoint, _arguments, _ = _authors("rotary")
    with pytest.raises(ValueError, match=r"--rotary_emb_dim\) is 4, but the checkpoint's rotary_emb\.inv_freq says 8"):
        convert_h3_checkpoint(checkpoint, tokenizer=None, num_attention_heads=2, rotary_emb_dim=4)
    with pytest.raises(ValueError, match=r"num_attention_heads \(--num_attention_heads\) is needed: width 32"):
        convert_h3_checkpoint(checkpoint, tokenizer=None)
    too_many = train_bpe_tokenizer(["a tokenizer of more tokens than the model has rows"] * 4, vocab_size=300)
    too_many.save_pretrained(tmp_path / "tokenizer")
    with pytest.raises(ValueError, match=rf"has {len(too_many)} tokens, more than the checkpoint's 64 embedding rows"):
        convert_h3_checkpoint(checkpoint, tmp_path / "out", tokenizer=tmp_path / "tokenizer", num_attention_heads=2)
    assert not (tmp_path / "out").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    with pytest.raises(ValueError, match=r"OUTPUT_DIR .*full is not empty"):
        convert_h3_checkpoint(checkpoint, tmp_path / "full", tokenizer=None, num_attention_heads=2)
    with pytest.raises(FileNotFoundError, match=r"checkpoint .*missing\.pt' is not a file"):
        convert_h3_checkpoint(tmp_path / "missing.pt", tokenizer=None)


def test_the_command_line_writes_a_folder_and_reports_bad_input_in_one_line(tmp_path, capsys):
    checkpoint, _, _reference = _authors("rotary")
    assert main([str(checkpoint), str(tmp_path / "out"), "--no_tokenizer", "--num_attention_heads", "2"]) == 0
    assert "attention at [1] (2 heads, rotary 8)" in capsys.readouterr().err
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "out").config.rotary_emb_dim == 8
    with pytest.raises(SystemExit) as exit_info:
        main([str(checkpoint), str(tmp_path / "other"), "--no_tokenizer"])
    assert exit_info.value.code == 2
    assert "num_attention_heads" in capsys.readouterr().err and not (tmp_path / "other").exists()
