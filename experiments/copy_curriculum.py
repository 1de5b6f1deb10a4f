"""Teach a causal LM to copy before it learns language: repeated random tokens over a growing alphabet (issue 27 §2).

Prompt lookup pays only with a model that continues a passage it has seen by copying it (induction heads, Olsson
et al. 2022, arXiv:2209.11895; H3's attention layers, arXiv:2212.14052 §3). ``induction_steps.md`` shows how slowly
that comes from scratch: with a 4096-token vocabulary the H3 hybrid has not started to copy random tokens after 400
steps. This trains a fresh model of a saved model's architecture (``--like``) on sequences ``[r, r]`` of ``n``
random tokens, drawn from the first ``a`` ids after the special ones (``all``: every id but those), through the
stages ``--stages a:n_max,...``: each step draws ``n`` uniform in [``--min-distance``, n_max], and a stage is left
once the repeat's top-1 accuracy averages at least ``--threshold`` over its last ``--patience`` steps. A small
alphabet is learned first and the circuit carries over to larger ones; the table reports each stage's steps.

The model is saved into ``--output_dir`` and goes on to language modeling with
``ssmhub-train --model_name_or_path OUTPUT_DIR --tokenizer TOKENIZER ...``::

    python experiments/copy_curriculum.py --like runs/speculative/h3-hybrid-copy \\
        --output_dir runs/speculative/h3-copy-curriculum --steps 4000
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

import ssmhub  # noqa: F401  (registers the families with the Auto classes)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _experiments  # noqa: F401  (benchmarks/'s helpers, results into experiments/results/)
from _copying import copy_step
from _report import markdown_table, print_and_write

FIRST_ID = 2  # ids 0 and 1 are the special tokens (end of text, padding) of ssmhub's BPE tokenizers


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--like", required=True, help="a saved model folder whose config (not weights) is trained")
    p.add_argument("--output_dir", required=True, help="where the model is saved (and every 250 steps)")
    p.add_argument("--stages", default="64:64,512:128,all:256,all:512", help="alphabet:max distance, ...")
    p.add_argument("--min-distance", type=int, default=16, help="the shortest n drawn")
    p.add_argument("--steps", type=int, default=4000, help="steps in all (the last stage runs until then)")
    p.add_argument("--batch-tokens", type=int, default=2048, help="tokens per step (batch = this // 2n)")
    p.add_argument("--threshold", type=float, default=0.9)
    p.add_argument("--patience", type=int, default=30)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--name", default="copy_curriculum", help="results/<name>.md")
    p.add_argument("--no-write", action="store_true")
    return p.parse_args(argv)


def parse_stages(text: str, vocab_size: int, min_distance: int = 16) -> list[tuple[int, int]]:
    """``"64:64,all:512"`` -> [(64, 64), (vocab_size - FIRST_ID, 512)]; ValueError naming --stages otherwise."""
    stages = []
    for item in text.split(","):
        alphabet, _, distance = item.partition(":")
        try:
            a = vocab_size - FIRST_ID if alphabet == "all" else int(alphabet)
            n = int(distance)
        except ValueError:
            raise ValueError(f"--stages: {item!r} is not alphabet:max_distance (e.g. 64:64 or all:512)") from None
        if not 2 <= a <= vocab_size - FIRST_ID or n < min_distance:
            raise ValueError(
                f"--stages: {item!r} needs 2 <= alphabet <= {vocab_size - FIRST_ID} and distance >= {min_distance}"
            )
        stages.append((a, n))
    return stages


def repeated_random_tokens(alphabet, min_distance, max_distance, batch_tokens, generator):
    """A batch ``[r, r]`` of about ``batch_tokens`` tokens, r of n random ids of the alphabet, and n."""
    n = int(torch.randint(min_distance, max_distance + 1, (1,), generator=generator))
    r = torch.randint(FIRST_ID, FIRST_ID + alphabet, (max(1, batch_tokens // (2 * n)), n), generator=generator)
    return torch.cat([r, r], dim=1), n  # (batch, 2n): the second half copies the first


def train_curriculum(args, log=print) -> tuple[torch.nn.Module, list[dict]]:
    """The trained model and one record per stage entered: alphabet, distance, first and last step, seconds."""
    config = AutoConfig.from_pretrained(args.like)
    stages = parse_stages(args.stages, config.vocab_size, args.min_distance)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.1, betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(1)
    stage, hits, start = 0, [], time.perf_counter()
    records = [{"alphabet": stages[0][0], "max distance": stages[0][1], "from step": 1}]
    for step in range(1, args.steps + 1):
        alphabet, max_distance = stages[stage]
        x, n = repeated_random_tokens(alphabet, args.min_distance, max_distance, args.batch_tokens, generator)
        repeat_loss, top1 = copy_step(model, optimizer, x, n, max_grad_norm=1.0)
        hits.append(top1)
        records[-1].update({"to step": step, "repeat top-1": hits[-1], "seconds": time.perf_counter() - start})
        if step % 25 == 0:
            log(f"step {step} alphabet {alphabet} n {n} repeat loss {repeat_loss:.3f} top-1 {hits[-1]:.3f}")
        learned = len(hits) >= args.patience and sum(hits[-args.patience :]) / args.patience >= args.threshold
        if learned and stage < len(stages) - 1:
            stage, hits = stage + 1, []
            records.append({"alphabet": stages[stage][0], "max distance": stages[stage][1], "from step": step + 1})
            log(f"stage {stage} from step {step + 1}")
        if step % 250 == 0:
            model.save_pretrained(args.output_dir)
    model.save_pretrained(args.output_dir)
    return model, records


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    _, records = train_curriculum(args, log=lambda line: print(line, flush=True))
    rows = [
        [r["alphabet"], r["max distance"], r["from step"], r["to step"], r["to step"] - r["from step"] + 1,
         f"{r['repeat top-1']:.3f}", f"{r['seconds']:.0f}"]
        for r in records
    ]  # fmt: skip
    headers = ["alphabet a", "max distance", "from step", "to step", "steps", "repeat top-1 at its last step", "s"]
    text = (
        f"Architecture of `{args.like}` (fresh weights); sequences [r, r] of n random tokens of the first a ids "
        f"after the specials, n uniform in [{args.min_distance}, max distance]; {args.batch_tokens} tokens per "
        f"step, AdamW {args.learning_rate} (β2 0.95, weight decay 0.1, clipping 1.0); a stage ends when the "
        f"repeat's top-1 averages ≥ {args.threshold} over {args.patience} steps; {args.steps} steps; saved to "
        f"`{args.output_dir}`."
    )
    title = "Copying curriculum: repeated random tokens, growing alphabet"
    print_and_write(args, title, text, markdown_table(headers, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
