"""The models of ``benchmarks/serving.py``: every served ssmhub family and the two vLLM-native peers at one width and
depth, saved as folders (random weights: throughput does not depend on them).

Peers of equal parameters: GPT-2 takes the layer count that brings its non-embedding parameters (its position table
grows with the longest context, 8K here) closest to DLR's at the same width;
Mamba-2 (transformers' layout, served by vLLM's own ``Mamba2ForCausalLM``) keeps the families' width and depth
(head dimension 64, state 128, one group), which puts it within a few percent of SeRpEnt's Mamba layout. DLR
takes 128 complex modes per channel, so that its decode state has Mamba-2's bytes (H·2N = 2H·128 float32 per layer):
a decode step streams its state through memory, so equal state is the equal shape; and an MLP width at which the
weights its decode step multiplies are Mamba-2's (:func:`dlr_mlp_width`). SeRpEnt without branches (Mamba) takes
Mamba-2's state size, 128, which gives it Mamba-2's state bytes too (issue 71). Every H3 takes the MLP width at
which its decode weights are Mamba-2's (:func:`h3_mlp_width`; 4H before 2026-12-05, which gave it 1.48× Mamba-2's),
and H3 with its diagonal SSM 128 complex modes per channel, Mamba-2's state bytes (H·N complex64 per layer, plus its
shift filter's window); distilled H3 keeps 16 modes (a smaller state than Mamba-2's), the long convolutions their
window.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    Mamba2Config,
    Mamba2ForCausalLM,
    MambaConfig,
    MambaForCausalLM,
)

import ssmhub

# served through ssmhub; "mamba-hf" is a transformers MambaForCausalLM folder (served as SeRpEnt without branches,
# held to transformers' own Mamba generate: the peer behind vLLM's 12-22× over generate)
FAMILIES = ["dlr", "bdlrnn", "serpent", "serpent-mamba", "h3-ssm", "h3-distilled", "h3", "h3-hybrid", "mamba-hf"]
PEERS = ["gpt2", "mamba2"]


@dataclass(frozen=True)
class Size:
    name: str
    hidden: int
    layers: int
    vocab: int


SIZES = {"small": Size("small", 128, 4, 4096), "100m": Size("100m", 768, 12, 50304)}


MAMBA2_STATE = 128  # Mamba-2's state_size here, and SeRpEnt-as-Mamba's and DLR's (complex modes)


def dlr_mlp_width(hidden: int) -> int:
    """DLR's MLP width at which its decode parameters per layer (W_out H², w 2·H·128, MLP 2·H·I) are Mamba-2's
    (in_proj H·(4H + 2·128 + 2H/64), out_proj 2H·H): I = 2.5·H + H/64, down to a multiple of 64 (1920 at 768)."""
    return (5 * hidden // 2 + hidden // 64) // 64 * 64


def h3_mlp_width(hidden: int) -> int:
    """H3's MLP width at which its decode parameters per layer (q, k, v and output projections 4·H², MLP 2·H·I) are
    Mamba-2's (H·(6H + 2·128 + 2H/64), as in :func:`dlr_mlp_width`): I = H + 128 + H/64, down to a multiple of 64
    (896 at 768)."""
    return (hidden + MAMBA2_STATE + hidden // 64) // 64 * 64


def _ssmhub_model(name: str, size: Size) -> torch.nn.Module:
    common = dict(vocab_size=size.vocab, hidden_size=size.hidden, num_hidden_layers=size.layers, pad_token_id=0,
                  eos_token_id=None, bos_token_id=None)  # fmt: skip
    h3 = dict(common, intermediate_size=h3_mlp_width(size.hidden), max_kernel_length=2048, attention_layers=[])
    configs = {
        "dlr": lambda: ssmhub.DLRConfig(state_size=128, intermediate_size=dlr_mlp_width(size.hidden), **common),
        "bdlrnn": lambda: ssmhub.BDLRNNConfig(intermediate_size=4 * size.hidden, **common),
        "serpent": lambda: ssmhub.SerpentConfig(resampling_rates=[0.5, 0.1], **common),
        "serpent-mamba": lambda: ssmhub.SerpentConfig(resampling_rates=[], state_size=MAMBA2_STATE, **common),
        "h3-ssm": lambda: ssmhub.H3Config(**{**h3, "kernel_type": "diagonal_ssm", "ssm_state_size": MAMBA2_STATE}),
        "h3-distilled": lambda: ssmhub.H3Config(**h3),
        "h3": lambda: ssmhub.H3Config(**h3),
        "h3-hybrid": lambda: ssmhub.H3Config(
            **{**h3, "attention_layers": [size.layers // 2], "num_attention_heads": max(1, size.hidden // 64)}
        ),
    }
    model = AutoModelForCausalLM.from_config(configs[name]())
    if name == "h3-distilled":
        model.distill_for_decoding(num_modes=16)
    return model


def _gpt2(size: Size, max_len: int, target_params: int) -> torch.nn.Module:
    def build(layers: int) -> torch.nn.Module:
        config = GPT2Config(vocab_size=size.vocab, n_embd=size.hidden, n_layer=layers, n_head=size.hidden // 64,
                            n_positions=max_len, bos_token_id=None, eos_token_id=None)  # fmt: skip
        with torch.device("meta"):
            return GPT2LMHeadModel(config)

    layers = min(range(1, 4 * size.layers + 1), key=lambda n: abs(non_embedding_parameters(build(n)) - target_params))
    return GPT2LMHeadModel(build(layers).config)


def _mamba_hf(size: Size) -> torch.nn.Module:
    config = MambaConfig(vocab_size=size.vocab, hidden_size=size.hidden, num_hidden_layers=size.layers,
                         pad_token_id=0, bos_token_id=None, eos_token_id=None)  # fmt: skip
    return MambaForCausalLM(config)


def _mamba2(size: Size) -> torch.nn.Module:
    config = Mamba2Config(vocab_size=size.vocab, hidden_size=size.hidden, num_hidden_layers=size.layers, expand=2,
                          head_dim=64, num_heads=2 * size.hidden // 64, state_size=MAMBA2_STATE, n_groups=1,
                          pad_token_id=0, bos_token_id=None, eos_token_id=None)  # fmt: skip
    return Mamba2ForCausalLM(config)


def count_parameters(model: torch.nn.Module) -> int:
    """Parameters, each tied tensor once."""
    return sum(p.numel() for p in model.parameters())


def non_embedding_parameters(model: torch.nn.Module) -> int:
    """Parameters outside the token and position embeddings and the LM head (which ties to the embeddings or not)."""
    tables = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    tables |= {id(p) for p in model.get_output_embeddings().parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in tables)


def save_models(size: Size, names: list[str], folder: Path, max_len: int) -> dict[str, tuple[int, int]]:
    """Each named model saved to ``folder/<name>``; returns its parameters, all and
    non-embedding. GPT-2 takes the layer count whose non-embedding parameters are closest to DLR's."""
    torch.manual_seed(0)
    dlr_params = non_embedding_parameters(_ssmhub_model("dlr", size))
    counts = {}
    for name in names:
        path = folder / name
        if name == "gpt2":
            model = _gpt2(size, max_len, dlr_params)
        elif name == "mamba2":
            model = _mamba2(size)
        elif name == "mamba-hf":
            model = _mamba_hf(size)
        else:
            model = _ssmhub_model(name, size)
        counts[name] = (count_parameters(model), non_embedding_parameters(model))
        model.save_pretrained(path)
    return counts
