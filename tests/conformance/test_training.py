"""Fine-tuning with transformers.Trainer, exact gradient accumulation, and the optimizer groups."""

import copy

import pytest
import torch
from conftest import random_ids
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments


class ListDataset(Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def _args(tmp_path, **kwargs):
    defaults = {
        "output_dir": str(tmp_path),
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "use_cpu": True,
        "seed": 0,
        "dataloader_num_workers": 0,
    }
    return TrainingArguments(**{**defaults, **kwargs})


def test_trainer_fine_tunes_the_causal_lm(causal_lm, tmp_path):
    # a learnable pattern: a repeated random sequence
    ids = random_ids(1, 8).repeat(1, 4)[0]
    rows = [{"input_ids": ids, "labels": ids} for _ in range(16)]
    causal_lm.train()
    before = causal_lm(ids[None], labels=ids[None]).loss.item()
    trainer = Trainer(
        model=causal_lm,
        args=_args(
            tmp_path, max_steps=30, learning_rate=1e-2, lr_scheduler_type="constant", per_device_train_batch_size=4
        ),
        train_dataset=ListDataset(rows),
    )
    trainer.train()
    after = causal_lm(ids[None], labels=ids[None]).loss.item()
    assert after < 0.7 * before, (before, after)


def test_trainer_fine_tunes_the_classifier(classifier, tmp_path):
    gen = torch.Generator().manual_seed(0)
    rows = []
    for i in range(32):
        label = i % 3
        ids = torch.randint(1, 64, (10,), generator=gen)
        ids[2] = 60 + label  # the class is written in the sequence
        rows.append({"input_ids": ids, "labels": torch.tensor(label)})
    classifier.train()
    batch = {k: torch.stack([r[k] for r in rows]) for k in ("input_ids", "labels")}
    before = classifier(**batch).loss.item()
    trainer = Trainer(
        model=classifier,
        args=_args(
            tmp_path, max_steps=40, learning_rate=1e-2, lr_scheduler_type="constant", per_device_train_batch_size=8
        ),
        train_dataset=ListDataset(rows),
    )
    trainer.train()
    after = classifier(**batch).loss.item()
    assert after < 0.5 * before, (before, after)


def test_gradient_accumulation_is_exact(causal_lm, tmp_path):
    """One step over a batch of 4 equals 2 accumulated micro-batches of 2, although the micro-batches
    hold different numbers of labelled tokens (the loss is normalized by num_items_in_batch)."""
    rows = []
    for i in range(4):
        ids = random_ids(1, 12, seed=10 + i)[0]
        labels = ids.clone()
        labels[: 2 + 3 * i] = -100  # 10, 7, 4, 1 labelled positions
        rows.append({"input_ids": ids, "labels": labels})
    common = {
        "max_steps": 1,
        "learning_rate": 1.0,
        "optim": "sgd",
        "lr_scheduler_type": "constant",
        "max_grad_norm": 0.0,
    }
    results = []
    for batch, accumulation in ((4, 1), (2, 2)):
        model = copy.deepcopy(causal_lm).train()
        args = _args(
            tmp_path / f"{batch}", per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation, **common
        )
        Trainer(model=model, args=args, train_dataset=ListDataset(rows)).train()
        results.append(dict(model.named_parameters()))
    for name, param in results[0].items():
        torch.testing.assert_close(param, results[1][name], atol=1e-5, rtol=1e-5, msg=name)


def test_optimizer_param_groups(causal_lm):
    groups = causal_lm.optimizer_param_groups(weight_decay=0.1, lr=1e-3, recurrence_lr=2e-4)
    names = {id(p): n for n, p in causal_lm.named_parameters()}
    by_decay = {}
    for group in groups:
        for p in group["params"]:
            by_decay[names[id(p)]] = (group["weight_decay"], group["lr"])
    assert set(by_decay) == set(names.values())  # every parameter exactly once
    assert len(by_decay) == sum(len(g["params"]) for g in groups)
    for name, (decay, lr) in by_decay.items():
        if ".ssm." in name:
            assert (decay, lr) == (0.0, 2e-4), name
        elif name.endswith("bias") or "norm" in name or "embeddings" in name:
            assert decay == 0.0, name
    assert any(decay == 0.1 for decay, _ in by_decay.values())
    torch.optim.AdamW(groups)  # usable as is


@pytest.mark.parametrize("pooling", ["max", "mean", "last"])
def test_classifier_ignores_left_padding(family, pooling):
    if family.sequence_classification is None:
        pytest.skip("no classifier")
    torch.manual_seed(0)
    model = family.sequence_classification(family.config(num_labels=3, classifier_pooling=pooling)).eval()
    row = random_ids(1, 7)
    padded = torch.cat([torch.zeros(1, 5, dtype=torch.long), row], 1)
    mask = torch.cat([torch.zeros(1, 5), torch.ones(1, 7)], 1).long()
    torch.testing.assert_close(model(padded, attention_mask=mask).logits, model(row).logits, atol=1e-5, rtol=1e-5)
