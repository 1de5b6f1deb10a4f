"""The models of the GPU suite's training table (issue 52 §1), at users' shapes: GPT-2 small as the peer and every
ssmhub family at ~125M parameters; and the same zoo at tiny sizes for ``--smoke`` and ``launch_count.py``.

Parameter counts (vocabulary 50,257, tied embeddings: 38.6M of each model), chosen to sit within ~15% of GPT-2's:

- ``gpt2``: transformers' ``GPT2LMHeadModel``, 768 × 12, 12 heads, MLP 3072, SDPA, positions up to 8192 (130M).
- ``dlr``: 768 × 12, state 256 (the default), an MLP of 4096 after each DLR layer (126M; DLR layers alone hold
  few weights: without the MLP the model is 50M).
- ``h3``: ``H3Config``'s defaults (the long-conv paper's H3-125M, arXiv 2302.06646: MLP 3072) without attention
  layers (143M); kernels of 2048 taps at every L (taps ∝ length: 8192 taps would make it 199M; a longer input is
  legal and the FFT is of size 2L either way).
- ``h3-hybrid``: the same with attention at layers 1 and 8, as the paper's model (139M).
- ``bdlrnn``: 768 × 12, blocks of 8 (arXiv 2309.07412), transition MLP of width 1024 (138M; the code's default
  width d·b = 6144 makes a 768-wide model 563M).
- ``mamba``: ssmhub's ``SerpentForCausalLM`` with ``resampling_rates=[]`` (exactly Mamba, its Triton scan on
  CUDA), the mamba-130m layout 768 × 24, expand 2, state 16 (129M). Not transformers' ``MambaForCausalLM``.
- ``serpent``: SeRpEnt (arXiv 2501.11729) at the same layout with the paper's rates [0.5, 0.1] and a resampling
  window of 5 (140M; the default window 10 makes it 179M: each branch's compressor reads window × width inputs).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

import ssmhub

FAMILY_ROWS = ("dlr", "h3", "h3-hybrid", "bdlrnn", "mamba", "serpent")  # the table's order after gpt2
MODELS = ("gpt2", *FAMILY_ROWS)
USER_VOCAB, SMOKE_VOCAB = 50257, 512

# name -> (config class, model class, depth at users' shape, fields at every size, fields at users' shape only)
ZOO = {
    "dlr": (ssmhub.DLRConfig, ssmhub.DLRForCausalLM, 12, {}, {"intermediate_size": 4096}),
    "h3": (ssmhub.H3Config, ssmhub.H3ForCausalLM, 12, {"attention_layers": []}, {"max_kernel_length": 2048}),
    "h3-hybrid": (ssmhub.H3Config, ssmhub.H3ForCausalLM, 12, {}, {"max_kernel_length": 2048}),
    "bdlrnn": (ssmhub.BDLRNNConfig, ssmhub.BDLRNNForCausalLM, 12, {"block_size": 8}, {"transition_hidden_size": 1024}),
    "mamba": (ssmhub.SerpentConfig, ssmhub.SerpentForCausalLM, 24, {"resampling_rates": []}, {}),
    "serpent": (ssmhub.SerpentConfig, ssmhub.SerpentForCausalLM, 24, {"resampling_window": 5}, {}),
}


def user_shape() -> SimpleNamespace:
    """Width 768, the vocabulary of GPT-2; depth per family (``ZOO``)."""
    return SimpleNamespace(width=768, depth_scale=1, vocab=USER_VOCAB, max_length=8192, user=True)


def tiny_shape(width: int = 24, depth_scale: int = 24, vocab: int = SMOKE_VOCAB, max_length: int = 256):
    """The zoo at a tiny width; each family's depth divided by ``depth_scale`` (24: one layer each, the smoke run's;
    1 keeps the depths, ``launch_count.py``'s).
    Width 24 divides into SeRpEnt's three branches, H3's heads and BDLRNN's blocks of 8."""
    return SimpleNamespace(width=width, depth_scale=depth_scale, vocab=vocab, max_length=max_length, user=False)


def shape_for(user: bool) -> SimpleNamespace:
    return user_shape() if user else tiny_shape()


def depth(name: str, shape) -> int:
    """The family's depth (GPT-2: 12) divided by ``shape.depth_scale``; at least 1, and 2 for the H3 hybrid (its
    attention is the second layer)."""
    return max(2 if name == "h3-hybrid" else 1, (12 if name == "gpt2" else ZOO[name][2]) // shape.depth_scale)


def build_gpt2_model(shape, device) -> torch.nn.Module:
    """GPT-2 with SDPA attention and dropouts 0 (``mamba_vs_transformers.build_gpt2``), heads 64 wide."""
    from mamba_vs_transformers import build_gpt2  # here: a change there fails this row, not the suite's import

    width = shape.width
    args = SimpleNamespace(hidden=width, layers=depth("gpt2", shape), heads=max(1, width // 64), vocab_size=shape.vocab)
    with torch.device(device):
        return build_gpt2(args, n_positions=shape.max_length)


def build_model(name: str, shape, device) -> torch.nn.Module:
    """A seeded, randomly initialised causal LM of the zoo, built on ``device``."""
    torch.manual_seed(0)
    if name == "gpt2":
        return build_gpt2_model(shape, device)
    config_class, model_class, _, fields, user_fields = ZOO[name]
    fields = {**fields, **(user_fields if shape.user else {})}
    if not shape.user and name in ("dlr", "h3", "h3-hybrid"):
        fields["intermediate_size"] = 2 * shape.width  # an MLP as at users' shape, small
    if not shape.user and name.startswith("h3"):
        fields.update(num_attention_heads=2, max_kernel_length=shape.max_length // 4)  # a kernel shorter than L
    config = config_class(
        vocab_size=shape.vocab, hidden_size=shape.width, num_hidden_layers=depth(name, shape), **fields
    )
    with torch.device(device):
        return model_class(config)


def blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's stack of identical blocks (what per-block compilation compiles): GPT-2's ``h``, ssmhub's
    ``layers``."""
    base = model.base_model
    return base.layers if hasattr(base, "layers") else base.h


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights counted once


def describe(name: str, model: torch.nn.Module) -> str:
    """The config fields that make the row's model, for the report."""
    config = model.config
    if name == "gpt2":
        keys = ["n_embd", "n_layer", "n_head", "n_inner", "n_positions", "vocab_size"]
    else:
        keys = ["hidden_size", "num_hidden_layers", "intermediate_size", *ZOO[name][3], *ZOO[name][4]]
        keys += [k for k in ("state_size", "expand", "attention_layers", "num_attention_heads") if hasattr(config, k)]
        keys += ["vocab_size"]
    fields = ", ".join(f"{key}={getattr(config, key)}" for key in dict.fromkeys(keys))
    return f"`{type(model).__name__}`: {fields}"
