"""Where a compiled decode step's time goes, for Mamba and SeRpEnt with 1, 2 and 3 branches (issue 53).

``serpent_decode.py`` times SeRpEnt's compiled step against Mamba's; this script splits each step, so that a gap
can be put down to its cause. Every model (256 × 4 by default; SeRpEnt with κ = [0.5], [0.5, 0.1] (the
benchmark's), [0.5, 0.25, 0.1]; Mamba is the same config without branches) is compiled as there,
``torch.compile(model.forward, fullgraph=True)`` over ``model.static_cache``, with Inductor's kernel profile on
(``torch._inductor.config.cpp.enable_kernel_profile``: each generated C++ kernel a profiler event) and a backend
that counts the graph's inputs. Each of ``--rounds`` rounds profiles one block of ``--steps`` greedy steps per
model (models interleaved, each in a worker process of its own) and sums per token:

- ``kernels``: Inductor's generated C++ kernels; ``wrapper``: the Python wrapper Inductor generates around them
  (its own time); ``guards``: Dynamo's guard check before each call; ``lm head``: ``aten::mm`` (the vocabulary
  projection, the one 2-d matmul left); ``other aten``: every other ATen op's own time; ``step``: wall time per
  token under the profiler (which adds its own overhead: compare within the table, not with serpent_decode.md).

The table gives medians of rounds and the least-squares slope of wrapper + guards over graph inputs.

    python benchmarks/serpent_decode_profile.py [--width 256] [--layers 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import markdown_table, median, report
from serpent_decode import BRANCHES, Lane, add_decode_arguments, build

RATES = {
    "mamba": [],
    "serpent, 1 branch": [0.5],
    "serpent, 2 branches": [0.5, 0.1],
    "serpent, 3 branches": [0.5, 0.25, 0.1],
}
PARTS = ("kernels", "wrapper", "guards", "lm head", "other aten", "step")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    add_decode_arguments(p, steps=128, rounds=3)  # a block is also the warm-up, which compiles twice
    p.add_argument("--name", default="serpent_decode_profile", help="results/<name>.md")
    return p.parse_args(argv)


def model_configs(args) -> dict[str, dict]:
    common = {"vocab_size": args.vocab_size, "num_hidden_layers": args.layers, "hidden_size": args.width}
    window = {"resampling_window": BRANCHES["resampling_window"]}
    return {name: {**common, **window, "resampling_rates": rates} for name, rates in RATES.items()}


def step_parts(events, steps: int, wall_s: float) -> dict[str, float]:
    """ms per token of each part of :data:`PARTS` from ``torch.profiler``'s ``key_averages()`` of ``steps`` steps."""

    def ms(keep) -> float:
        return sum(e.self_cpu_time_total for e in events if keep(e.key)) / steps / 1e3

    return {
        "kernels": ms(lambda key: key.startswith("graph_")),
        "wrapper": ms(lambda key: "CompiledFxGraph" in key),
        "guards": ms(lambda key: "Cache Lookup" in key),
        "lm head": ms(lambda key: key == "aten::mm"),
        "other aten": ms(lambda key: key.startswith("aten::") and key != "aten::mm"),
        "step": 1e3 * wall_s / steps,
    }


class ProfiledLane(Lane):
    """A compiled lane of ``serpent_decode.py`` whose backend counts the graph's inputs, profiled block by block."""

    def __init__(self, config: dict, args):
        from torch._inductor.compile_fx import compile_fx

        self.inputs: list[int] = []  # per compiled graph: the cache's seen-token count recompiles it once

        def counting_inductor(graph, example_inputs):
            self.inputs.append(len(example_inputs))
            return compile_fx(graph, example_inputs)

        super().__init__(build(config), "compiled", args, backend=counting_inductor)  # its warm-up compiles
        self.steps = args.steps

    def profiled_block(self) -> dict[str, float]:
        with torch.profiler.profile() as profiler:
            ms_per_token = self.block(self.steps)
        return step_parts(profiler.key_averages(), self.steps, ms_per_token * self.steps / 1e3)


_LANE: list[ProfiledLane] = []  # a worker process's model


def prepare(config: dict, args) -> int:
    """In a worker process: build and compile the model (kernel profile on); its graph's input count."""
    torch.set_num_threads(args.threads)
    torch._inductor.config.cpp.enable_kernel_profile = True
    _LANE.append(ProfiledLane(config, args))
    return _LANE[0].inputs[-1]


def profile_block() -> dict[str, float]:
    return _LANE[0].profiled_block()


def measure(args, configs: dict) -> tuple[dict[str, int], dict[str, list[dict]]]:
    """Every model in a worker of its own, compiled one at a time, then profiled one block per round, models
    interleaved: ``{model: graph inputs}`` and ``{model: [parts per round]}``."""
    context = multiprocessing.get_context("spawn")
    workers = {name: ProcessPoolExecutor(1, mp_context=context) for name in configs}
    try:
        inputs = {name: workers[name].submit(prepare, config, args).result() for name, config in configs.items()}
        rounds = {name: [] for name in configs}
        for _ in range(args.rounds):
            for name, parts in rounds.items():
                parts.append(workers[name].submit(profile_block).result())
        return inputs, rounds
    finally:
        for worker in workers.values():
            worker.shutdown()


def medians(rounds: list[dict]) -> dict[str, float]:
    return {part: median([r[part] for r in rounds]) for part in PARTS}


def overhead_slope(inputs: dict[str, int], parts: dict[str, dict]) -> float:
    """Least-squares µs of wrapper + guards per graph input over the models."""
    x = torch.tensor([float(inputs[n]) for n in inputs], dtype=torch.float64)
    y = torch.tensor([parts[n]["wrapper"] + parts[n]["guards"] for n in inputs], dtype=torch.float64)
    x, y = x - x.mean(), y - y.mean()
    return 1e3 * float((x * y).sum() / (x * x).sum().clamp(min=1e-12))


def results_table(inputs: dict[str, int], parts: dict[str, dict]) -> str:
    headers = ["model", "graph inputs", *(f"{p} ms/token" for p in PARTS), "step ÷ mamba"]
    rows = [
        [name, inputs[name], *(f"{parts[name][p]:.3f}" for p in PARTS),
         f"{parts[name]['step'] / parts['mamba']['step']:.2f}×"]
        for name in inputs
    ]  # fmt: skip
    return markdown_table(headers, rows)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    configs = model_configs(args)
    inputs, rounds = measure(args, configs)
    parts = {name: medians(r) for name, r in rounds.items()}
    slope = overhead_slope(inputs, parts)
    reading = (
        f"- Wrapper + guards grow by **{slope:.1f} µs per graph input** (least squares over the {len(inputs)} models)."
        f"\n- Models: `{configs['mamba']}` with `resampling_rates` {list(RATES.values())}; batch 1, a "
        f"{args.context}-token random prompt, {args.rounds} rounds of {args.steps} greedy steps (medians), torch "
        f"threads {torch.get_num_threads()}, float32, under torch.profiler."
    )
    sections = ["## Per token, medians of rounds\n\n" + results_table(inputs, parts), "## Reading\n\n" + reading]
    report(args, "SeRpEnt and Mamba compiled decode step, part by part", sections)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
