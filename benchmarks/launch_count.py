"""Launches per training step, counted on a CPU: the gauge of issue 52 §1 between GPU calls.

On a GPU a training step of a small-batch model is bound by its kernel launches as much as by its arithmetic; each
leaf ATen op (one that launches a kernel itself, none running under another; views and allocations left out:
``_gpu_profile.py``) is about one kernel launch. This script counts them for one eager training step (forward with
labels, backward, AdamW, bf16 autocast, as ``gpu_suite.py``'s step e) of every model of the GPU suite's zoo
(``_gpu_models.py``) at the users' depths (GPT-2, DLR, H3, BDLRNN 12 layers; Mamba and SeRpEnt 24) but a small width
(8 minutes on 2 cores shared with a load of 15; the counts are exact, the load does not move them). The count hardly
depends on the width; it does on the code paths: on a CPU the scans take their pure-torch paths (the chunked
selective scan, the block-scan loop) where a GPU runs one Triton kernel, so a family's count here is an upper bound
of its GPU count, and a fall in it is a fall in launches wherever the op runs on both. The GPU suite reports the
same count on the device beside each row of its training table.

After compilation the count to watch is the GPU suite's: each compiled row of its table gives the ATen ops left in
a step and the kernels Inductor generated (on a CPU, Inductor's C++ compilation of every model is minutes).

    python benchmarks/launch_count.py            # writes benchmarks/results/launch_count.md
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _gpu_models import MODELS, build_model, depth, tiny_shape
from _gpu_profile import count_aten_ops
from _gpu_train import make_step
from _report import markdown_table, report


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--width", type=int, default=48, help="model width (a multiple of 24: SeRpEnt's 3 branches of 8)")
    p.add_argument("--length", type=int, default=256, help="tokens per row")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--name", default="launch_count", help="results file stem")
    p.add_argument("--no_write", action="store_true", help="print only")
    args = p.parse_args(argv)
    if args.width <= 0 or args.width % 24:
        p.error(f"--width must be a positive multiple of 24, got {args.width}")
    if args.length < 16 or args.batch < 1:
        p.error(f"--length must be at least 16 and --batch at least 1, got {args.length} and {args.batch}")
    return args


def count_row(args, name: str) -> list[str]:
    """Leaf ATen ops of one eager step (after a warm-up step)."""
    shape = tiny_shape(width=args.width, depth_scale=1, max_length=max(256, args.length))
    model = build_model(name, shape, "cpu").train()
    ids = torch.randint(
        0, model.config.vocab_size, (args.batch, args.length), generator=torch.Generator().manual_seed(2)
    )
    step = make_step(model, model, ids)
    step()
    eager = count_aten_ops(step)
    return [name, str(depth(name, shape)), str(eager), f"{eager / depth(name, shape):.0f}"]


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    headers = ["model", "layers", "leaf ATen ops / step (eager)", "per layer"]
    rows = [count_row(args, name) for name in MODELS]
    text = (
        f"One eager training step on the CPU (bf16 autocast, AdamW), width {args.width}, batch {args.batch} × L "
        f"{args.length}, the GPU suite's models at their depths (`benchmarks/_gpu_models.py`). Leaf ATen ops: "
        "the ops that launch a kernel themselves, none running under another (views and allocations left out: "
        "`benchmarks/_gpu_profile.py`); per layer "
        "includes the embedding, loss and optimizer ops shared out. On a CPU the scans take their torch paths."
    )
    report(args, "Launches per training step, counted on a CPU", [text, markdown_table(headers, rows)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
