"""Where SeRpEnt's decode step spends its time, measured in the whole model (issue 27 §4).

The resampling branches' step (``ssmhub.layers.serpent_step.step_branches``) is replaced by prefixes of itself,
each piece added to the previous ones: nothing (zeros out, state unchanged), Eq. 13's steps Δ_l, the streaming
clock and window, Eq. 12's compression θ_Γ, the branch Mambas' step. The pieces run on every token here (the real
step skips θ_Γ and the Mambas on tokens where no branch crosses a grid point), and their outputs are discarded, so
a prefix's tokens are not the model's: only its time counts. Every configuration decodes the same prompt in the
same process, interleaved with Mamba of the same width (ssmhub's SeRpEnt without resampling branches) and the real
step, one thread, median of rounds; the report ends with the arithmetic of the ≤ 1.5× Mamba target.

    python experiments/serpent_step_breakdown.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import itertools
import sys

import _experiments  # noqa: F401  (benchmarks/'s helpers, results into experiments/results/)
import torch
from _report import markdown_table, median, write_report
from serpent_vs_mamba import build, decode_ms

PIECES = ["none", "Eq. 13 steps", "clock and window", "θ_Γ (Eq. 12)", "branch Mamba step"]


def prefix_step(pieces: int):
    """``step_branches`` cut after its first ``pieces`` pieces (0-4), outputs zero."""
    from ssmhub.layers import serpent_step as s
    from ssmhub.ops.resampling import ResamplingState, resampling_step

    def step(w, x_t, state, mask_t):
        batch, branches = state["clock"].shape
        zeros = x_t.new_zeros(batch, branches, w.branches[0].branch_size)
        if pieces == 0:
            return zeros, state
        steps = s._steps(w, x_t)  # (B, R)
        if pieces == 1:
            return zeros, state
        stream = ResamplingState(*(state[name] for name in s.STREAM_FIELDS))
        stream, emission = resampling_step(stream, s._window_inputs(w, x_t), steps, w.lattice, mask_t)  # (B, R, W)
        state = {**state, **stream._asdict()}
        if pieces == 2:
            return zeros, state
        x_bar = s._compress(w, emission.inputs, emission.distance, emission.valid, x_t.dtype)  # (B, R, H_b)
        if pieces == 3:
            return zeros, state
        s._branch_mambas(w, x_bar, state["conv_state"], state["ssm_state"])
        return zeros, state

    return step


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--width", type=int, default=256, help="Mamba's hidden size W; SeRpEnt's is W − W mod 3")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--context", type=int, default=128, help="prompt length")
    p.add_argument("--steps", type=int, default=64, help="greedy steps per timed block")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--name", default="serpent_step_breakdown", help="results file stem")
    p.add_argument("--no-write", action="store_true", help="print only")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    import ssmhub.layers.serpent as serpent

    real_step = serpent.step_branches
    mamba, model = build(args, []).eval(), build(args, [0.5, 0.1]).eval()
    configs = {"Mamba": (mamba, real_step), "SeRpEnt": (model, real_step)}
    configs.update({f"SeRpEnt, branches: {piece}": (model, prefix_step(i)) for i, piece in enumerate(PIECES)})
    times = {name: [] for name in configs}
    for _ in range(args.rounds):
        for name, (m, step) in configs.items():
            serpent.step_branches = step
            try:
                decode_ms(m, args.context, 4)  # warm-up
                times[name].append(decode_ms(m, args.context, args.steps))
            finally:
                serpent.step_branches = real_step
    ms = {name: median(v) for name, v in times.items()}
    prefixes = [f"SeRpEnt, branches: {p}" for p in PIECES]
    added = {later: f"{ms[later] - ms[earlier]:+.2f}" for earlier, later in itertools.pairwise(prefixes)}
    rows = [[name, f"{ms[name]:.2f}", f"{ms[name] / ms['Mamba']:.2f}×", added.get(name, "")] for name in configs]
    table = markdown_table(["decode step", "ms/token", "÷ Mamba", "piece adds (ms/token)"], rows)
    budget = 1.5 * ms["Mamba"] - ms["SeRpEnt, branches: none"]
    branches = ms["SeRpEnt"] - ms["SeRpEnt, branches: none"]
    arithmetic = (
        f"Target ≤ 1.5× Mamba = {1.5 * ms['Mamba']:.2f} ms/token. SeRpEnt without its branches' step takes "
        f"{ms['SeRpEnt, branches: none']:.2f}, which leaves {budget:.2f} ms/token for the two resampling branches "
        f"of {args.layers} layers; their real step takes {branches:.2f} ({branches / budget:.2f}× the budget)."
    )
    print(table, arithmetic, sep="\n")
    if not args.no_write:
        text = (
            f"Width {args.width} (Mamba) and {args.width - args.width % 3} (SeRpEnt [0.5, 0.1]), {args.layers} layers, "
            f"vocabulary {args.vocab_size}; batch 1, {args.steps} greedy "
            f"steps after a {args.context}-token random prompt; one thread; median of {args.rounds} rounds, the "
            "configurations interleaved in one process."
        )
        path = write_report(args.name, "SeRpEnt's decode step, piece by piece", [text, table, arithmetic])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
