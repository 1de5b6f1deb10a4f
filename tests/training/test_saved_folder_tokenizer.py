"""A folder written by ssmhub-train works with transformers' causal-LM tooling as a user expects: its
tokenizer pads on the left with a pad token distinct from EOS, and the model's config agrees with it.

With pad = eos (what ssmhub saved before), ``DataCollatorForLanguageModeling(tokenizer, mlm=False)``
turns the label of every real end-of-text token into -100, so a model fine-tuned with Trainer never
learns to stop; right padding breaks batched generation.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from devices import device_type
from training_helpers import tiny_args
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainingArguments,
)

from ssmhub.tokenization import PAD_TOKEN, ensure_pad_token, load_tokenizer, train_bpe_tokenizer
from ssmhub.training.cli import main

TEXTS = [" the history of the river", " a king", " the battle of the city was in the song of the war"]


@pytest.fixture(scope="module")
def trained_folder(tiny_data_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run")
    main(tiny_args(tiny_data_dir, out, max_steps=4, save_steps=0, eval_steps=0))
    return out


def test_folder_tokenizer_pads_left_with_a_pad_token_distinct_from_eos(trained_folder):
    tokenizer = AutoTokenizer.from_pretrained(trained_folder)
    model = AutoModelForCausalLM.from_pretrained(trained_folder)
    assert tokenizer.padding_side == "left" and tokenizer.pad_token == PAD_TOKEN
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert model.config.pad_token_id == model.generation_config.pad_token_id == tokenizer.pad_token_id
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert tokenizer.pad_token_id < model.config.vocab_size == len(tokenizer)


def test_lm_collator_and_trainer_keep_the_labels_of_real_eos_tokens(trained_folder, tmp_path):
    """Documents ending in EOS, collated for causal LM fine-tuning: padding is ignored, every EOS keeps its label,
    and Trainer fine-tunes the folder's model on such batches."""
    tokenizer = AutoTokenizer.from_pretrained(trained_folder)
    model = AutoModelForCausalLM.from_pretrained(trained_folder)
    features = [tokenizer(text + tokenizer.eos_token) for text in TEXTS]
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    batch = collator(features)
    real = batch["attention_mask"].bool()
    assert not real.all()  # the rows have different lengths: there is padding
    assert (batch["labels"][~real] == -100).all()
    assert torch.equal(batch["labels"][real], batch["input_ids"][real])  # EOS included
    assert int((batch["labels"] == tokenizer.eos_token_id).sum()) == len(TEXTS)

    seen = []
    model.register_forward_pre_hook(lambda _m, _a, kwargs: seen.append(kwargs["labels"].clone()), with_kwargs=True)
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=3, learning_rate=1e-2,
        report_to=[], save_strategy="no", disable_tqdm=True,
        use_cpu=device_type() == "cpu", dataloader_pin_memory=False,  # the model's device; batches are built there
    )  # fmt: skip
    Trainer(model=model, args=args, train_dataset=features * 2, data_collator=collator).train()
    assert seen and all(int((labels == tokenizer.eos_token_id).sum()) == len(TEXTS) for labels in seen)


def test_left_padded_batch_generates_what_each_prompt_gets_alone(trained_folder):
    tokenizer = AutoTokenizer.from_pretrained(trained_folder)
    model = AutoModelForCausalLM.from_pretrained(trained_folder).eval()
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
    assert (batch["attention_mask"][:, -1] == 1).all()  # left padding: every row ends with a real token
    batched = model.generate(**batch, max_new_tokens=8, do_sample=False)
    width = batch["input_ids"].shape[1]
    for row, text in enumerate(TEXTS):
        prompt = tokenizer(text, return_tensors="pt")
        alone = model.generate(**prompt, max_new_tokens=8, do_sample=False)[0, prompt["input_ids"].shape[1] :]
        new = batched[row, width:]
        new = new[new != tokenizer.pad_token_id]  # a row that stopped at EOS is padded after it
        assert new.tolist() == alone.tolist(), text  # greedy tokens: exact


def test_folder_saved_with_pad_equal_to_eos_still_loads_consistently(tmp_path):
    """Folders saved before the distinct pad token (pad = eos = 0, right padding) load as they were, and
    a new run given such a tokenizer gets a pad token of its own at the next id."""
    import ssmhub

    old = train_bpe_tokenizer(TEXTS * 5, vocab_size=270, padding_side="right", pad_token=None)
    old.save_pretrained(tmp_path)
    special = {"pad_token_id": 0, "eos_token_id": 0, "bos_token_id": 0}
    config = ssmhub.DLRConfig(vocab_size=len(old), hidden_size=8, num_hidden_layers=1, state_size=4, **special)
    ssmhub.DLRForCausalLM(config).save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == model.config.pad_token_id == 0
    assert tokenizer.padding_side == "right"

    given = load_tokenizer(tmp_path)
    assert ensure_pad_token(given) and given.pad_token == PAD_TOKEN
    assert given.pad_token_id == len(old) and len(given) == len(old) + 1 and given.padding_side == "left"


def test_forced_vocab_size_without_room_keeps_the_tokenizer():
    tokenizer = train_bpe_tokenizer(TEXTS * 5, vocab_size=270, pad_token=None)
    size = len(tokenizer)
    assert not ensure_pad_token(tokenizer, max_vocab_size=size)
    assert tokenizer.pad_token_id == tokenizer.eos_token_id and len(tokenizer) == size
    assert ensure_pad_token(tokenizer, max_vocab_size=size + 8) and tokenizer.pad_token_id == size


def test_gpt2_tokenizer_gets_a_pad_token_after_its_vocabulary():
    root = os.environ.get("SSMHUB_DATA_DIR")
    if not root or not (Path(root) / "tokenizers" / "gpt2").is_dir():
        pytest.skip("$SSMHUB_DATA_DIR has no tokenizers/gpt2 folder")
    tokenizer = load_tokenizer(Path(root) / "tokenizers" / "gpt2")
    assert ensure_pad_token(tokenizer)
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, len(tokenizer)) == (50257, 50256, 50258)
