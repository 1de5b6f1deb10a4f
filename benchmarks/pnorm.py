"""Column p-norm (p = 1.2) of the block-diagonal LRNN: ``ssmhub.ops.vector_p_norm`` vs ``torch.linalg.vector_norm``.

What is measured (CPU, float32, medians of alternating calls):

1. The norm alone, forward + backward, on the transitions of one training batch of the regular-language
   benchmark: G (B·T = 128·40 tokens, h = 8 heads, b × b = 8 × 8), norm over the rows of every column.
2. One whole training step of that benchmark (Sum(5), the bdlrnn token classifier of
   ``ssmhub.training.regular``, batch 128 at length 40, Adam), with ``normalize_blocks`` using each norm:
   the peer swaps ``torch.linalg.vector_norm`` in for ``vector_p_norm``; same weights and batches.

Run: ``OMP_NUM_THREADS=1 python benchmarks/pnorm.py`` (about a minute).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import markdown_table, median, write_report

import ssmhub.layers.bdlrnn as bdlrnn_layer
from ssmhub.data.regular import get_task
from ssmhub.ops.pnorm import vector_p_norm
from ssmhub.training.regular import RegularRunConfig, build_model


def torch_p_norm(x, p, dim=-1, keepdim=False):
    return torch.linalg.vector_norm(x, ord=p, dim=dim, keepdim=keepdim)


def alternate(fns: dict, repeats: int) -> dict[str, list[float]]:
    """Seconds per call of every function, called in turns after one untimed warm-up each."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def norm_alone(args) -> tuple[dict[str, list[float]], float]:
    G = torch.randn(args.batch * args.length, 8, 8, 8, generator=torch.Generator().manual_seed(args.seed))

    def run(norm):
        def call():
            x = G.clone().requires_grad_()
            norm(x, args.p, dim=-2).sum().backward()

        return call

    diff = (vector_p_norm(G, args.p, dim=-2) - torch_p_norm(G, args.p, dim=-2)).abs().max().item()
    return alternate({"torch": run(torch_p_norm), "ssmhub": run(vector_p_norm)}, args.repeats), diff


def training_step(args) -> tuple[dict[str, list[float]], int]:
    task = get_task("sum", 5)
    torch.manual_seed(args.seed)
    model = build_model(RegularRunConfig(model_type="bdlrnn", task="sum"), task)
    num_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    data = torch.Generator().manual_seed(args.seed)

    def run(norm):
        def call():
            bdlrnn_layer.vector_p_norm = norm
            try:
                input_ids, labels = task.sample(args.batch, args.length, data)
                loss = model(input_ids, labels=labels).loss
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            finally:
                bdlrnn_layer.vector_p_norm = vector_p_norm

        return call

    return alternate({"torch": run(torch_p_norm), "ssmhub": run(vector_p_norm)}, args.repeats), num_params


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--length", type=int, default=40)
    parser.add_argument("--p", type=float, default=1.2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    alone, diff = norm_alone(args)
    step, num_params = training_step(args)
    rows = []
    for what, times in (("norm forward + backward", alone), ("regular-language training step (Sum(5))", step)):
        t_torch, t_ours = 1e3 * median(times["torch"]), 1e3 * median(times["ssmhub"])
        rows.append([what, f"{t_torch:.1f}", f"{t_ours:.1f}", f"**{t_torch / t_ours:.2f}×**"])
        print("  " + " | ".join(rows[-1]), flush=True)
    table = markdown_table(["what", "torch.linalg.vector_norm ms", "ssmhub vector_p_norm ms", "speed-up"], rows)
    notes = [
        f"- p = {args.p}; G ({args.batch}·{args.length} tokens, h = 8, b = 8, b = 8) float32, norm over dim −2; "
        f"max |Δ norm| between the two: {diff:.1e}. Gradients equal torch's to 1e-10 in float64 "
        "(tests/ops/test_pnorm.py).",
        "- Training step: the default bdlrnn token classifier of `ssmhub.training.regular` for Sum(5) "
        f"({num_params:,} parameters), batch {args.batch} at length {args.length}, Adam; the two norms "
        "alternate on the same model.",
        f"- Medians of {args.repeats} alternating calls after one warm-up each; torch.get_num_threads() = "
        f"{torch.get_num_threads()}. The machine is shared with other jobs.",
    ]
    sections = ["## Results (medians)\n\n" + table, "## Notes\n\n" + "\n".join(notes)]
    if not args.no_write:
        print("wrote", write_report("pnorm", "Column p-norm: vector_p_norm vs torch.linalg.vector_norm", sections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
