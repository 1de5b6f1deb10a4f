"""End-to-end demo: train a small DLR language model on WikiText-2 on the CPU, save, reload, generate.

Run ``python -m ssmhub.demo`` (or ``ssmhub-demo``); with the defaults it takes about 3.5 minutes on
two CPU cores. Steps:

1. load WikiText-2 (from ``--data-dir`` / ``$SSMHUB_DATA_DIR``, else from the Hugging Face Hub);
2. train a byte-level BPE tokenizer (``--vocab-size``) on the train split;
3. pack the articles, joined by ``<|endoftext|>``, into windows of ``--seq-len`` tokens;
4. train a :class:`~ssmhub.DLRForCausalLM` with AdamW, warmup + cosine, until ``--max-minutes``
   or ``--max-steps``;
5. report token-level validation perplexity (under the demo's own tokenizer);
6. ``save_pretrained`` model and tokenizer into ``--output-dir``, reload both with the Auto classes,
   check the reloaded model's loss, and generate from a left-padded batch of prompts.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from . import DLRConfig, DLRForCausalLM
from .data import DATA_DIR_ENV, load_wikitext, pack_token_windows, resolve_data_dir, wikitext_articles
from .tokenization import train_bpe_tokenizer

PROMPTS = [" The history of", " In 1998 ,"]  # WikiText lines start with a space


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m ssmhub.demo",
        description="Train a small DLR language model on WikiText-2 on the CPU, save it, reload it and generate.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--data-dir",
        default=os.environ.get(DATA_DIR_ENV) or None,
        help=f"folder holding wikitext-2/wiki.*.tokens (default ${DATA_DIR_ENV}; if unset, the Hugging Face Hub)",
    )
    parser.add_argument("--output-dir", default="runs/demo", help="where model and tokenizer are saved")
    parser.add_argument("--max-minutes", type=float, default=3.0, help="training time budget")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (also)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--vocab-size", type=int, default=4096, help="size of the BPE trained on the train split")
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--state-size", type=int, default=64)
    parser.add_argument("--intermediate-size", type=int, default=512)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--warmup-steps", type=int, default=50)
    parser.add_argument("--eval-windows", type=int, default=512, help="validation windows evaluated (0: all)")
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.max_minutes <= 0 and args.max_steps is None:
        parser.error("give a positive --max-minutes or a --max-steps")
    return args


def tokenize_windows(tokenizer, articles: list[str], seq_len: int) -> torch.LongTensor:
    """Tokenize articles and pack them, joined by eos, into (num_windows, seq_len) windows."""
    ids = tokenizer(articles, add_special_tokens=False)["input_ids"]
    return pack_token_windows(ids, seq_len, eos_token_id=tokenizer.eos_token_id)


@torch.no_grad()
def mean_loss(model, windows: torch.LongTensor, batch_size: int) -> float:
    """Mean next-token loss over windows (each window predicts its tokens 2..seq_len from its own prefix)."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(windows), batch_size):
        batch = windows[start : start + batch_size]
        loss = model(batch, labels=batch, use_cache=False).loss
        n = batch.numel() - batch.shape[0]  # predicted tokens: all but each window's first
        total, count = total + loss.item() * n, count + n
    return total / count


