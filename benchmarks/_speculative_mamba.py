"""speculative.py --mamba-peer: ssmhub's exact rollback against transformers' own (5.25) on one Mamba folder.

transformers 5.25 rolls back a recurrent cache itself: ``activate_past_recording(recurrent_states_to_keep=n)`` makes
its Mamba layers compute the states after each of a forward's last n tokens (one selective-state update per token)
and ``crop`` picks one. ssmhub keeps each layer's state before the forward and the forward's first-layer inputs, and a
crop replays the kept tokens ahead of the next forward (:mod:`ssmhub.rollback`). Here one transformers
``MambaForCausalLM`` folder decodes both ways, greedy and with prompt lookup: transformers' Mamba, and ssmhub's
loading of the same folder (``SerpentForCausalLM.from_pretrained``, SeRpEnt without branches is Mamba). Reported per
model and method: whole-``generate`` tokens/s (median), verifier forwards, whether the tokens are the model's own
greedy ones and transformers' Mamba's greedy ones, and the largest number of bytes held for rollback when a crop
came (transformers: the intermediate recurrent states and the grown convolution windows; ssmhub: the snapshots and
inputs of :meth:`ssmhub.RecurrentCache.snapshot_bytes`).

The weights are random with a short memory (Δ's bias raised: the state decays within a few tokens), and the prompt is
``P + greedy(P)[:T/2] + P``: after the second ``P`` the model continues as after the first, so prompt lookup's
candidates (copied from after the first ``P``) are accepted for the first half of the ``T`` new tokens, as they are
for a trained model that copies, and mostly rejected after it.
"""

from __future__ import annotations

import tempfile
import time
from contextlib import contextmanager

import torch
from _report import markdown_table, median
from transformers import DynamicCache, MambaConfig, MambaForCausalLM

import ssmhub
from ssmhub.cache import RecurrentCache


def mamba_pair(args) -> tuple[MambaForCausalLM, ssmhub.SerpentForCausalLM]:
    """transformers' Mamba with random, short-memory weights, and ssmhub's loading of its saved folder."""
    torch.manual_seed(0)
    config = MambaConfig(vocab_size=args.peer_vocab, hidden_size=args.peer_width, num_hidden_layers=args.peer_layers,
                         state_size=16, expand=2, use_mambapy=False, eos_token_id=None, bos_token_id=None,
                         tie_word_embeddings=False)  # fmt: skip
    theirs = MambaForCausalLM(config).eval()
    with torch.no_grad():  # spread projections (greedy tokens that vary); Δ ≳ 5, so the state forgets in a few tokens
        theirs.backbone.embeddings.weight.normal_(std=1.0)
        theirs.lm_head.weight.normal_(std=1.0)
        for layer in theirs.backbone.layers:
            for projection in (layer.mixer.in_proj, layer.mixer.out_proj):
                projection.weight.normal_(std=projection.in_features**-0.5)
            layer.mixer.dt_proj.bias.add_(5.0)
    with tempfile.TemporaryDirectory() as folder:
        theirs.save_pretrained(folder)
        ours = ssmhub.SerpentForCausalLM.from_pretrained(folder).eval()
    ours.generation_config.eos_token_id = None
    return theirs, ours


def _transformers_rollback_bytes(cache: DynamicCache) -> int:
    """Bytes a transformers cache holds only to roll back: each linear-attention layer's recorded recurrent states
    and the part of its convolution windows beyond ``conv_kernel_size``."""
    total = 0
    for layer in cache.layers:
        for history in getattr(layer, "recurrent_states_history", {}).values():
            total += sum(t.numel() * t.element_size() for t in history)
        for i, conv in enumerate(getattr(layer, "conv_states", []) or []):
            if isinstance(conv, torch.Tensor) and conv.dim() and conv.shape[-1] > layer.conv_kernel_size[i]:
                total += conv[..., layer.conv_kernel_size[i] :].numel() * conv.element_size()
    return total


