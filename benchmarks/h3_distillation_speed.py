"""How long distilling an H3 takes: the truncated (block Krylov) Hankel eigensolver against the dense ``eigh``.

What is measured
----------------
For each ``--sizes`` entry (``WIDTHxLAYERS``) a randomly initialised ``H3ForCausalLM`` (the config's defaults
otherwise: L_max 2048, attention layers where the config puts them) gives the learned kernels of every long
convolution, the ones ``distill_for_decoding`` fits. On ``--sample`` channels spread over all layers,
``fit_modal_kernels_threaded(kernels, [N], method)`` (what ``distill_for_decoding(N)`` runs per layer: the fit
in a thread per torch thread where each gets at least 16 channels, else one call) is timed with
``eigensolver="truncated"`` (the default) and on the first ``--dense-sample`` of them with ``eigensolver="dense"``
(one T×T ``eigh`` per channel), medians of ``--repeats``; both per-channel times are multiplied by the model's
channel count (extrapolated, labelled so) and their ratio reported. On the dense sample the per-channel fit errors of
both are compared: the issue's bound is "within 1% (relative) of the dense fit"; ``--long-sample K`` compares K more
channels, spread over those of long support (at least ``LONG_TAPS_PER_RANK``·2N taps before their trailing zeros,
where the Krylov basis is largest and a random init is hardest), once each. ``--full`` also times the whole
``model.distill_for_decoding(N)`` once (measured, not extrapolated). The machine's load average is recorded with
each row: these machines are shared, so absolute seconds follow the load; the ratio is measured in the same run.

Run: ``python benchmarks/h3_distillation_speed.py --sizes 256x4 768x12 --threads 1``
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import markdown_table, median, report

import ssmhub
from ssmhub.ops.hankel import LONG_TAPS_PER_RANK, kernel_support
from ssmhub.ops.modal_threads import fit_modal_kernels_threaded


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--sizes", nargs="+", default=["256x4", "768x12"], help="WIDTHxLAYERS of the H3 models")
    p.add_argument("--modes", type=int, default=64, help="N, modes per channel")
    p.add_argument("--max-kernel-length", type=int, default=2048, help="L_max of the models (the config's default)")
    p.add_argument("--method", default="best", help="fit method (distill_for_decoding's default: best)")
    p.add_argument("--sample", type=int, default=16, help="channels timed with the truncated eigensolver")
    p.add_argument("--dense-sample", type=int, default=4, help="of those, channels timed with the dense eigh")
    p.add_argument("--long-sample", type=int, default=0, help="channels of long support also compared with dense")
    p.add_argument("--repeats", type=int, default=2, help="timings per measurement (median)")
    p.add_argument("--full", action="store_true", help="also time the whole model's distill_for_decoding once")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--name", default="h3_distillation_speed", help="results/<name>.md")
    p.add_argument("--no-write", action="store_true", help="print only; do not write the results file")
    return p.parse_args(argv)


def random_h3(size: str, max_kernel_length: int) -> ssmhub.H3ForCausalLM:
    """A randomly initialised H3 of ``WIDTHxLAYERS`` (seed 0; small vocabulary: the embedding is not fitted)."""
    width, layers = (int(x) for x in size.lower().split("x"))
    torch.manual_seed(0)
    config = ssmhub.H3Config(
        hidden_size=width, num_hidden_layers=layers, vocab_size=256, max_kernel_length=max_kernel_length
    )
    return ssmhub.H3ForCausalLM(config).eval()


@torch.no_grad()
def model_kernels(model) -> torch.Tensor:
    """Every long convolution's learned (H, L_max) kernels, stacked over layers: what distilling fits."""
    mixers = model._long_conv_mixers().values()
    return torch.cat([m._learned()(m.max_kernel_length).detach().float().cpu() for m in mixers])


def timed_fit(kernels: torch.Tensor, args, eigensolver: str):
    """Median seconds of ``repeats`` fits of ``kernels`` and the last fit's per-channel errors."""
    times, fit = [], None
    for _ in range(args.repeats):
        start = time.perf_counter()
        fit = fit_modal_kernels_threaded(kernels, [args.modes], args.method, eigensolver=eigensolver)[0]
        times.append(time.perf_counter() - start)
    return median(times), fit.relative_error


def error_row(label: str, fast_err: torch.Tensor, dense_err: torch.Tensor) -> list:
    """The per-channel fit errors of the truncated route against the dense one's, as a table row."""
    change = (fast_err.double() - dense_err.double()) / dense_err.double().clamp(min=1e-12)
    return [
        label, len(dense_err), f"{dense_err.mean():.4f}", f"{fast_err.mean():.4f}",
        f"{100 * change.max():+.2f}%", "yes" if bool((change <= 0.01).all()) else "no",
    ]  # fmt: skip