def lr_factor(step: int, progress: float, warmup_steps: int, min_ratio: float = 0.1) -> float:
    """Linear warmup over ``warmup_steps``, then cosine decay to ``min_ratio`` as ``progress`` goes 0 -> 1."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train(model, windows: torch.LongTensor, args: argparse.Namespace) -> int:
    """Train until the step or time budget is spent; returns the number of steps taken.

    The cosine schedule follows ``progress = max(step / max_steps, elapsed / time budget)``, so the
    learning rate decays over whichever budget ends first.
    """
    optimizer = torch.optim.AdamW(model.optimizer_param_groups(weight_decay=args.weight_decay, lr=args.lr))
    base_lrs = [group["lr"] for group in optimizer.param_groups]
    budget_s = args.max_minutes * 60 if args.max_minutes > 0 else math.inf
    max_steps = args.max_steps if args.max_steps is not None else math.inf
    warmup_steps = min(args.warmup_steps, max(1, int(max_steps) // 10)) if max_steps < math.inf else args.warmup_steps
    generator = torch.Generator().manual_seed(args.seed)
    order, cursor = torch.randperm(len(windows), generator=generator), 0

    model.train()
    start, step, running = time.perf_counter(), 0, []
    while True:
        elapsed = time.perf_counter() - start
        progress = max(step / max_steps, elapsed / budget_s)
        if progress >= 1:
            break
        for group, base_lr in zip(optimizer.param_groups, base_lrs):
            group["lr"] = base_lr * lr_factor(step, progress, warmup_steps)
        if cursor + args.batch_size > len(windows):  # next epoch
            order, cursor = torch.randperm(len(windows), generator=generator), 0
        batch = windows[order[cursor : cursor + args.batch_size]]
        cursor += args.batch_size

        loss = model(batch, labels=batch, use_cache=False).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        running.append(loss.item())
        if step % args.log_every == 0 or step == 1:
            avg = sum(running) / len(running)
            print(
                f"step {step:5d} | loss {avg:.3f} | lr {optimizer.param_groups[0]['lr']:.2e} "
                f"| {time.perf_counter() - start:6.1f} s",
                flush=True,
            )
            running = []
    return step


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()

    # 1. data
    data_dir = resolve_data_dir(args.data_dir)
    source = f"local folder {data_dir}" if data_dir is not None else "the Hugging Face Hub"
    print(f"loading WikiText-2 from {source}", flush=True)
    train_articles = wikitext_articles(load_wikitext("wikitext-2", "train", data_dir))
    valid_articles = wikitext_articles(load_wikitext("wikitext-2", "validation", data_dir))

    # 2. tokenizer (all of the train split: about 2 s on 2 cores at vocab 4096)
    t = time.perf_counter()
    tokenizer = train_bpe_tokenizer(train_articles, vocab_size=args.vocab_size)
    print(f"trained a byte-level BPE with {len(tokenizer)} tokens in {time.perf_counter() - t:.1f} s")

    # 3. windows
    train_windows = tokenize_windows(tokenizer, train_articles, args.seq_len)
    valid_windows = tokenize_windows(tokenizer, valid_articles, args.seq_len)
    num_valid = len(valid_windows)
    if 0 < args.eval_windows < num_valid:
        valid_windows = valid_windows[: args.eval_windows]
    print(
        f"train: {len(train_articles)} articles -> {train_windows.numel():,} tokens in {len(train_windows):,} "
        f"windows of {args.seq_len}; validation: {len(valid_windows)} of {num_valid} windows evaluated"
    )

    # 4. model and training
    eos = tokenizer.eos_token_id
    config = DLRConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden_size,
        num_hidden_layers=args.num_layers,
        state_size=args.state_size,
        intermediate_size=args.intermediate_size,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    model = DLRForCausalLM(config)
    num_params = sum(p.numel() for p in model.parameters())
    budget = [f"{args.max_minutes:g} min"] if args.max_minutes > 0 else []
    budget += [f"{args.max_steps} steps"] if args.max_steps is not None else []
    print(f"DLR LM: {num_params / 1e6:.2f}M parameters; training for {' or '.join(budget)}", flush=True)
    t = time.perf_counter()
    steps = train(model, train_windows, args)
    train_s = time.perf_counter() - t
    tokens_seen = steps * args.batch_size * args.seq_len
    print(f"trained {steps} steps ({tokens_seen:,} tokens) in {train_s:.1f} s ({tokens_seen / train_s:,.0f} tok/s)")

    # 5. validation perplexity
    t = time.perf_counter()
    valid_loss = mean_loss(model, valid_windows, args.batch_size)
    print(
        f"validation: loss {valid_loss:.4f}, perplexity {math.exp(valid_loss):.2f} "
        f"(token-level, under the demo's own {len(tokenizer)}-token BPE, not comparable to word-level WikiText "
        f"results; the first {len(valid_windows)} non-overlapping {args.seq_len}-token windows of the "
        f"validation split, {valid_windows.numel() - len(valid_windows):,} predicted tokens; "
        f"{time.perf_counter() - t:.1f} s)"
    )

    # 6. save, reload with the Auto classes, check, generate
    model.save_pretrained(args.output_dir)
    tokenizer.save_pretrained(args.output_dir)
    print(f"saved model and tokenizer to {args.output_dir}")
    check_batch = valid_windows[: args.batch_size]
    reload_and_generate(args, check_batch, mean_loss(model, check_batch, len(check_batch)))
    print(f"done in {time.perf_counter() - t0:.1f} s")


def reload_and_generate(args: argparse.Namespace, check_batch: torch.LongTensor, expected_loss: float) -> None:
    """Reload the saved folder as a user would, check it, and print sampled and greedy generations."""
    # As a user would: ``import ssmhub`` (done by this package) registers DLR with the Auto classes.
    model = AutoModelForCausalLM.from_pretrained(args.output_dir)
    tok = AutoTokenizer.from_pretrained(args.output_dir)
    reloaded_loss = mean_loss(model, check_batch, len(check_batch))
    if not math.isclose(reloaded_loss, expected_loss, rel_tol=1e-5, abs_tol=1e-5):
        raise SystemExit(f"reload check FAILED: loss {reloaded_loss:.6f} after reloading vs {expected_loss:.6f}")
    print(
        f"reload check: {type(model).__name__} from {args.output_dir} gives loss {reloaded_loss:.6f} on one "
        f"validation batch, as before saving ({expected_loss:.6f})"
    )

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