@contextmanager
def rollback_bytes_at_crops():
    """The largest rollback footprint seen when a crop came, for either library's cache (``peak[0]``)."""
    peak = [0]
    originals = {RecurrentCache: RecurrentCache.crop, DynamicCache: DynamicCache.crop}

    def measured(cls, held):
        def crop(self, *a, **k):
            peak[0] = max(peak[0], held(self))
            return originals[cls](self, *a, **k)

        return crop

    RecurrentCache.crop = measured(RecurrentCache, RecurrentCache.snapshot_bytes)
    DynamicCache.crop = measured(DynamicCache, _transformers_rollback_bytes)
    try:
        yield peak
    finally:
        RecurrentCache.crop, DynamicCache.crop = originals[RecurrentCache], originals[DynamicCache]


@torch.inference_mode()
def run_once(model, prompt, new_tokens: int, extra: dict):
    """(new tokens (T,), seconds, verifier forwards after the prefill, peak rollback bytes) of one generate call."""
    forwards = []
    hook = model.register_forward_pre_hook(lambda m, a, k: forwards.append(m), with_kwargs=True)
    with rollback_bytes_at_crops() as peak:
        start = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, **extra)
        seconds = time.perf_counter() - start
    hook.remove()
    return out[0, prompt.shape[1] :], seconds, len(forwards) - 1, peak[0]


def echo_prompt(model, args) -> torch.Tensor:
    """(1, 2P + T/2) ids ``P + greedy(P)[:T/2] + P``: a random ``P`` of ``--peer-prompt`` tokens, the first half of
    the model's own ``T`` greedy tokens after it, and ``P`` again: the first half of the new tokens is likely in the
    prompt (candidates accepted), the second half is not (candidates from chance matches, mostly rejected)."""
    p = torch.randint(0, args.peer_vocab, (1, args.peer_prompt), generator=torch.Generator().manual_seed(0))
    continuation, *_ = run_once(model, p, args.new_tokens, {})
    return torch.cat([p, continuation[None, : args.new_tokens // 2], p], dim=1)


def mamba_peer_rows(args) -> tuple[list[list[str]], str]:
    """The table's rows (median of ``--repeats``, methods and models taking turns) and a line on the setup."""
    theirs, ours = mamba_pair(args)
    models = {"transformers Mamba": theirs, "ssmhub (the same folder)": ours}
    prompt = echo_prompt(theirs, args)
    methods = {"greedy": {}, **{f"prompt lookup, n = {n}": {"prompt_lookup_num_tokens": n} for n in args.lookup}}
    first = {(m, k): run_once(model, prompt, args.new_tokens, extra)  # warm-up; tokens, forwards, bytes
             for m, model in models.items() for k, extra in methods.items()}  # fmt: skip
    seconds = {key: [] for key in first}
    for _ in range(args.repeats):
        for m, k in first:
            seconds[m, k].append(run_once(models[m], prompt, args.new_tokens, methods[k])[1])
    reference = first["transformers Mamba", "greedy"][0]
    rows = []
    for (m, k), (tokens, _, forwards, held) in first.items():
        rate = args.new_tokens / median(seconds[m, k])
        ratio = rate / (args.new_tokens / median(seconds[m, "greedy"]))
        own, theirs_greedy = torch.equal(tokens, first[m, "greedy"][0]), torch.equal(tokens, reference)
        held_kib = f"{held / 2**10:.0f}" if k != "greedy" else "-"
        rows.append([m, k, f"{rate:.1f}", f"{ratio:.2f}×", f"{forwards}", "yes" if own else "NO",
                     "yes" if theirs_greedy else "NO", held_kib])  # fmt: skip
    params = sum(p.numel() for p in theirs.parameters())
    setup = (f"One transformers `MambaForCausalLM` ({params / 1e6:.2f}M parameters: width {args.peer_width}, "
             f"{args.peer_layers} layers, state 16, vocabulary {args.peer_vocab}; random weights with a short memory, "
             "untied head) and ssmhub's loading of its saved folder; prompt `P + greedy(P)[:T/2] + P` with "
             f"|P| = {args.peer_prompt} "
             f"({prompt.shape[1]} tokens), {args.new_tokens} new tokens, batch 1, float32; tokens/s of the whole "
             f"generate call, median of {args.repeats}.")  # fmt: skip
    return rows, setup


def mamba_peer_sections(args) -> list[str]:
    rows, setup = mamba_peer_rows(args)
    headers = ["model", "method", "tokens/s", "vs its greedy", "verifier forwards", "its greedy tokens",
               "transformers Mamba's greedy tokens", "KiB held for rollback at a crop (max)"]  # fmt: skip
    return [setup, markdown_table(headers, rows)]
