"""Training steps against themselves with the CPU's flush-to-zero on: what subnormal floats still cost.

A float32 below 1.2e-38 is subnormal; an x86 CPU multiplies such numbers tens of times slower unless
flush-to-zero is set (``torch.set_flush_denormal(True)``, a process-wide switch a library must not flip for
its users). Decaying powers λ^k of long kernels (DLR, seed paper §2.3), Gaussian features of far distances
(SeRpEnt, Eq. 12) and decays exp(Δ·A) reach that range at the sequence lengths these models exist for.

What is measured: one forward + backward of each family's causal LM on a random batch of one sequence of
``--length`` tokens (hidden 128, 2 layers, vocabulary 2048, one thread), first with flush-to-zero off (what a
user gets), then on (the peer: the same step with subnormals read and written as 0), alternating, medians of
``--repeats``. A ratio near 1.00 means the step makes (almost) no subnormal floats.

Run: ``python experiments/subnormals.py`` (about two minutes); ``--source`` times another ssmhub ``src``
folder in a subprocess (the code before a change).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _experiments  # noqa: F401  (benchmarks/'s helpers, results into experiments/results/)
from _report import markdown_table, median, print_and_write

FAMILIES = {  # name -> (config class, causal LM class, config fields) at hidden 128, 2 layers
    "dlr": ("DLRConfig", "DLRForCausalLM", {}),
    "dlr-prod": ("DLRConfig", "DLRForCausalLM", {"kernel_type": "prod"}),
    "h3": ("H3Config", "H3ForCausalLM", {"attention_layers": []}),
    "h3-ssm": ("H3Config", "H3ForCausalLM", {"attention_layers": [], "kernel_type": "diagonal_ssm"}),
    "mamba": ("SerpentConfig", "SerpentForCausalLM", {"resampling_rates": []}),
    "serpent": ("SerpentConfig", "SerpentForCausalLM", {"resampling_rates": [0.5, 0.1], "hidden_size": 129}),
    "bdlrnn": ("BDLRNNConfig", "BDLRNNForCausalLM", {"block_size": 8}),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    p.add_argument("--source", help="also time this ssmhub src folder (e.g. the code before a change)")
    p.add_argument("--name", default="subnormals", help="results file stem")
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def step_seconds(name: str, length: int, repeats: int) -> dict[str, float]:
    """Median seconds of a training step with flush-to-zero off and on (alternating after a warm-up of each)."""
    import ssmhub

    config_class, model_class, fields = FAMILIES[name]
    fields = {"hidden_size": 128, **fields}
    torch.manual_seed(0)
    config = getattr(ssmhub, config_class)(vocab_size=2048, num_hidden_layers=2, **fields)
    model = getattr(ssmhub, model_class)(config)
    ids = torch.randint(0, 2048, (1, length), generator=torch.Generator().manual_seed(length))
    times = {False: [], True: []}
    for round_ in range(repeats + 1):
        for flush in (False, True):
            torch.set_flush_denormal(flush)
            start = time.perf_counter()
            model(ids, labels=ids).loss.backward()
            model.zero_grad(set_to_none=True)
            if round_:  # the first round warms up
                times[flush].append(time.perf_counter() - start)
    torch.set_flush_denormal(False)
    return {"off": median(times[False]), "on": median(times[True])}


def run(args, source: str | None) -> dict:
    """Every family's timings, in this process or (``source``) in a subprocess importing that tree."""
    if source is None:
        torch.set_num_threads(1)
        return {name: step_seconds(name, args.length, args.repeats) for name in args.families}
    argv = [sys.executable, os.path.abspath(__file__), "--worker", "--length", str(args.length)]
    argv += ["--repeats", str(args.repeats), "--families", *args.families]
    env = {**os.environ, "PYTHONPATH": os.path.abspath(source)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(run(args, None)))
        return 0
    trees = {"this tree": run(args, None)}
    if args.source:
        trees = {"before": run(args, args.source), **trees}
    rows = []
    for name in args.families:
        for label, timings in trees.items():
            off, on = timings[name]["off"], timings[name]["on"]
            rows.append([name, label, f"{1e3 * off:.0f}", f"{1e3 * on:.0f}", f"**{off / on:.2f}×**"])
    headers = ["family", "source", "step ms (as users run it)", "step ms, flush-to-zero on", "ratio"]
    text = (
        f"One forward + backward of each causal LM (hidden 128, 2 layers, vocabulary 2048) on one sequence of "
        f"{args.length} tokens, one thread; flush-to-zero off then on, alternating, medians of {args.repeats}."
        + (f' "before": `{args.source}`.' if args.source else "")
    )
    print_and_write(args, "Subnormal floats in training steps", text, markdown_table(headers, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
