"""How soon does an H3 hybrid learn to copy? Training steps to induction on repeated random tokens (issue 27 §2).

Prompt lookup needs a model that continues a passage it has seen by copying it, the behaviour of induction heads
(Olsson et al. 2022, arXiv:2209.11895; H3's attention layers, arXiv 2212.14052 §3). This trains the hybrid of
``benchmarks/speculative.py``'s models (H3, 4 × 256, attention in layers 1 and 3, no position embeddings) from
scratch on sequences ``[r, r]`` of ``n`` uniform random tokens of a vocabulary V repeated once: the first half
cannot be predicted, the second only by copying from n tokens back. For each (V, n) it reports the first step at
which the repeat's top-1 accuracy (on the training batch) reaches 0.9, and the repeat's loss at the end; every
configuration sees the same tokens per step (``--batch-tokens``), Adam at 1e-3, one thread.

    python experiments/induction_steps.py --vocab 64 512 4096 --distance 48 192 --steps 400
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

import ssmhub

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _experiments  # noqa: F401  (benchmarks/'s helpers, results into experiments/results/)
from _copying import copy_step
from _report import markdown_table, print_and_write


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--vocab", type=int, nargs="+", default=[64, 512, 4096], help="vocabulary sizes V")
    p.add_argument("--distance", type=int, nargs="+", default=[48, 192], help="copy distances n")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-tokens", type=int, default=1536, help="tokens per step (batch = this // 2n)")
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--name", default="induction_steps", help="results/<name>.md")
    p.add_argument("--no-write", action="store_true")
    return p.parse_args(argv)


def steps_to_induction(vocab: int, distance: int, args) -> tuple[int | None, float, float]:
    """(first step with repeat top-1 ≥ 0.9 or None, the repeat's loss at the last step, seconds)."""
    torch.manual_seed(0)
    config = ssmhub.H3Config(
        vocab_size=vocab, hidden_size=args.hidden_size, num_hidden_layers=4, num_attention_heads=4,
        attention_layers=[1, 3], intermediate_size=4 * args.hidden_size, max_kernel_length=2 * distance,
    )  # fmt: skip
    model = ssmhub.H3ForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    generator = torch.Generator().manual_seed(1)
    batch = max(1, args.batch_tokens // (2 * distance))
    reached, start = None, time.perf_counter()
    for step in range(1, args.steps + 1):
        r = torch.randint(0, vocab, (batch, distance), generator=generator)
        x = torch.cat([r, r], dim=1)  # (batch, 2n)
        repeat_loss, top1 = copy_step(model, optimizer, x, distance)
        if reached is None and top1 >= 0.9:
            reached = step
    return reached, repeat_loss, time.perf_counter() - start


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for vocab in args.vocab:
        for distance in args.distance:
            reached, loss, seconds = steps_to_induction(vocab, distance, args)
            rows.append([
                vocab, distance, reached or f"not in {args.steps}", f"{loss:.2f}", f"{math.log(vocab):.2f}",
                f"{seconds:.0f}",
            ])  # fmt: skip
            print(rows[-1], flush=True)
    headers = ["V", "n", "step with repeat top-1 ≥ 0.9", "repeat loss at the end", "log V (no copying)", "seconds"]
    text = (
        f"H3 hybrid {args.hidden_size} × 4, attention in layers 1 and 3; sequences [r, r] of n uniform random "
        f"tokens; {args.batch_tokens} tokens per step, AdamW 1e-3 (weight decay 0.1), {args.steps} steps, seed 0; "
        "one thread."
    )
    title = "Steps to induction: an H3 hybrid copying random tokens"
    print_and_write(args, title, text, markdown_table(headers, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
