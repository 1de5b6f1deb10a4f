"""End-to-end demo: the training pipeline on small defaults, on the CPU, in a few minutes.

Run ``python -m ssmhub.demo`` (or ``ssmhub-demo``; ``make demo`` sets everything up first). Steps:

1. :func:`ssmhub.training.train` (what ``ssmhub-train`` runs): load WikiText-2 (``--data_dir`` /
   ``$SSMHUB_DATA_DIR``, else the Hugging Face Hub), train a byte-level BPE on the train split, train a
   small :class:`~ssmhub.DLRForCausalLM` with Accelerate (AdamW over the model's parameter groups, warmup
   + cosine), evaluate it, checkpoint it, and save model, tokenizer and model card in ``--output_dir``;
2. ``ssmhub-eval`` on the saved folder: sliding-window token- and word-level perplexity and top-1/top-5
   next-token accuracy on the whole WikiText-2 validation split;
3. reload the folder with ``AutoModelForCausalLM`` / ``AutoTokenizer`` and generate from a left-padded
   batch of prompts, checking that padding does not change what a prompt generates.
"""

import argparse
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .command_line import CommandLineParser
from .data import DATA_DIR_ENV
from .evaluation.cli import run_evaluation
from .training import TrainConfig, train

PROMPTS = [" The history of", " In 1998 ,"]  # WikiText lines start with a space


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The demo's options (``--flag_name``; ``--flag-name`` is accepted too)."""
    parser = CommandLineParser(
        prog="python -m ssmhub.demo",
        description="Train a small DLR language model on WikiText-2 on the CPU, evaluate, reload and generate.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--data_dir",
        default=os.environ.get(DATA_DIR_ENV) or None,
        help=f"folder holding wikitext-2/wiki.*.tokens (default ${DATA_DIR_ENV}; if unset, the Hugging Face Hub)",
    )
    parser.add_argument("--output_dir", default="runs/demo", help="where model, tokenizer and card are saved")
    parser.add_argument("--max_steps", type=int, default=600, help="training steps (about 3 minutes on 2 cores)")
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--vocab_size", type=int, default=4096, help="size of the BPE trained on the train split")
    parser.add_argument("--hidden_size", type=int, default=256)
    parser.add_argument("--num_layers", type=int, default=4)
    parser.add_argument("--state_size", type=int, default=64)
    parser.add_argument("--intermediate_size", type=int, default=512)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--weight_decay", type=float, default=0.1)
    parser.add_argument("--warmup_steps", type=int, default=50)
    parser.add_argument("--eval_windows", type=int, default=512, help="validation windows evaluated in training")
    parser.add_argument("--eval_max_length", type=int, default=256, help="sliding-window length of the evaluation")
    parser.add_argument("--max_new_tokens", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config = TrainConfig(
        output_dir=args.output_dir,
        overwrite_output_dir=True,
        dataset="wikitext-2",
        data_dir=args.data_dir,
        seq_len=args.seq_len,
        max_eval_windows=args.eval_windows,
        vocab_size=args.vocab_size,
        model_type="dlr",
        model_config={
            "hidden_size": args.hidden_size,
            "num_hidden_layers": args.num_layers,
            "state_size": args.state_size,
            "intermediate_size": args.intermediate_size,
        },
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        max_steps=args.max_steps,
        learning_rate=args.lr,
        weight_decay=args.weight_decay,
        warmup_steps=min(args.warmup_steps, max(1, args.max_steps // 10)),
        logging_steps=20,
        eval_steps=max(1, args.max_steps // 3),
        save_steps=max(1, args.max_steps // 3),
        save_total_limit=1,
        seed=args.seed,
        cpu=True,
    )
    print("== 1. train (ssmhub.training.train, as ssmhub-train runs it)", flush=True)
    result = train(config)
    print(f"trained {result.steps} steps, {result.tokens_seen:,} tokens; final validation loss {result.eval_loss:.4f}")

    print("\n== 2. evaluate the saved folder (ssmhub-eval)", flush=True)
    stride = args.eval_max_length // 2
    eval_argv = [args.output_dir, "--dataset", "wikitext-2", "--split", "validation",
                 "--max_length", str(args.eval_max_length), "--stride", str(stride), "--batch_size", "8",
                 "--output", os.path.join(args.output_dir, "eval_wikitext-2_validation.json")]  # fmt: skip
    if args.data_dir:
        eval_argv += ["--data_dir", args.data_dir]
    run_evaluation(eval_argv)  # prints its table and writes the JSON next to the model

    print("\n== 3. reload with AutoModelForCausalLM and generate", flush=True)
    reload_and_generate(args)


def reload_and_generate(args: argparse.Namespace) -> None:
    """Reload the saved folder as a user would and print sampled and greedy generations."""
    # As a user would: ``import ssmhub`` (done by this package) registers DLR with the Auto classes.
    model = AutoModelForCausalLM.from_pretrained(args.output_dir)
    tok = AutoTokenizer.from_pretrained(args.output_dir)
    print(f"reloaded {type(model).__name__} ({model.num_parameters() / 1e6:.2f}M parameters) from {args.output_dir}")
    tok.padding_side = "left"
    batch = tok(PROMPTS, return_tensors="pt", padding=True)
    gen = {"max_new_tokens": args.max_new_tokens, "pad_token_id": tok.pad_token_id}
    torch.manual_seed(args.seed)
    sampled = model.generate(**batch, do_sample=True, top_k=40, temperature=0.8, **gen)
    greedy = model.generate(**batch, do_sample=False, **gen)
    for title, out in (("sampled (top-k 40, temperature 0.8)", sampled), ("greedy", greedy)):
        print(f"--- {title}, left-padded batch of {len(PROMPTS)} prompts")
        for text in tok.batch_decode(out, skip_special_tokens=True):
            print(repr(text))

    check_left_padding(model, tok, [*PROMPTS, " The"], gen)


def check_left_padding(model, tok, prompts: list[str], gen: dict) -> None:
    """Greedy continuations of left-padded prompts must equal those of each prompt alone (padding must
    leave the recurrent state untouched). Prints the outcome; a mismatch is reported, not raised."""
    batch = tok(prompts, return_tensors="pt", padding=True)
    greedy = model.generate(**batch, do_sample=False, **gen)
    width = batch["input_ids"].shape[1]
    num_pads = (batch["attention_mask"] == 0).sum(dim=1).tolist()
    mismatches = []
    for i, prompt in enumerate(prompts):
        single = tok([prompt], return_tensors="pt")
        alone = model.generate(**single, do_sample=False, **gen)[0, single["input_ids"].shape[1] :]
        batched = greedy[i, width:]
        n = min(len(alone), len(batched))  # a sequence that hit eos early is padded in the batch
        if not torch.equal(alone[:n], batched[:n]):
            mismatches.append(prompt)
    what = f"left-padding check on {prompts} (pad tokens: {num_pads})"
    if mismatches:
        print(f"WARNING: {what}: greedy continuations of {mismatches} differ from those generated alone")
    else:
        print(f"{what}: greedy continuations in the padded batch equal those generated one prompt at a time")


if __name__ == "__main__":
    main()
