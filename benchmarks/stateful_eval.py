"""Stateful vs sliding-window evaluation: tokens/s on the same model and tokens, and peak memory vs document length.

What is measured
----------------
Randomly initialised ssmhub causal LMs (float32, batch 1, eval mode, ``torch.inference_mode()``), one
document of random token ids (the cost does not depend on the values):

- speed: the same document (``--speed-tokens`` tokens) scored three ways, interleaved in each repeat so that
  background load hits all alike:
  ``stateful`` (:func:`ssmhub.evaluation.evaluate_perplexity_stateful`: windows of ``--max-length`` that carry
  the recurrent cache, every token conditioned on the whole document before it), the peer
  ``windowed, stride = max_length`` (:func:`ssmhub.evaluation.evaluate_perplexity`, non-overlapping windows:
  the same forward work, each window from a zero state) and, as a reference, ``windowed, stride =
  max_length / 2`` (``ssmhub-eval``'s default, each token fed twice). Reported: document tokens per second,
  the median over ``--repeats``, and the ratio stateful ÷ windowed (stride = max_length); target ≥ 0.9.
- memory: the peak resident memory (Linux ``VmHWM``, :mod:`_memory`) of a stateful evaluation of a
  ``--short-tokens`` (4K) and a ``--long-tokens`` (64K) document above what was resident before (model loaded),
  after one untimed warm-up; it should be flat (the cache has a fixed size, one window's activations at a time).

Run: ``python benchmarks/stateful_eval.py`` (a few minutes on 2 CPU cores with the defaults).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

import ssmhub
from ssmhub.evaluation import evaluate_perplexity, evaluate_perplexity_stateful

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _memory import peak_rss_above_baseline, peak_rss_available
from _report import markdown_table, median, write_report

SCRIPT_NAME = "stateful_eval"
MB = 2**20
PROTOCOLS = ("stateful", "windowed, stride = max_length", "windowed, stride = max_length / 2")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--families", nargs="+", default=["dlr", "h3", "mamba"], choices=["dlr", "h3", "mamba"])
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--max-length", type=int, default=1024, help="tokens per window, both protocols")
    p.add_argument("--speed-tokens", type=int, default=8192, help="document length of the speed comparison")
    p.add_argument("--short-tokens", type=int, default=4096)
    p.add_argument("--long-tokens", type=int, default=65536)
    p.add_argument("--repeats", type=int, default=5, help="timed runs per protocol (median reported)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-write", action="store_true", help="print only; do not write the results file")
    return p.parse_args(argv)


def build_model(family: str, args: argparse.Namespace):
    """A causal LM of the family at the benchmark's size (H3 without attention layers: a pure long-conv model
    whose kernel spans a window; Mamba: SeRpEnt with no resampling branch)."""
    size = {"vocab_size": args.vocab_size, "hidden_size": args.hidden_size, "num_hidden_layers": args.layers}
    torch.manual_seed(args.seed)
    if family == "dlr":
        return ssmhub.DLRForCausalLM(ssmhub.DLRConfig(**size, state_size=64)).eval()
    if family == "h3":
        config = ssmhub.H3Config(**size, attention_layers=[], max_kernel_length=args.max_length, ssm_num_heads=8)
        return ssmhub.H3ForCausalLM(config).eval()
    return ssmhub.SerpentForCausalLM(ssmhub.SerpentConfig(**size, resampling_rates=[])).eval()


def document(length: int, vocab_size: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, (length,), generator=torch.Generator().manual_seed(seed))


def run_protocol(model, doc: torch.Tensor, protocol: str, max_length: int):
    """Score ``doc`` with one protocol; returns the result (its sums)."""
    if protocol == PROTOCOLS[0]:
        return evaluate_perplexity_stateful(model, [doc], max_length)
    stride = max_length if protocol == PROTOCOLS[1] else max_length // 2
    return evaluate_perplexity(model, [doc], max_length, stride)


def time_protocols(model, doc: torch.Tensor, args: argparse.Namespace) -> dict[str, list[float]]:
    """Seconds per run of each protocol: one untimed warm-up each, then ``repeats`` interleaved rounds."""
    for protocol in PROTOCOLS:
        run_protocol(model, doc[: 2 * args.max_length], protocol, args.max_length)
    seconds: dict[str, list[float]] = {protocol: [] for protocol in PROTOCOLS}
    for _ in range(args.repeats):
        for protocol in PROTOCOLS:
            start = time.perf_counter()
            run_protocol(model, doc, protocol, args.max_length)
            seconds[protocol].append(time.perf_counter() - start)
    return seconds


def peak_memory(model, args: argparse.Namespace) -> dict[int, tuple[int, float]]:
    """``{document length: (peak bytes above the baseline, ppl)}`` of stateful evaluation, after a warm-up."""
    evaluate_perplexity_stateful(model, [document(args.short_tokens, args.vocab_size, args.seed)], args.max_length)
    peaks = {}
    for length in (args.short_tokens, args.long_tokens):
        nbytes, doc = peak_rss_above_baseline(
            lambda length=length: document(length, args.vocab_size, args.seed),
            lambda doc: evaluate_perplexity_stateful(model, [doc], args.max_length),
        )
        peaks[length] = (nbytes, doc.numel())
    return peaks


def speed_rows(family: str, seconds: dict[str, list[float]], tokens: int) -> list[list[str]]:
    """Per protocol: median tokens/s, the ratio to the windowed peer, and every repeat."""
    rate = {protocol: tokens / median(values) for protocol, values in seconds.items()}
    peer = rate[PROTOCOLS[1]]
    return [
        [
            family,
            protocol,
            f"{rate[protocol]:,.0f}",
            f"{rate[protocol] / peer:.3f}×",
            ", ".join(f"{tokens / s:,.0f}" for s in seconds[protocol]),
        ]
        for protocol in PROTOCOLS
    ]


def memory_rows(family: str, peaks: dict[int, tuple[int, int]]) -> list[list[str]]:
    short, long = sorted(peaks)
    ratio = peaks[long][0] / max(peaks[short][0], 1)
    return [
        [
            family,
            f"{short:,}",
            f"{peaks[short][0] / MB:.1f}",
            f"{long:,}",
            f"{peaks[long][0] / MB:.1f}",
            f"{ratio:.2f}×",
        ]
    ]


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    speed, memory, checks = [], [], []
    for family in args.families:
        model = build_model(family, args)
        seconds = time_protocols(model, document(args.speed_tokens, args.vocab_size, args.seed), args)
        rows = speed_rows(family, seconds, args.speed_tokens)
        speed += rows
        ratio = float(rows[0][3].rstrip("×"))
        checks.append(
            f"- [{'PASS' if ratio >= 0.9 else 'FAIL'}] {family}: stateful ÷ windowed (stride = max_length) "
            f"tokens/s = {ratio:.3f} (target ≥ 0.9)"
        )
        if peak_rss_available():
            peaks = peak_memory(model, args)
            memory += memory_rows(family, peaks)
            short, long = sorted(peaks)
            flat = peaks[long][0] <= 1.25 * peaks[short][0] + 8 * MB
            checks.append(
                f"- [{'PASS' if flat else 'FAIL'}] {family}: peak RSS flat from {short:,} to {long:,} tokens "
                f"({peaks[short][0] / MB:.1f} MB vs {peaks[long][0] / MB:.1f} MB; flat = within 1.25× + 8 MB)"
            )
        print(f"{family}: done", flush=True)
    sections = report_sections(args, speed, memory, checks)
    print("\n\n".join(sections))
    if not args.no_write:
        print(f"wrote {write_report(SCRIPT_NAME, 'Stateful vs sliding-window evaluation: speed and memory', sections)}")


def report_sections(args, speed, memory, checks) -> list[str]:
    speed_table = markdown_table(
        ["family", "protocol", "tokens/s (median)", "÷ windowed", "tokens/s per repeat"], speed
    )
    sections = [
        f"## Speed: one {args.speed_tokens:,}-token document, windows of {args.max_length}\n\n{speed_table}",
    ]
    if memory:
        headers = ["family", "short doc tokens", "peak RSS MB", "long doc tokens", "peak RSS MB", "long ÷ short"]
        sections.append(
            f"## Peak memory of stateful evaluation (above the loaded model)\n\n{markdown_table(headers, memory)}"
        )
    sections.append("## Checks\n\n" + "\n".join(checks))
    sections.append(
        "## Notes\n\n"
        f"- Models: hidden {args.hidden_size}, {args.layers} layers, vocab {args.vocab_size}, float32, random weights "
        "(DLR state size 64; H3 pure long convolution, kernel length = window, 8 heads; Mamba = SeRpEnt without "
        "resampling).\n"
        "- tokens/s counts the document's tokens (the same for every protocol); the windowed peer with stride = "
        "max_length feeds each token once, as stateful does, but starts every window from a zero state; the "
        "stride = max_length / 2 row (ssmhub-eval's default) feeds each token twice.\n"
        f"- {args.repeats} repeats, protocols interleaved within each repeat, one untimed warm-up each; medians.\n"
        "- The machine is shared: 2 CPU cores, loaded by other workers' jobs during the run (see the load average "
        "above), so single repeats are noisy; the ratios within a repeat are what to read."
    )
    return sections


if __name__ == "__main__":
    main()
