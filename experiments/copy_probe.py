"""Does a trained model copy? Its loss and top-1 accuracy on a repeated passage of held-out text (issue 27 §2).

Prompt lookup pays only when a model continues a passage it has seen by copying it, so this measures that skill
before a speculative-decoding run. Rows of ``--window`` tokens of the first PG-19 test book (unseen in training)
each end by repeating a passage of their own, as ``ssmhub-train --repeat_passage_probability 1`` makes its
windows (:func:`ssmhub.training.batches.repeat_passages`, the last quarter repeats a quarter drawn from the
rest): the passage as written ("text") and, as ``--shuffle_repeated_passages`` makes them, with its tokens
shuffled in both places ("shuffled"). Reported per model and layout: the mean loss (nats) on the first three
quarters, on the repeat (its first token excepted: it cannot be known) and the repeat's top-1 accuracy. A model
that copies has a repeat loss near 0 and top-1 near 1; one that does not has the repeat's loss of fresh text.

    python experiments/copy_probe.py --model runs/speculative/h3-hybrid-copy2 runs/x/checkpoints/step-500
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ssmhub.data import iter_pg19_books
from ssmhub.metrics import token_nll
from ssmhub.tokenization import encode_document
from ssmhub.training.batches import repeat_passages

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _experiments  # noqa: F401  (benchmarks/'s helpers, results into experiments/results/)
from _report import markdown_table, write_report


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--model", nargs="+", required=True, help="saved model folders or training checkpoints")
    p.add_argument("--window", type=int, default=512, help="tokens per row")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--data-dir", default=os.environ.get("SSMHUB_DATA_DIR"), help="default $SSMHUB_DATA_DIR")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--name", default="copy_probe", help="results/<name>.md")
    p.add_argument("--no-write", action="store_true")
    return p.parse_args(argv)


def load(folder: str):
    """(model in eval mode, tokenizer) of a saved folder, or of a training checkpoint (its run's tokenizer)."""
    path = Path(folder)
    if (path / "complete.json").exists():  # a training checkpoint: ssmhub-train keeps the tokenizer beside it
        from ssmhub.training.checkpoint_model import load_checkpoint_model

        tokenizer = AutoTokenizer.from_pretrained(path.parent / "tokenizer")
        return load_checkpoint_model(path, tokenizer), tokenizer
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def probe(model, ids: torch.Tensor, shuffle: bool) -> dict[str, float]:
    """ids (rows, L) of fresh text -> losses and repeat accuracy once each row ends with a repeated passage."""
    length = ids.shape[1]
    x = repeat_passages(ids, 1.0, torch.Generator().manual_seed(0), shuffle=shuffle)
    with torch.no_grad():
        logits = model(x).logits[:, :-1]  # (rows, L - 1): position t predicts token t + 1
    nll = token_nll(logits, x[:, 1:])  # (rows, L - 1)
    hits = (logits.argmax(-1) == x[:, 1:]).float()
    start = length - length // 4  # the repeat's first token; its later ones are predictable by copying
    return {
        "loss, first 3/4": nll[:, : start - 1].mean().item(),
        "loss, repeat": nll[:, start:].mean().item(),
        "top-1, repeat": hits[:, start:].mean().item(),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.window < 8 or args.rows < 1:
        raise ValueError(f"--window must be ≥ 8 and --rows ≥ 1; got {args.window} and {args.rows}")
    book = next(iter(iter_pg19_books("test", data_dir=args.data_dir, max_books=1)))
    table_rows = []
    for folder in args.model:
        model, tokenizer = load(folder)
        tokens = encode_document(tokenizer, book.text)[: args.rows * args.window]
        if len(tokens) < args.rows * args.window:
            raise ValueError(f"book {book.book_id} has {len(tokens)} tokens, fewer than --rows × --window")
        ids = torch.tensor(tokens).view(args.rows, args.window)
        for layout, shuffle in (("text", False), ("shuffled", True)):
            result = probe(model, ids, shuffle)
            table_rows.append([folder, layout, *(f"{v:.2f}" for v in result.values())])
    headers = ["model", "passage", "loss, first 3/4", "loss, repeat", "top-1, repeat"]
    table = markdown_table(headers, table_rows)
    print(table)
    if not args.no_write:
        text = (
            f"{args.rows} rows of {args.window} tokens of PG-19 test book {book.book_id}, each ending by repeating "
            "a passage of its own (the last quarter; `repeat_passages`, generator seed 0); losses in nats."
        )
        print(f"wrote {write_report(args.name, 'Copying: loss on a repeated passage of held-out text', [text, table])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
