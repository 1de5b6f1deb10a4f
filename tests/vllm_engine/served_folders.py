"""Tiny saved models of every family for the vLLM tests, and a vLLM engine over one of them (real vLLM, CPU build)."""

from __future__ import annotations

import contextlib
import gc
import sys
from pathlib import Path

import torch
from transformers import MambaConfig, MambaForCausalLM

import ssmhub

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "conformance"))
from families import FAMILIES

VOCAB = 64
CHUNK = 16  # max_num_batched_tokens: prompts longer than it arrive over several engine steps, mixed with decodes
MAX_SEQS = 8  # max_num_seqs: a batch of 32 requests queues most of them

# every causal-LM variant of the conformance registry (the H3 hybrid below: vLLM's CPU attention needs head_dim 32+)
SERVED_FAMILIES = [f.name for f in FAMILIES if f.causal_lm is not None and f.name != "h3-hybrid"]
SERVED = [*SERVED_FAMILIES, "h3-hybrid", "h3-hybrid-rotary", "h3-distilled", "mamba-transformers"]


def save_folder(name: str, folder: Path, **overrides) -> Path:
    """A random model of variant ``name`` saved to ``folder``; no bos/eos, so greedy decoding never stops early."""
    torch.manual_seed(0)
    plain = {"vocab_size": VOCAB, "eos_token_id": None, "bos_token_id": None, **overrides}
    if name == "mamba-transformers":  # a transformers Mamba folder: served as SeRpEnt without branches
        config = MambaConfig(hidden_size=16, num_hidden_layers=2, state_size=4, pad_token_id=0, **plain)
        MambaForCausalLM(config).save_pretrained(folder)
        return folder
    if name in ("h3-hybrid", "h3-hybrid-rotary"):  # rotary: as the released H3-2.7B "2attn-rotary" (part of a head)
        rotary = {"rotary_emb_dim": 16} if name == "h3-hybrid-rotary" else {}
        config = ssmhub.H3Config(
            hidden_size=64, num_hidden_layers=3, max_kernel_length=16, attention_layers=[1], num_attention_heads=2,
            ssm_num_heads=4, intermediate_size=64, pad_token_id=0, **rotary, **plain,
        )  # fmt: skip
        model = ssmhub.H3ForCausalLM(config)
    elif name == "h3-distilled":  # long kernels distilled into a diagonal SSM (O(N) decode)
        family = next(f for f in FAMILIES if f.name == "h3")
        model = family.causal_lm(family.config(**plain))
        model.distill_for_decoding(num_modes=4)
    else:
        family = next(f for f in FAMILIES if f.name == name)
        model = family.causal_lm(family.config(**plain))
    model.save_pretrained(folder)
    return folder


def reference_model(name: str, folder: Path):
    """The transformers model a served folder is held to (transformers' own Mamba for a Mamba folder)."""
    from transformers import AutoModelForCausalLM

    model_class = MambaForCausalLM if name == "mamba-transformers" else AutoModelForCausalLM
    return model_class.from_pretrained(folder).eval()


@contextlib.contextmanager
def engine(folder: Path, **kwargs):
    """A vLLM engine over ``folder`` on the CPU, float32, small chunks; shut down on exit."""
    from vllm import LLM

    settings = dict(
        dtype="float32", max_model_len=256, enforce_eager=True, max_num_batched_tokens=CHUNK, max_num_seqs=MAX_SEQS,
        skip_tokenizer_init=True, seed=0,
    )  # fmt: skip
    llm = LLM(model=str(folder), **{**settings, **kwargs})
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def prompts(count: int, lengths, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (lengths[i % len(lengths)],), generator=g).tolist() for i in range(count)]


def generate_ids(llm, token_prompts, **sampling):
    from vllm import SamplingParams

    params = SamplingParams(**{"max_tokens": 8, "temperature": 0.0, "ignore_eos": True, **sampling})
    outputs = llm.generate([{"prompt_token_ids": p} for p in token_prompts], params, use_tqdm=False)
    return outputs
