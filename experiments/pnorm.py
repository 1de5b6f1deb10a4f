"""Column p-norm (p = 1.2) and block normalisation of the block-diagonal LRNN, against torch's own ops.

What is measured (CPU, float32, medians of alternating calls), on the transitions of one training batch
of the regular-language benchmark: G (B·T = 128·40 tokens, h = 8 heads, b × b = 8 × 8):

1. The norm alone, forward + backward: ``ssmhub.ops.vector_p_norm`` vs ``torch.linalg.vector_norm``,
   over the rows of every column.
2. The authors' block normalisation (centre the columns, divide by the largest column p-norm), forward
   + backward, three ways: composed from torch ops under autograd with ``torch.linalg.vector_norm``
   (the peer, ``normalize_by_largest_column_ref``), the same composition with ``vector_p_norm``, and the
   fused op with its own backward (``ssmhub.ops.block_norm.normalize_by_largest_column``).
3. One whole training step of that benchmark (Sum(5), the bdlrnn token classifier of
   ``ssmhub.training.regular``, batch 128 at length 40, Adam) with each of the three normalisations;
   same weights and batches.

Run: ``OMP_NUM_THREADS=1 python experiments/pnorm.py`` (about a minute).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _experiments  # noqa: F401  (benchmarks/'s helpers, results into experiments/results/)
from _report import markdown_table, median, write_report

import ssmhub.layers.bdlrnn as bdlrnn_layer
from ssmhub.data.regular import get_task
from ssmhub.ops.block_norm import normalize_by_largest_column, normalize_by_largest_column_ref
from ssmhub.ops.pnorm import vector_p_norm
from ssmhub.training.regular import RegularRunConfig, build_model


def torch_p_norm(x, p, dim=-1, keepdim=False):
    return torch.linalg.vector_norm(x, ord=p, dim=dim, keepdim=keepdim)


def composed_with_vector_p_norm(G, p, eps=0.0):
    """The normalisation composed under autograd, with ssmhub's p-norm (what the layer ran before fusing)."""
    centred = G - G.mean(dim=-2, keepdim=True)
    return centred / (vector_p_norm(centred, p, dim=-2).amax(dim=-1) + eps)[..., None, None]


NORMALISATIONS = {
    "composed, torch norm": normalize_by_largest_column_ref,
    "composed, vector_p_norm": composed_with_vector_p_norm,
    "fused": normalize_by_largest_column,
}


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


def normalisation_alone(args) -> dict[str, list[float]]:
    G = torch.randn(args.batch * args.length, 8, 8, 8, generator=torch.Generator().manual_seed(args.seed))
    grad = torch.randn_like(G)

    def run(normalise):
        def call():
            normalise(G.clone().requires_grad_(), args.p).backward(grad)

        return call

    return alternate({name: run(fn) for name, fn in NORMALISATIONS.items()}, args.repeats)


def training_step(args) -> tuple[dict[str, list[float]], int]:
    task = get_task("sum", 5)
    torch.manual_seed(args.seed)
    model = build_model(RegularRunConfig(model_type="bdlrnn", task="sum"), task)
    num_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    data = torch.Generator().manual_seed(args.seed)

    def run(normalise):
        def call():
            bdlrnn_layer.normalize_by_largest_column = normalise
            try:
                input_ids, labels = task.sample(args.batch, args.length, data)
                loss = model(input_ids, labels=labels).loss
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            finally:
                bdlrnn_layer.normalize_by_largest_column = normalize_by_largest_column

        return call

    return alternate({name: run(fn) for name, fn in NORMALISATIONS.items()}, args.repeats), num_params


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
    normalisation = normalisation_alone(args)
    step, num_params = training_step(args)
    t_torch, t_ours = 1e3 * median(alone["torch"]), 1e3 * median(alone["ssmhub"])
    norm_row = ["column p-norm, forward + backward", f"{t_torch:.1f}", f"{t_ours:.1f}", f"**{t_torch / t_ours:.2f}×**"]
    table = markdown_table(["what", "torch.linalg.vector_norm ms", "ssmhub vector_p_norm ms", "speed-up"], [norm_row])
    rows = []
    for what, times in (("block normalisation, forward + backward", normalisation), ("training step (Sum(5))", step)):
        ms = {name: 1e3 * median(times[name]) for name in NORMALISATIONS}
        peer = ms["composed, torch norm"]
        rows.append([what, *(f"{ms[name]:.1f}" for name in NORMALISATIONS)])
        rows[-1] += [f"{peer / ms['composed, vector_p_norm']:.2f}×", f"**{peer / ms['fused']:.2f}×**"]
        print("  " + " | ".join(rows[-1]), flush=True)
    header = ["what", *(f"{name} ms" for name in NORMALISATIONS), "speed-up, vector_p_norm", "speed-up, fused"]
    table += "\n\n" + markdown_table(header, rows)
    notes = [
        f"- p = {args.p}; G ({args.batch}·{args.length} tokens, h = 8, b = 8, b = 8) float32, norm over dim −2; "
        f"max |Δ norm| between the two: {diff:.1e}. Gradients equal torch's to 1e-10 in float64 "
        "(tests/ops/test_pnorm.py).",
        "- Block normalisation: C = G − mean_i G, A = C / max_j ‖C[:, j]‖_p per block; values and gradients "
        "of the fused op equal the composition's to 1e-10 in float64 (tests/ops/test_block_norm.py). Speed-ups "
        "are against the composition with torch's norm.",
        "- Training step: the default bdlrnn token classifier of `ssmhub.training.regular` for Sum(5) "
        f"({num_params:,} parameters), batch {args.batch} at length {args.length}, Adam; the three "
        "normalisations alternate on the same model.",
        f"- Medians of {args.repeats} alternating calls after one warm-up each; torch.get_num_threads() = "
        f"{torch.get_num_threads()}. The machine is shared with other jobs.",
    ]
    sections = ["## Results (medians)\n\n" + table, "## Notes\n\n" + "\n".join(notes)]
    if not args.no_write:
        print("wrote", write_report("pnorm", "Column p-norm and block normalisation vs torch's ops", sections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
