"""SeRpEnt's decode step against Mamba's, eager and compiled, in one run (issue 53: compiled decode ≤ 1.3× Mamba's).

SeRpEnt (arXiv 2501.11729 §4) decodes its base Mamba plus one streaming resampling branch per κ (the causal mode's
clock, window and branch Mamba, :mod:`ssmhub.layers.serpent_step`). This script times batch-1 greedy decoding after
a random prompt, one torch thread, for:

- ``serpent``: SeRpEnt [0.5, 0.1] in its default (additive) layout at ``--width``;
- ``mamba``: the same config without branches (exactly its base Mamba, the same width);
- ``mamba-equal``: Mamba at the width whose parameters equal ``serpent``'s (as ``serpent_vs_mamba_lm.py`` trains it).

Eager: the dynamic cache, one Python forward per token. Compiled: ``torch.compile(model.forward, fullgraph=True)``
(Inductor) over a preallocated cache (``model.static_cache``). Each of ``--rounds`` rounds times every model once
per mode, models and modes interleaved; each model lives in a worker process of its own (torch.compile's cache is
keyed by the code of ``forward``, which the three models share: in one process their shapes would make it compile a
dynamic graph for all), which times one block at a time when asked. The table gives medians of rounds and
SeRpEnt ÷ each Mamba.

    python benchmarks/serpent_decode.py [--width 256] [--layers 4] [--rounds 5]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import markdown_table, median, report
from serpent_vs_mamba_lm import equal_parameter_width, parameters_of

BRANCHES = {"resampling_rates": [0.5, 0.1], "resampling_window": 10}
MODES = ("eager", "compiled")


def add_decode_arguments(p: argparse.ArgumentParser, steps: int, rounds: int) -> None:
    """The models' and the protocol's flags, shared with ``serpent_decode_profile.py``."""
    p.add_argument("--width", type=int, default=256, help="SeRpEnt's (and the same-width Mamba's) hidden size")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--context", type=int, default=128, help="prompt tokens before the timed steps")
    p.add_argument("--steps", type=int, default=steps, help="greedy steps per timed block")
    p.add_argument("--rounds", type=int, default=rounds, help="timed blocks per model (and mode), interleaved")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-write", action="store_true")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    add_decode_arguments(p, steps=32, rounds=5)
    p.add_argument("--name", default="serpent_decode", help="results/<name>.md")
    return p.parse_args(argv)


def model_configs(args) -> dict[str, dict]:
    """Each model's config: SeRpEnt at ``--width``, its base alone, and Mamba at SeRpEnt's parameter count."""
    common = {"vocab_size": args.vocab_size, "num_hidden_layers": args.layers}
    serpent = {**common, "hidden_size": args.width, **BRANCHES}
    equal = equal_parameter_width(parameters_of(serpent), {**common, "resampling_rates": []})
    return {
        "serpent": serpent,
        "mamba": {**common, "hidden_size": args.width, "resampling_rates": []},
        "mamba-equal": {**common, "hidden_size": equal, "resampling_rates": []},
    }


def build(config: dict):
    from ssmhub.models.serpent import SerpentConfig, SerpentForCausalLM

    torch.manual_seed(0)
    return SerpentForCausalLM(SerpentConfig(**config)).eval()


def prompt(model, context: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(context)
    return torch.randint(0, model.config.vocab_size, (1, context), generator=generator)


def greedy(forward, cache, token: torch.Tensor, steps: int) -> torch.Tensor:
    """``steps`` greedy tokens through ``forward`` and ``cache``; the last token."""
    from ssmhub.models.cache_argument import CACHE_FIELD

    for _ in range(steps):
        token = forward(token, use_cache=True, **{CACHE_FIELD: cache}).logits[:, -1:].argmax(-1)
    return token


class Lane:
    """One model in one mode: its forward, its cache after the prompt (prefilled once) and the next token."""

    def __init__(self, model, mode: str, args, backend="inductor"):
        """``backend``: torch.compile's, for the compiled lane (``serpent_decode_profile.py`` passes one that counts
        the graph's inputs)."""
        from ssmhub.models.cache_argument import CACHE_FIELD

        ids = prompt(model, args.context)
        length = args.context + (args.rounds + 1) * args.steps + 8
        cache = model.static_cache(1, length) if mode == "compiled" else None
        with torch.no_grad():
            out = model(ids, use_cache=True, logits_to_keep=1, **({CACHE_FIELD: cache} if cache else {}))
        self.cache = cache if cache is not None else getattr(out, CACHE_FIELD)
        self.token = out.logits[:, -1:].argmax(-1)
        compiled = mode == "compiled"
        self.forward = torch.compile(model.forward, fullgraph=True, backend=backend) if compiled else model.forward
        start = time.perf_counter()
        self.block(args.steps)  # warm-up: compiles the compiled lane
        self.warmup_s = time.perf_counter() - start

    def block(self, steps: int) -> float:
        """ms/token of ``steps`` greedy steps continuing this lane."""
        with torch.no_grad():
            start = time.perf_counter()
            self.token = greedy(self.forward, self.cache, self.token, steps)
        return 1e3 * (time.perf_counter() - start) / steps


