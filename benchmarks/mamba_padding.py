"""What a padding mask costs ssmhub's Mamba mixer, against transformers' MambaMixer given the same mask.

Since pads are skipped by the short convolution (each real token's taps meet the real tokens before it, the window
holds at a pad: ``ssmhub.ops.short_conv``, arXiv 2312.00752 §3.4), a masked forward gathers the real tokens to the
front of each row and back (two gathers of (B, L, E) forward, their scatters backward). Measured: one training step
(forward and backward, float32, CPU) of one mixer on a (B, L, H) input without a mask, with an all-ones mask (what
transformers' collators hand over) and with holes (a pad every 8 tokens), as the median of ``--repeats`` steps; the
peer is transformers' ``MambaMixer`` (its torch path) with the same masks, timed in the same run. Ratios: each
row's median over the unmasked one's of the same mixer, and ssmhub's over transformers' for the same mask. The
cases take turns within each repeat (a shared machine's load drifts).

    python benchmarks/mamba_padding.py            # writes benchmarks/results/mamba_padding.md
    python benchmarks/mamba_padding.py --quick    # seconds, prints only
"""

from __future__ import annotations

import argparse
import time

import torch
from _report import markdown_table, median, write_report
from transformers import MambaConfig
from transformers.models.mamba.modeling_mamba import MambaMixer as TransformersMambaMixer

from ssmhub.layers.mamba import MambaMixer


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, seconds; prints only")
    p.add_argument("--hidden", type=int, default=128, help="hidden_size H (inner width 2H)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5, help="timed steps per case (their median)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = p.parse_args(argv)
    if args.quick:
        args.hidden, args.batch, args.length, args.repeats = 32, 2, 64, 3
    return args


def build_mixers(hidden: int) -> dict[str, torch.nn.Module]:
    """ssmhub's mixer and transformers' on the same weights (state size 16, the reference defaults)."""
    config = MambaConfig(hidden_size=hidden, state_size=16, expand=2, num_hidden_layers=1, use_mambapy=False)
    theirs = TransformersMambaMixer(config, layer_idx=0)
    ours = MambaMixer(hidden, state_size=16, time_step_rank=int(config.time_step_rank))
    ours.load_state_dict({k if k not in ("A_log", "D") else f"ssm.{k}": v for k, v in theirs.state_dict().items()})
    return {"ssmhub": ours, "transformers": theirs}


def masks(batch: int, length: int) -> dict[str, torch.Tensor | None]:
    holes = torch.ones(batch, length, dtype=torch.long)
    holes[:, 3::8] = 0  # a pad every 8 tokens
    return {"none": None, "all ones": torch.ones(batch, length, dtype=torch.long), "holes (1 in 8)": holes}


def training_step(name: str, mixer, x: torch.Tensor, mask) -> None:
    y = mixer(x, mask=mask)[0] if name == "ssmhub" else mixer(x, attention_mask=mask)
    y.square().mean().backward()


def timed_ms(name: str, mixer, x: torch.Tensor, mask) -> float:
    start = time.perf_counter()
    training_step(name, mixer, x, mask)
    return 1e3 * (time.perf_counter() - start)


def measure(args) -> dict[tuple[str, str], float]:
    """(mixer, mask) -> median ms of a training step. The cases take turns within each repeat, so that a change in
    the machine's load during the run slows them alike."""
    torch.manual_seed(0)
    mixers = build_mixers(args.hidden)
    x = torch.randn(args.batch, args.length, args.hidden, requires_grad=True)
    cases = {
        (name, kind): (mixers[name], mask) for kind, mask in masks(args.batch, args.length).items() for name in mixers
    }
    for (name, _), (mixer, mask) in cases.items():
        training_step(name, mixer, x, mask)  # warm-up
    times = {case: [] for case in cases}
    for _ in range(args.repeats):
        for (name, kind), (mixer, mask) in cases.items():
            times[(name, kind)].append(timed_ms(name, mixer, x, mask))
    return {case: median(values) for case, values in times.items()}


def table(ms: dict[tuple[str, str], float]) -> str:
    rows = []
    for kind in dict.fromkeys(kind for _, kind in ms):
        ours, theirs = ms[("ssmhub", kind)], ms[("transformers", kind)]
        rows.append(
            [
                kind,
                f"{ours:.1f}",
                f"{ours / ms[('ssmhub', 'none')]:.2f}",
                f"{theirs:.1f}",
                f"{theirs / ms[('transformers', 'none')]:.2f}",
                f"{ours / theirs:.2f}",
            ]
        )
    headers = ["mask", "ssmhub ms", "× unmasked", "transformers ms", "× unmasked", "ssmhub / transformers"]
    return markdown_table(headers, rows)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    result = table(measure(args))
    print(result)
    if not args.quick:
        shape = f"B {args.batch} × L {args.length} × H {args.hidden}, float32, {args.threads} thread(s)"
        note = f"One mixer's training step (forward and backward), median of {args.repeats}; {shape}."
        path = write_report("mamba_padding", "Mamba mixer: the cost of a padding mask", [note, "", result])
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
