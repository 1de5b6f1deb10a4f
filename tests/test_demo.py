"""The demo end to end (train, save, evaluate, reload, generate): on a tiny synthetic WikiText-2 in every run,
and on the real WikiText-2 in `make test-all`."""

import ast
import json
import math
import os
from pathlib import Path

import pytest
import torch
from comparisons import MODEL_REL
from safetensors.torch import load_file
from training.training_helpers import write_tiny_wikitext  # tests/training: the tiny corpus of the training tests
from transformers import AutoModelForCausalLM, AutoTokenizer

from ssmhub.data import load_wikitext, wikitext_articles
from ssmhub.demo import PROMPTS, main
from ssmhub.training.trainer import MetricsLogger

TINY_MODEL = ["--hidden-size", "16", "--num-layers", "1", "--state-size", "4", "--intermediate-size", "0"]
SHORT_RUN = ["--max-steps", "6", "--seq-len", "16", "--batch-size", "4", "--vocab-size", "300", "--eval-windows", "8"]
MAX_NEW_TOKENS = 5


def whole_article_scores(model, tokenizer, articles: list[str], max_length: int) -> tuple[float, int, int]:
    """(sum of next-token NLLs in float64, tokens scored, top-1 hits) over articles scored in one forward pass
    each, every token after the first predicted from its whole article: what the sliding-window evaluation
    must give when no article is longer than a window."""
    total, count, top1 = 0.0, 0, 0
    with torch.no_grad():
        for text in articles:
            ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
            assert ids.shape[1] <= max_length  # a single window holds the article
            log_probs = model(ids).logits[0, :-1].double().log_softmax(-1)
            targets = ids[0, 1:]
            total -= log_probs.gather(1, targets[:, None]).sum().item()
            count += len(targets)
            top1 += (log_probs.argmax(-1) == targets).sum().item()
    return total, count, top1


def greedy_by_loop(model, tokenizer, prompt: str, max_new_tokens: int) -> str:
    """Greedy continuation of one prompt, a full forward pass per new token (no cache, no padding)."""
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        for _ in range(max_new_tokens):
            next_id = model(ids).logits[0, -1].argmax()
            ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
            if next_id.item() == tokenizer.eos_token_id:
                break
    return tokenizer.decode(ids[0], skip_special_tokens=True)


def printed_texts(printed: str, title: str, num_texts: int) -> list[str]:
    """The ``num_texts`` texts the demo printed (one ``repr`` a line) under its ``--- {title}`` heading."""
    (after,) = [block for block in printed.split("\n--- ")[1:] if block.startswith(title)]
    return [ast.literal_eval(line) for line in after.splitlines()[1 : 1 + num_texts]]


