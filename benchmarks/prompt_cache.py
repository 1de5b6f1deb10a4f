"""Prefill a long document once, ask many continuations: the prefill time a saved prompt cache saves.

What is measured (issue 27 §3)
------------------------------
A causal LM (``--model``, a folder; by default the PG-19 DLR of ``benchmarks/pg19_context.py``) and the first
``--document-tokens`` tokens of a PG-19 test book (16K by default). Median over ``--repeats``, float32, batch 1:

- ``prefill``: ``model(document, use_cache=True)``, the forward every continuation would pay again;
- ``save``: :meth:`ssmhub.RecurrentCache.save` of that cache (one safetensors file), and its size;
- ``load``: :meth:`ssmhub.RecurrentCache.load` into the same model;
- ``fork``: :meth:`ssmhub.RecurrentCache.fork`, an in-memory copy for one more continuation.

Each continuation is then checked: ``generate`` of ``--new-tokens`` greedy tokens from the loaded cache gives the
tokens of ``generate`` from the re-prefilled document.

Run: ``python benchmarks/prompt_cache.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import ssmhub
from ssmhub.data import iter_pg19_books
from ssmhub.tokenization import encode_document

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import markdown_table, median, write_report

SCRIPT_NAME = "prompt_cache"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--model", default="runs/pg19_context/dlr-windowed", help="a saved causal LM folder")
    p.add_argument("--data-dir", default=os.environ.get("SSMHUB_DATA_DIR"), help="default $SSMHUB_DATA_DIR")
    p.add_argument("--document-tokens", type=int, default=16384)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-write", action="store_true")
    return p.parse_args(argv)


def timed(fn, repeats: int) -> tuple[float, object]:
    """Median seconds of ``fn()`` over ``repeats`` calls, and its last result."""
    seconds, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        seconds.append(time.perf_counter() - start)
    return median(seconds), result


@torch.inference_mode()
def main(argv=None) -> None:
    args = parse_args(argv)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    book = next(iter(iter_pg19_books("test", data_dir=args.data_dir, max_books=1)))
    document = torch.tensor(encode_document(tokenizer, book.text)[: args.document_tokens])[None]  # (1, T)
    prefill, cache = timed(lambda: model(document, use_cache=True).cache, args.repeats)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "prompt.safetensors"
        save, _ = timed(lambda: cache.save(path, model), args.repeats)
        size = path.stat().st_size
        load, loaded = timed(lambda: ssmhub.RecurrentCache.load(path, model), args.repeats)
    fork, _ = timed(cache.fork, args.repeats)
    options = {"max_new_tokens": args.new_tokens, "do_sample": False}
    from_file = model.generate(document, cache=loaded, **options)
    from_scratch = model.generate(document, **options)
    same = torch.equal(from_file, from_scratch)
    rows = [
        ["prefill (what each continuation pays without a saved cache)", f"{prefill * 1e3:,.0f}"],
        [f"save ({size / 2**20:.2f} MiB file)", f"{save * 1e3:,.1f}"],
        ["load", f"{load * 1e3:,.1f}"],
        ["fork (in memory)", f"{fork * 1e3:,.2f}"],
    ]
    params = sum(p.numel() for p in model.parameters())
    sections = [
        f"Model `{args.model}` ({model.config.model_type}, {params / 1e6:.2f}M parameters); the first "
        f"{document.shape[1]:,} tokens of PG-19 test book {book.book_id}; median of {args.repeats}, float32, batch 1.",
        markdown_table(["step", "ms"], rows),
        f"- a continuation from the loaded cache saves {prefill / load:.0f}× the time of its prefill "
        f"({prefill:.2f} s → {load * 1e3:.1f} ms)",
        f"- generate from the loaded cache = generate after re-prefilling ({args.new_tokens} greedy tokens): "
        + ("[PASS] same tokens" if same else "[FAIL] different tokens"),
    ]
    print("\n\n".join(sections))
    if not args.no_write:
        write_report(SCRIPT_NAME, "Saved prompt caches: prefill once, continue many times", sections)


if __name__ == "__main__":
    main()
