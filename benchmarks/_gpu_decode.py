"""Step d of ``gpu_suite.py``: decode ms/token per family, eager (dynamic cache) against one decode step captured as a
``torch.cuda.CUDAGraph`` over the static cache (``model.static_cache``: every state preallocated and updated in
place, no host reads in a step), and whether both give the same greedy tokens. On a CPU the same static-buffer step
runs without a graph, so the logic is checked there too."""

from __future__ import annotations

import torch
from _gpu_common import Context, Section, failure, measure, ratio

import ssmhub
from ssmhub.models.cache_argument import CACHE_FIELD

VOCAB = 512
FAMILIES = {  # model_type (auto.FAMILIES) -> config; "mamba" is SeRpEnt without resampling
    "dlr": (ssmhub.DLRConfig, ssmhub.DLRForCausalLM, {"state_size": 64}),
    "h3": (ssmhub.H3Config, ssmhub.H3ForCausalLM, {"max_kernel_length": 256, "attention_layers": []}),
    "serpent": (ssmhub.SerpentConfig, ssmhub.SerpentForCausalLM, {"resampling_rates": [0.5, 0.1], "multiple": 3}),
    "mamba": (ssmhub.SerpentConfig, ssmhub.SerpentForCausalLM, {"resampling_rates": []}),
    "bdlrnn": (ssmhub.BDLRNNConfig, ssmhub.BDLRNNForCausalLM, {"block_size": 8}),
}


def build(name: str, width: int, layers: int, device) -> torch.nn.Module:
    """A randomly initialised causal LM of the family (seeded), ``width`` rounded down to its branches."""
    config_class, model_class, fields = FAMILIES[name]
    fields = dict(fields)
    width -= width % fields.pop("multiple", 1)
    torch.manual_seed(0)
    config = config_class(vocab_size=VOCAB, hidden_size=width, num_hidden_layers=layers, **fields)
    return model_class(config).to(device)


class EagerDecoder:
    """Greedy decoding through the ordinary (dynamic) cache, from a prefilled prompt forked for every run."""

    def __init__(self, model, prompt: torch.Tensor):
        out = model(prompt, use_cache=True)
        self.model, self.cache, self.first = model, getattr(out, CACHE_FIELD), out.logits[:, -1:].argmax(-1)

    def decode(self, tokens: int) -> torch.Tensor:
        cache, token, ids = self.cache.fork(), self.first, [self.first]
        for _ in range(tokens - 1):
            token = self.model(token, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
            ids.append(token)
        return torch.cat(ids, 1)


class GraphDecoder:
    """Greedy decoding with one step over a static cache: a static token buffer in, static logits out, replayed as
    a captured CUDA graph (on a CPU, called eagerly). Each run restores the states after the prompt in place."""

    def __init__(self, model, prompt: torch.Tensor, room: int):
        self.model, self.cache = model, model.static_cache(prompt.shape[0], prompt.shape[1] + room)
        out = model(prompt, cache=self.cache, use_cache=True)
        self.first = out.logits[:, -1:].argmax(-1)
        self.token = self.first.clone()
        self.saved = [{k: t.clone() for k, t in state.items()} for state in self.cache.layers]
        self.seen = self.cache.seen_tokens
        self.logits = self.call()  # a first step may build what the next steps keep (test_no_host_sync)
        self.graph = None
        if self.token.is_cuda:
            self.graph, self.logits = capture(self.call)

    def call(self) -> torch.Tensor:
        return self.model(self.token, cache=self.cache, use_cache=True).logits

    def restore(self) -> None:
        for state, saved in zip(self.cache.layers, self.saved):
            for name, tensor in state.items():
                tensor.copy_(saved[name])
        self.cache.seen_tokens = self.seen
        self.token.copy_(self.first)

    def decode(self, tokens: int) -> torch.Tensor:
        self.restore()
        ids = [self.first]
        for _ in range(tokens - 1):
            if self.graph is not None:
                self.graph.replay()
                logits = self.logits
            else:
                logits = self.call()
            self.token.copy_(logits[:, -1:].argmax(-1))
            ids.append(self.token.clone())
        return torch.cat(ids, 1)


def capture(step) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """``step()`` captured as a CUDA graph after two warm-up calls on a side stream (the states they advance are
    restored before every run), and the graph's output tensor."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = step()
    return graph, logits


def decode_row(ctx: Context, name: str) -> list[str]:
    width, layers = ctx.plan["model_width"]
    tokens = ctx.plan["decode_tokens"]
    model = build(name, width, layers, ctx.device).eval()
    prompt = torch.randint(0, VOCAB, (1, 32), generator=torch.Generator().manual_seed(1)).to(ctx.device)
    cells, ms, ids = [], {}, {}
    for key in ("eager", "graph"):
        try:
            decoder = EagerDecoder(model, prompt) if key == "eager" else GraphDecoder(model, prompt, room=8)
            ids[key] = decoder.decode(tokens)
            ms[key] = measure(ctx, lambda d=decoder: d.decode(tokens))[0] / (tokens - 1)
            cells.append(f"{ms[key]:.3f}")
        except Exception as error:
            cells.append(failure(error))
    equal = "–" if len(ids) < 2 else "equal" if torch.equal(ids["eager"], ids["graph"]) else "NOT equal"
    return [name, f"{model.config.hidden_size}×{layers}", *cells, ratio(ms.get("eager"), ms.get("graph")), equal]


@torch.no_grad()
def step_decode(ctx: Context, section: Section) -> None:
    """One row per family; a failed or unequal row fails the step after every row is written."""
    how = "replayed as a captured CUDA graph" if ctx.device.type == "cuda" else "called eagerly: no CUDA graph on a CPU"
    section.text(
        f"A 32-token prompt, then {ctx.plan['decode_tokens']} greedy tokens, batch 1, float32, vocabulary {VOCAB}; "
        f"ms/token over the {ctx.plan['decode_tokens'] - 1} decode steps (prefill excluded), median of "
        f"{ctx.args.repeats}. Eager: the dynamic cache, one Python forward per token. Graph: one decode step over "
        f"`model.static_cache` ({how}), the token copied into its static input, argmax on the device, no host "
        "synchronisation per token. Greedy tokens: the two paths' token ids, compared exactly."
    )
    headers = ["family", "width × layers", "eager ms/token", "graph ms/token", "speed-up", "greedy tokens"]
    table = section.table(headers)
    for name in FAMILIES:
        table.add(*decode_row(ctx, name))
    bad = [row[0] for row in table.rows if row[-1] != "equal" or any("failed" in c for c in row)]
    if bad:
        raise RuntimeError(f"decode failed or gave other tokens for {', '.join(bad)} (rows above)")
