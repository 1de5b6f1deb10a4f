"""Fine-tuning with transformers.Trainer, gradient accumulation that equals one large batch, gradient checkpointing,
the optimizer groups.

A check that holds for any head runs on the family's causal LM or, where it has none (``dlr-bidirectional``,
``serpent-faithful``), its sequence classifier; gradient accumulation also runs on every token classifier.
"""

import copy

import pytest
import torch
from comparisons import EPS32, MODEL_GRAD_REL, same_values, scaled_close
from conftest import random_ids, random_labels
from devices import device_type
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
        "use_cpu": device_type() == "cpu",  # train where the model and the rows are
        "dataloader_pin_memory": False,  # the rows already live on the device: only CPU tensors can be pinned
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


def accumulation_rows(model) -> list[dict]:
    """Four training rows for ``model``'s head whose labelled items differ between the two halves of the
    batch: an LM's or a tagger's rows have 10, 7, 4 and 1 labelled positions; of a sequence classifier's
    four rows, the third is unlabelled (-100), so the halves hold 2 and 1 labels."""
    rows = []
    for i in range(4):
        ids = random_ids(1, 12, seed=10 + i)
        labels = random_labels(model, ids, seed=i)[0]
        if labels.dim():  # one label per position
            labels[: 2 + 3 * i] = -100
        elif i == 2:
            labels = torch.tensor(-100)
        rows.append({"input_ids": ids[0], "labels": labels})
    return rows


@pytest.mark.parametrize("head", ["any_model", "tagger"], ids=["lm-or-classifier", "tagger"])
def test_gradient_accumulation_equals_one_large_batch(family, head, request, tmp_path):
    """One step over a batch of 4 equals 2 accumulated micro-batches of 2 (within float32 round-off: a batch
    and its halves are different computations), although the micro-batches hold different numbers of labelled
    items: Trainer passes num_items_in_batch to a model whose forward takes **kwargs and does not divide its
    loss by the accumulation steps, so the head's loss must divide its sum by num_items_in_batch (else the
    updates differ by a factor, not by round-off). (``family`` is requested so that ``head``, a fixture
    parametrized by it, can be looked up by name.)"""
    model = request.getfixturevalue(head)
    rows = accumulation_rows(model)
    common = {
        "max_steps": 1,
        "learning_rate": 1.0,
        "optim": "sgd",
        "lr_scheduler_type": "constant",
        "max_grad_norm": 0.0,
    }
    results = []
    for batch, accumulation in ((4, 1), (2, 2)):
        trained = copy.deepcopy(model).train()
        args = _args(
            tmp_path / f"{batch}", per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation, **common
        )
        Trainer(model=trained, args=args, train_dataset=ListDataset(rows)).train()
        results.append(dict(trained.named_parameters()))
    # One SGD step of rate 1 takes a whole model's gradient off each parameter: the two steps differ by the
    # gradients' round-off (MODEL_GRAD_REL of the largest update) plus each subtraction's (1 ulp of the parameter).
    initial = dict(model.named_parameters())
    for name, param in results[0].items():
        largest_update = (param - initial[name]).abs().max().item()
        atol = MODEL_GRAD_REL * largest_update + EPS32 * param.abs().max().item()
        torch.testing.assert_close(results[1][name], param, atol=atol, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


def test_gradient_checkpointing_gives_the_same_gradients(any_model):
    """Checkpointed blocks recompute their forward in the backward pass: loss and gradients equal the
    plain run's. One row is left-padded with real (nonzero) token ids, so a block that lost the
    attention mask in the recomputation would see them and change the gradients."""
    ids = random_ids(2, 12)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    labels = random_labels(any_model, ids)
    if labels.dim() == 2:
        labels[mask == 0] = -100
    any_model.train()
    expected_loss = any_model(ids, attention_mask=mask, labels=labels).loss
    expected_loss.backward()
    expected = {n: p.grad.clone() for n, p in any_model.named_parameters()}
    any_model.zero_grad()
    any_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert any_model.is_gradient_checkpointing
    loss = any_model(ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    same_values(loss, expected_loss, what="loss")  # another forward: within float32 round-off
    for name, param in any_model.named_parameters():  # backpropagation through recomputed blocks: a whole model's
        scaled_close(param.grad, expected[name], rel=MODEL_GRAD_REL, what=f"gradient of {name}")


def test_optimizer_param_groups(any_model):
    groups = any_model.optimizer_param_groups(weight_decay=0.1, lr=1e-3, recurrence_lr=2e-4)
    names = {id(p): n for n, p in any_model.named_parameters()}
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
    same_values(model(padded, attention_mask=mask).logits, model(row).logits, what="logits after the padding")