_LANES: dict[str, Lane] = {}  # a worker process's lanes (one model, every mode), built by prepare_lanes


def prepare_lanes(config: dict, args) -> tuple[dict[str, float], int]:
    """In a worker process: build one model and its lanes (the compiled one compiles here); each lane's warm-up
    seconds and the model's parameter count."""
    torch.set_num_threads(args.threads)
    model = build(config)
    _LANES.update({mode: Lane(model, mode, args) for mode in MODES})
    return {mode: lane.warmup_s for mode, lane in _LANES.items()}, sum(p.numel() for p in model.parameters())


def time_block(mode: str, steps: int) -> float:
    """In a worker process: ms/token of the next block of its ``mode`` lane."""
    return _LANES[mode].block(steps)


def measure(args, configs: dict) -> tuple[dict, dict, dict]:
    """Every model in a worker process of its own, timed one block at a time, models and modes interleaved in
    every round: ``{(model, mode): [ms/token per round]}``, ``{(model, mode): warm-up seconds}`` and
    ``{model: parameters}``."""
    context = multiprocessing.get_context("spawn")
    workers = {name: ProcessPoolExecutor(1, mp_context=context) for name in configs}
    try:
        warmups, params = {}, {}
        for name, config in configs.items():  # one at a time: compiling is not timed, but it loads the machine
            ready, params[name] = workers[name].submit(prepare_lanes, config, args).result()
            warmups.update({(name, mode): seconds for mode, seconds in ready.items()})
        times = {key: [] for key in warmups}
        for _ in range(args.rounds):
            for (name, mode), values in times.items():
                values.append(workers[name].submit(time_block, mode, args.steps).result())
        return times, warmups, params
    finally:
        for worker in workers.values():
            worker.shutdown()


def results_table(times: dict, names) -> str:
    rows = []
    for mode in MODES:
        ms = {name: median(times[name, mode]) for name in names}
        spread = {name: f"{min(times[name, mode]):.2f}–{max(times[name, mode]):.2f}" for name in names}
        ratios = (f"**{ms['serpent'] / ms[peer]:.2f}×**" for peer in ("mamba", "mamba-equal"))
        rows.append([mode, *(f"{ms[n]:.3f} ({spread[n]})" for n in names), *ratios])
    headers = ["decode", *(f"{n} ms/token (range)" for n in names), "serpent ÷ mamba", "serpent ÷ mamba-equal"]
    return markdown_table(headers, rows)


def verdict(times: dict, target: float = 1.3) -> str:
    """Issue 53's target, compiled SeRpEnt ≤ ``target``× the same-width Mamba's ms/token, as met or missed."""
    lines = []
    for mode in MODES:
        ratio = median(times["serpent", mode]) / median(times["mamba", mode])
        equal = median(times["serpent", mode]) / median(times["mamba-equal", mode])
        own = f"- {mode}: SeRpEnt {ratio:.2f}× the same-width Mamba's ms/token"
        lines.append(f"{own} ({equal:.2f}× Mamba's at equal parameters).")
    met = median(times["serpent", "compiled"]) <= target * median(times["mamba", "compiled"])
    lines.append(f"- Target, compiled ≤ {target}× the same-width Mamba: **{'met' if met else 'missed'}**.")
    return "\n".join(lines)


def notes(args, configs: dict, params: dict, warmups: dict) -> str:
    lines = [f"- `{n}`: `{configs[n]}`, {params[n]:,} parameters." for n in configs]
    lines.append(
        f"- Batch 1, a {args.context}-token random prompt, blocks of {args.steps} greedy steps, {args.rounds} rounds "
        f"(medians; range in brackets), torch threads {torch.get_num_threads()}, float32."
    )
    compile_s = ", ".join(f"{n} {warmups[n, 'compiled']:.0f} s" for n in configs)
    lines.append(f"- First block of each compiled lane (compilation included): {compile_s}.")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    configs = model_configs(args)
    times, warmups, params = measure(args, configs)
    title = "SeRpEnt decode vs Mamba, eager and compiled"
    sections = [
        "## Results\n\n" + results_table(times, configs),
        "## Reading\n\n" + verdict(times),
        "## Notes\n\n" + notes(args, configs, params, warmups),
    ]
    report(args, title, sections)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
