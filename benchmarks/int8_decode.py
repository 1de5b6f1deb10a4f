"""int8 weights against float32: batch-1 decode speed of every family and GPT-2, and the perplexity of a trained model.

Routes (``ssmhub.quantization``), each applied to the same float32 model:

- ``float32``: the model as built;
- ``torchao int8 weight-only``: torchao's ``Int8WeightOnlyConfig`` on the projections that
  ``ssmhub.quantization.torchao_config()`` quantizes (every ``nn.Linear`` but ``FLOAT32_LINEAR_NAMES`` and the
  head), applied in memory with ``torchao.quantization.quantize_`` and the same filter: what
  ``from_pretrained(..., quantization_config=torchao_config())`` does per layer, without writing the model to disk;
- ``quantize_dynamic``: ``ssmhub.quantization.quantize_dynamic_int8`` (int8 weights and per-row dynamically
  quantized activations, fbgemm; the head quantized too).

GPT-2 (transformers' ``GPT2LMHeadModel``, sdpa attention, its ``DynamicCache``) is the peer, quantized the same
way: its ``Conv1D`` projections are first rebuilt as ``nn.Linear`` (the same weights, transposed), since neither
route quantizes a ``Conv1D``. Every model is randomly initialized at the given size (768 × 12, vocabulary 50,257):
decode speed does not depend on the values of the weights.

Decode: a prompt of ``--prompt`` tokens is prefilled, then ``--tokens`` single-token forwards with the cache are
timed; ms/token is the median over ``--repeats`` repeats, the routes of one model interleaved in every repeat so
that the machine's load falls on all of them alike; the speed-up is float32's ms/token over the route's.

Perplexity (``--trained``, a folder that ``python -m ssmhub.demo`` writes): token perplexity on the first
``--ppl_tokens`` tokens of WikiText-2 validation (the articles joined into one stream, windows of 256 with a
stride of 128, ``ssmhub.evaluation.evaluate_perplexity``) under each route, and its change from float32.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import markdown_table, median, report
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel
from transformers.pytorch_utils import Conv1D

import ssmhub
from ssmhub.models.cache_argument import CACHE_FIELD
from ssmhub.quantization import is_kept_float32, quantize_dynamic_int8

ROUTES = ("float32", "torchao int8 weight-only", "quantize_dynamic")
FAMILIES = ("dlr", "h3", "h3-hybrid", "bdlrnn", "serpent", "serpent-mamba", "gpt2")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated, from {FAMILIES} ('' for none)")
    p.add_argument("--hidden_size", type=int, default=768)
    p.add_argument("--num_layers", type=int, default=12)
    p.add_argument("--vocab_size", type=int, default=50257)
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens prefilled before the timed decode")
    p.add_argument("--tokens", type=int, default=16, help="decode steps timed per repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--trained", default="runs/demo", help="a trained model folder for perplexity ('' to skip)")
    p.add_argument("--data_dir", default=os.environ.get("SSMHUB_DATA_DIR"))
    p.add_argument("--ppl_tokens", type=int, default=32768, help="WikiText-2 validation tokens scored")
    p.add_argument("--name", default="int8_decode", help="results/<name>.md")
    p.add_argument("--no_write", action="store_true")
    args = p.parse_args(argv)
    unknown = set(filter(None, args.families.split(","))) - set(FAMILIES)
    if unknown:
        p.error(f"--families: unknown {sorted(unknown)}; expected names from {FAMILIES}")
    torch.set_num_threads(args.threads)
    return args


def family_config(family: str, args):
    """The family's config at the benchmark's size (a GPT2Config for the peer)."""
    common = {"vocab_size": args.vocab_size, "hidden_size": args.hidden_size, "num_hidden_layers": args.num_layers}
    middle = args.num_layers // 2
    return {
        "dlr": lambda: ssmhub.DLRConfig(state_size=64, intermediate_size=4 * args.hidden_size, **common),
        "h3": lambda: ssmhub.H3Config(attention_layers=[], intermediate_size=4 * args.hidden_size, **common),
        "h3-hybrid": lambda: ssmhub.H3Config(
            attention_layers=[1, middle], num_attention_heads=12, intermediate_size=4 * args.hidden_size, **common
        ),
        "bdlrnn": lambda: ssmhub.BDLRNNConfig(block_size=8, **common),
        "serpent": lambda: ssmhub.SerpentConfig(**common),
        "serpent-mamba": lambda: ssmhub.SerpentConfig(resampling_rates=[], **common),
        "gpt2": lambda: GPT2Config(
            vocab_size=args.vocab_size, n_embd=args.hidden_size, n_layer=args.num_layers, n_head=12, n_positions=1024
        ),
    }[family]()


def build_float32(family: str, args) -> nn.Module:
    torch.manual_seed(0)
    config = family_config(family, args)
    if family == "gpt2":
        return conv1d_as_linear(GPT2LMHeadModel._from_config(config, attn_implementation="sdpa")).eval()
    return AutoModelForCausalLM.from_config(config).eval()


def conv1d_as_linear(model: nn.Module) -> nn.Module:
    """``model`` with every transformers ``Conv1D`` (weight (in, out)) replaced by the same ``nn.Linear``."""
    for name, module in list(model.named_modules()):
        if isinstance(module, Conv1D):
            linear = nn.Linear(*module.weight.shape)
            linear.weight.data = module.weight.data.t().contiguous()  # (in, out) -> (out, in)
            linear.bias.data = module.bias.data
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, linear)
    return model


def torchao_int8_weight_only(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with torchao int8 weight-only projections, filtered as ``torchao_config()`` filters."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    def quantizes(module, name):
        return isinstance(module, nn.Linear) and not is_kept_float32(name) and name != "lm_head"

    quantized = copy.deepcopy(model)
    quantize_(quantized, Int8WeightOnlyConfig(), filter_fn=quantizes)
    return quantized


def build_routes(model: nn.Module) -> dict[str, nn.Module]:
    return {
        "float32": model,
        "torchao int8 weight-only": torchao_int8_weight_only(model),
        "quantize_dynamic": quantize_dynamic_int8(model),
    }


def returned_cache(out):
    """The cache a forward returned: GPT-2's ``past_key_values``, or ssmhub's field (``cache``)."""
    cache = getattr(out, "past_key_values", None)
    return cache if cache is not None else getattr(out, CACHE_FIELD)


@torch.no_grad()
def decode_ms_per_token(model: nn.Module, prompt: torch.Tensor, tokens: int) -> float:
    """Prefill ``prompt`` (1, P), then time ``tokens`` greedy single-token forwards with the cache."""
    out = model(prompt, use_cache=True)
    cache = returned_cache(out)
    next_id = out.logits[:, -1:].argmax(-1)
    start = time.perf_counter()
    for _ in range(tokens):
        out = model(next_id, past_key_values=cache, use_cache=True)
        next_id = out.logits[:, -1:].argmax(-1)
    return (time.perf_counter() - start) / tokens * 1e3


def time_routes(routes: dict[str, nn.Module], args) -> dict[str, float | str]:
    """Median ms/token of each route, the routes interleaved in every repeat; a route that fails to decode
    is left out of the timing and reported by its error."""
    prompt = torch.randint(1, args.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    failures = {}
    for name, model in routes.items():  # warm-up
        try:
            decode_ms_per_token(model, prompt, 2)
        except Exception as error:
            failures[name] = f"fails: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
    times = {name: [] for name in routes if name not in failures}
    for _ in range(args.repeats):
        for name in times:
            times[name].append(decode_ms_per_token(routes[name], prompt, args.tokens))
    return {**{name: median(values) for name, values in times.items()}, **failures}


def decode_rows(args) -> list[list[str]]:
    rows = []
    for family in filter(None, args.families.split(",")):
        routes = build_routes(build_float32(family, args))
        ms = time_routes(routes, args)
        for name in ROUTES:
            if isinstance(ms[name], str):
                rows.append([family, name, ms[name], "", ""])
            else:
                speedup = ms["float32"] / ms[name]
                rows.append([family, name, f"{ms[name]:.1f}", f"{1e3 / ms[name]:.1f}", f"{speedup:.2f}x"])
        print(*rows[-3:], sep="\n", flush=True)
        del routes
    return rows


def wikitext_stream(tokenizer, args) -> torch.Tensor:
    from ssmhub.data.wikitext import load_wikitext, wikitext_articles

    text = "".join(wikitext_articles(load_wikitext("wikitext-2", "validation", args.data_dir)))
    return torch.tensor(tokenizer(text[: 20 * args.ppl_tokens])["input_ids"][: args.ppl_tokens])


def perplexity_rows(args) -> tuple[list[list[str]], int]:
    """Rows of the perplexity table, and the number of tokens scored."""
    from ssmhub.evaluation.perplexity import evaluate_perplexity

    model = AutoModelForCausalLM.from_pretrained(args.trained).eval()
    stream = wikitext_stream(AutoTokenizer.from_pretrained(args.trained), args)
    ppl = {}
    for name, routed in build_routes(model).items():
        with torch.no_grad():
            ppl[name] = evaluate_perplexity(routed, [stream], max_length=256, stride=128, batch_size=8).token_perplexity
    rows = [[name, f"{ppl[name]:.3f}", f"{100 * (ppl[name] / ppl['float32'] - 1):+.2f}%"] for name in ROUTES]
    print(*rows, sep="\n", flush=True)
    return rows, len(stream)


def uptime() -> str:
    """The load averages now, as ``uptime`` prints them (other jobs on a shared machine slow every timing)."""
    return "load average " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv=None) -> None:
    args = parse_args(argv)
    size = f"{args.hidden_size} × {args.num_layers}, vocabulary {args.vocab_size}"
    sections = [f"`uptime` when started: {uptime()}"]
    if args.families:
        sections += [
            f"Batch-1 decode, {args.threads} threads, {size}: prompt {args.prompt} tokens, then {args.tokens} "
            f"tokens timed, median of {args.repeats} repeats (routes interleaved). Random weights.",
            markdown_table(["model", "route", "ms/token", "tokens/s", "speed-up over float32"], decode_rows(args)),
        ]
    if args.trained:
        rows, num_tokens = perplexity_rows(args)
        sections += [
            f"WikiText-2 validation token perplexity of `{args.trained}` (its first {num_tokens} tokens, "
            "windows of 256, stride 128):",
            markdown_table(["route", "perplexity", "change from float32"], rows),
        ]
    report(args, "int8 weights: decode speed and perplexity against float32", sections)


if __name__ == "__main__":
    main()
