#!/usr/bin/env python
"""Generate text with any saved ssmhub model (or a transformers Mamba folder, run as SeRpEnt), streamed token
by token with ``TextStreamer``. A recurrent model decodes each new token in O(1) time and memory: its cache
is a fixed-size state, however long the prompt.

    python examples/generation/run_generation.py --model_name_or_path runs/clm --prompt "The" \\
        --do_sample --temperature 0.8 --top_p 0.95 --max_new_tokens 40

Faster greedy decoding with the same tokens: ``--prompt_lookup_num_tokens 10`` (candidates copied from the prompt,
for prompts the continuation quotes: a ``--prompt_file`` holding a document to continue or rewrite), or
``--assistant_model FOLDER`` (a small ssmhub draft with the same tokenizer). ssmhub's cache rolls back exactly, so
both work for every family (``benchmarks/results/speculative.md``).
"""

from __future__ import annotations

import argparse
import sys

import torch
from transformers import AutoModelForCausalLM, TextStreamer, set_seed

from ssmhub.script_arguments import ModelArguments, build_model, load_script_tokenizer


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags; sampling values out of range are refused by name before the model loads."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_name_or_path", required=True, help="Saved model folder or Hub id.")
    parser.add_argument("--tokenizer_name", default=None, help="Tokenizer folder; default the model's.")
    parser.add_argument("--prompt", default="The", help="Text to continue.")
    parser.add_argument("--prompt_file", default=None, help="Read the text to continue from this file instead.")
    parser.add_argument("--max_new_tokens", type=int, default=20)
    parser.add_argument("--do_sample", action="store_true", help="Sample (else greedy decoding).")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top_k", type=int, default=50)
    parser.add_argument("--top_p", type=float, default=1.0)
    parser.add_argument("--repetition_penalty", type=float, default=1.0)
    parser.add_argument("--num_return_sequences", type=int, default=1, help="More than 1: printed at the end.")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--prompt_lookup_num_tokens", type=int, default=None, help="Prompt-lookup decoding.")
    parser.add_argument("--assistant_model", default=None, help="A draft model folder: assisted decoding.")
    args = parser.parse_args(argv)
    if args.prompt_lookup_num_tokens is not None and args.assistant_model:
        parser.error("--prompt_lookup_num_tokens and --assistant_model exclude each other: pass one")
    checks = {
        "--max_new_tokens": args.max_new_tokens >= 1,
        "--temperature": args.temperature > 0,
        "--top_k": args.top_k >= 0,
        "--top_p": 0 < args.top_p <= 1,
        "--repetition_penalty": args.repetition_penalty > 0,
        "--num_return_sequences": args.num_return_sequences >= 1,
        "--prompt_lookup_num_tokens": args.prompt_lookup_num_tokens is None or args.prompt_lookup_num_tokens >= 1,
    }
    for flag, ok in checks.items():
        if not ok:
            parser.error(f"{flag} is out of range: {getattr(args, flag[2:])}")
    return args


def main(argv: list[str] | None = None) -> list[str]:
    """Generate (streaming a single sequence to stdout); returns the generated continuations."""
    args = parse_args(argv)
    set_seed(args.seed)
    model_args = ModelArguments(model_name_or_path=args.model_name_or_path, tokenizer_name=args.tokenizer_name)
    tokenizer = load_script_tokenizer(model_args)
    model = build_model(model_args, AutoModelForCausalLM).eval()
    prompt = open(args.prompt_file, encoding="utf-8").read() if args.prompt_file else args.prompt
    inputs = tokenizer(prompt, return_tensors="pt")
    speculative = {}
    if args.prompt_lookup_num_tokens is not None:
        speculative["prompt_lookup_num_tokens"] = args.prompt_lookup_num_tokens
    if args.assistant_model:
        draft = ModelArguments(model_name_or_path=args.assistant_model)
        speculative["assistant_model"] = build_model(draft, AutoModelForCausalLM).eval()
    stream = args.num_return_sequences == 1
    with torch.inference_mode():
        output = model.generate(
            **inputs,
            max_new_tokens=args.max_new_tokens,
            do_sample=args.do_sample,
            temperature=args.temperature if args.do_sample else None,
            top_k=args.top_k if args.do_sample else None,
            top_p=args.top_p if args.do_sample else None,
            repetition_penalty=args.repetition_penalty,
            num_return_sequences=args.num_return_sequences,
            pad_token_id=tokenizer.pad_token_id,
            streamer=TextStreamer(tokenizer, skip_prompt=True) if stream else None,
            **speculative,
        )
    texts = tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    if not stream:
        for index, text in enumerate(texts):
            print(f"=== sequence {index + 1} ===\n{prompt}{text}")
    return texts


if __name__ == "__main__":
    main(sys.argv[1:])