def long_support_sample(kernels: torch.Tensor, args) -> tuple[torch.Tensor, int]:
    """``--long-sample`` channel indices spread over those of long support (over every layer), and how many such
    channels the model has; SystemExit, before any fit, when fewer than asked."""
    long = (kernel_support(kernels[:, 1:]) >= LONG_TAPS_PER_RANK * 2 * args.modes).nonzero().flatten()
    if len(long) < args.long_sample:
        raise SystemExit(
            f"--long-sample {args.long_sample}: this model has only {len(long)} channels of long support "
            f"(≥ {LONG_TAPS_PER_RANK * 2 * args.modes} taps at --modes {args.modes})"
        )
    return long[torch.linspace(0, len(long) - 1, args.long_sample).round().long()], len(long)


def long_support_errors(label: str, kernels: torch.Tensor, args) -> list:
    """The error row of the long-support channels ``kernels`` (:func:`long_support_sample`; one fit each way)."""
    fits = [fit_modal_kernels_threaded(kernels, [args.modes], args.method, eigensolver=solver)[0]
            for solver in ("truncated", "dense")]  # fmt: skip
    return error_row(label, *(fit.relative_error for fit in fits))


def measure_size(size: str, args) -> tuple[list, list]:
    """One size's timing row and error rows."""
    model = random_h3(size, args.max_kernel_length)
    kernels = model_kernels(model)  # (channels, L_max)
    channels = kernels.shape[0]
    sample = kernels[torch.linspace(0, channels - 1, args.sample).round().long()]  # spread over every layer
    long = long_support_sample(kernels, args) if args.long_sample else None  # (indices, count): before any fit
    load_before = os.getloadavg()[0]
    fast_s, fast_err = timed_fit(sample, args, "truncated")
    dense_s, dense_err = timed_fit(sample[: args.dense_sample], args, "dense")
    load_after = os.getloadavg()[0]
    fast_per, dense_per = fast_s / args.sample, dense_s / args.dense_sample
    full = f"{time_full(model, args):.0f} s" if args.full else "not run"
    timing = [
        size, f"{channels:,}", kernels.shape[-1], f"{fast_per:.3f}", f"{dense_per:.3f}",
        f"{fast_per * channels / 60:.1f}", f"{dense_per * channels / 60:.1f}", f"{dense_per / fast_per:.1f}×",
        full, f"{load_before:.1f} / {load_after:.1f}",
    ]  # fmt: skip
    errors = [error_row(size, fast_err[: args.dense_sample], dense_err)]
    if long is not None:
        errors.append(long_support_errors(f"{size}, long support ({long[1]:,} channels)", kernels[long[0]], args))
    return timing, errors


def time_full(model, args) -> float:
    start = time.perf_counter()
    model.distill_for_decoding(args.modes)
    return time.perf_counter() - start


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if not 1 <= args.dense_sample <= args.sample:
        raise SystemExit(f"--dense-sample must be in [1, --sample]; got {args.dense_sample}")
    if args.long_sample < 0:
        raise SystemExit(f"--long-sample must be 0 (none) or more channels; got {args.long_sample}")
    timings, errors = [], []
    for size in args.sizes:
        timing, rows = measure_size(size, args)
        print(
            " | ".join(str(c) for c in timing), *("|| " + " | ".join(str(c) for c in row) for row in rows), flush=True
        )
        timings.append(timing)
        errors.extend(rows)
    timing_headers = [
        "model (width × layers)", "channels fitted", "L_max", "truncated s/channel", "dense s/channel",
        "truncated min/model (extrapolated)", "dense min/model (extrapolated)", "dense ÷ truncated",
        "whole distill_for_decoding (measured)", "load average before / after",
    ]  # fmt: skip
    error_headers = ["model", "channels compared", "dense fit error (mean)", "truncated (mean)",
                     "largest per-channel change", "every channel within 1%"]  # fmt: skip
    notes = (
        f"- `fit_modal_kernels_threaded(kernels, [{args.modes}], {args.method!r}, eigensolver=...)` on {args.sample} "
        f"channels (truncated) and the first {args.dense_sample} of them (dense), spread over every layer; medians of "
        f"{args.repeats}; per-model minutes = seconds per channel × channels (extrapolated), torch threads "
        f"{torch.get_num_threads()}.\n- Random-init kernels (no trained model of these sizes exists here): noise "
        "under a decaying envelope, whose Hankel singular values fall slowly, the hardest case for a truncated "
        "eigensolver (see docs/families/h3.md)."
    )
    report(
        args,
        "H3 distillation time: truncated vs dense Hankel eigensolver",
        ["## Time per model size", markdown_table(timing_headers, timings),
         "## Fit errors, truncated vs dense (same channels)", markdown_table(error_headers, errors),
         "## Notes", notes],
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
