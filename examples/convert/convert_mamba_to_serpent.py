#!/usr/bin/env python
"""Convert a transformers Mamba folder (``MambaForCausalLM``) into an ssmhub SeRpEnt folder, and check it.

SeRpEnt with only its base branch is Mamba (arXiv 2501.11729 §4.3), so the weights carry over unchanged
(:func:`ssmhub.convert_mamba_checkpoint`). The check reloads the saved folder as a user would
(``AutoModelForCausalLM.from_pretrained``) and compares its logits with Mamba's on seeded random tokens;
the script fails (exit 1) when they differ by more than ``--atol``. The tokenizer is copied when the Mamba
folder has one. Add resampling branches afterwards (``resampling_rates``) and fine-tune.

    python examples/convert/convert_mamba_to_serpent.py --mamba_path state-spaces/mamba-130m-hf \\
        --output_dir runs/serpent-130m
"""

from __future__ import annotations

import argparse
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, MambaForCausalLM

import ssmhub


def max_logit_difference(reference, candidate, vocab_size: int, length: int = 32, seed: int = 0) -> float:
    """Largest absolute logit difference of two causal LMs on 2 seeded random sequences of ``length``."""
    ids = torch.randint(0, vocab_size, (2, length), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return (reference(ids).logits.float() - candidate(ids).logits.float()).abs().max().item()


def copy_tokenizer(source: str, output_dir: str) -> bool:
    """Save the source folder's tokenizer beside the converted model; False when it has none."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError):
        return False
    tokenizer.save_pretrained(output_dir)
    return True


def main(argv: list[str] | None = None) -> float:
    """Convert, save, reload and check; returns the largest logit difference (exit 1 above ``--atol``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mamba_path", required=True, help="A transformers Mamba folder or Hub id.")
    parser.add_argument("--output_dir", required=True, help="Where the SeRpEnt folder is written.")
    parser.add_argument("--atol", type=float, default=1e-4, help="Largest logit difference accepted.")
    parser.add_argument("--check_length", type=int, default=32, help="Tokens per sequence of the check.")
    args = parser.parse_args(argv)
    mamba = MambaForCausalLM.from_pretrained(args.mamba_path).eval()
    ssmhub.convert_mamba_checkpoint(mamba, save_directory=args.output_dir)
    copied = copy_tokenizer(args.mamba_path, args.output_dir)
    serpent = AutoModelForCausalLM.from_pretrained(args.output_dir).eval()
    difference = max_logit_difference(mamba, serpent, mamba.config.vocab_size, args.check_length)
    print(f"saved {type(serpent).__name__} to {args.output_dir} (tokenizer {'copied' if copied else 'not found'}); "
          f"largest logit difference to Mamba: {difference:.3g} (--atol {args.atol:g})")  # fmt: skip
    if not difference <= args.atol:
        print(f"error: the converted model's logits differ from Mamba's by {difference:.3g} > --atol", file=sys.stderr)
        raise SystemExit(1)
    return difference


if __name__ == "__main__":
    main(sys.argv[1:])