def test_demo_on_a_tiny_corpus_saves_evaluates_reloads_and_generates(tmp_path, capsys):
    """The demo with a tiny model on a tiny WikiText-2 in the official layout, in seconds: its folder holds the
    trained model, the run's tokenizer and a card; its evaluation JSON holds the saved model's scores on the
    validation split (checked against whole-article scores computed here); the texts it prints are the
    reloaded model's (greedy ones checked against a loop of full forward passes)."""
    data = write_tiny_wikitext(tmp_path / "data")
    out, max_length = tmp_path / "demo", 512
    main(["--data-dir", str(data), "--output-dir", str(out), *TINY_MODEL, *SHORT_RUN,
          "--eval-max-length", str(max_length), "--max-new-tokens", str(MAX_NEW_TOKENS)])  # fmt: skip
    printed = capsys.readouterr().out

    # Saved: the trained model (the weights of the last checkpoint, step 6), the run's tokenizer, the card.
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert type(model).__name__ == "DLRForCausalLM" and model.config.hidden_size == 16
    assert model.config.vocab_size == len(tokenizer) == 300
    trained_tokenizer = AutoTokenizer.from_pretrained(out / "checkpoints" / "tokenizer")
    assert tokenizer.get_vocab() == trained_tokenizer.get_vocab()
    saved = load_file(out / "model.safetensors")
    last_checkpoint = load_file(out / "checkpoints" / "step-6" / "model.safetensors")
    # the folder's weights are a copy of the last checkpoint's (the same tensors, saved twice): exact
    assert saved and all(torch.equal(tensor, last_checkpoint[name]) for name, tensor in saved.items())
    final_eval_loss = [r["loss"] for r in MetricsLogger.read(out) if r["split"] == "validation"][-1]
    assert f"final validation loss {final_eval_loss:.4f}" in printed
    card = (out / "README.md").read_text()
    assert "**6** optimizer steps" in card and f"| validation loss | {final_eval_loss:.4f} |" in card

    # Evaluated: the saved model on the validation split, against whole-article scores computed here.
    results = json.loads((out / "eval_wikitext-2_validation.json").read_text())["results"]
    articles = wikitext_articles(load_wikitext("wikitext-2", "validation", data))
    total, count, top1 = whole_article_scores(model, tokenizer, articles, max_length)
    assert (results["num_documents"], results["num_tokens"]) == (len(articles), count)
    # ssmhub-eval's windows (on its default device, a GPU where there is one) and the whole articles here: the model
    # computed two ways, each NLL to twice its logits' round-off (MODEL_REL of the largest logit, below log V)
    assert results["total_nll"] == pytest.approx(total, rel=MODEL_REL)
    assert abs(results["num_top1"] - top1) <= 2  # of ~1400: a near-tie may go either way in float32
    lines = (data / "wikitext-2" / "wiki.valid.tokens").read_text().splitlines()
    num_words = sum(len(line.split()) for line in lines) + len(lines)  # WikiText: one <eos> per line
    assert results["num_words"] == num_words
    assert math.log(results["word_perplexity"]) * num_words == pytest.approx(total, rel=MODEL_REL)

    # Reloaded and generated: the printed greedy continuations are the saved model's, padding changing nothing
    # (greedy tokens: compared exactly).
    assert f"reloaded DLRForCausalLM ({model.num_parameters() / 1e6:.2f}M parameters) from {out}" in printed
    greedy = [greedy_by_loop(model, tokenizer, prompt, MAX_NEW_TOKENS) for prompt in PROMPTS]
    assert printed_texts(printed, "greedy", len(PROMPTS)) == greedy
    sampled = printed_texts(printed, "sampled", len(PROMPTS))
    assert all(text.startswith(prompt) and text != prompt for text, prompt in zip(sampled, PROMPTS))
    assert "greedy continuations in the padded batch equal those generated one prompt at a time" in printed


@pytest.mark.slow
def test_demo_end_to_end_tiny(tmp_path, capsys):
    root = os.environ.get("SSMHUB_DATA_DIR")
    if not root or not (Path(root) / "wikitext-2").is_dir():
        pytest.skip("$SSMHUB_DATA_DIR with wikitext-2/ is needed (the demo would otherwise download from the Hub)")
    out = tmp_path / "demo"
    tiny_model = ["--hidden-size", "32", "--num-layers", "1", "--state-size", "8", "--intermediate-size", "0"]
    short_run = ["--max-steps", "6", "--seq-len", "32", "--batch-size", "4", "--vocab-size", "512"]
    main(["--output-dir", str(out), *tiny_model, *short_run, "--eval-windows", "8", "--eval-max-length", "64",
          "--max-new-tokens", "5"])  # fmt: skip
    printed = capsys.readouterr().out
    assert "word ppl" in printed and "reloaded DLRForCausalLM" in printed
    assert "greedy continuations in the padded batch equal those generated one prompt at a time" in printed
    for name in ("config.json", "tokenizer.json", "README.md", "model.safetensors", "eval_wikitext-2_validation.json"):
        assert (out / name).is_file(), name
