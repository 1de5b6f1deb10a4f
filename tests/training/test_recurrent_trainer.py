"""RecurrentTrainer: an ssmhub model's optimizer follows ``optimizer_param_groups`` (no weight decay on the
recurrence, its own learning rate), a transformers model keeps Trainer's own; ``anneal_over_budget`` multiplies the
step schedule by the paper's cosine over the share of a time budget spent (arXiv 2212.00768 §A.6)."""

from __future__ import annotations

import io
import math

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments, get_scheduler

from ssmhub import DLRConfig, DLRForSequenceClassification
from ssmhub.training.recurrent_trainer import RecurrentTrainer, anneal_over_budget
from ssmhub.training.time_budget import TimeBudgetCallback


def _args(tmp_path, **fields):
    return TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, **fields)


def _dlr(**fields):
    config = DLRConfig(vocab_size=17, hidden_size=8, num_hidden_layers=1, state_size=4, num_labels=3, **fields)
    return DLRForSequenceClassification(config)


def _groups_by_parameter(optimizer) -> dict[int, dict]:
    return {id(p): group for group in optimizer.param_groups for p in group["params"]}


def test_an_ssmhub_model_is_optimized_over_its_param_groups(tmp_path):
    model = _dlr(recurrence_learning_rate=2e-4)
    args = _args(tmp_path, weight_decay=0.05, learning_rate=1e-3, adam_beta2=0.98)
    optimizer = RecurrentTrainer(model=model, args=args).create_optimizer()
    groups = _groups_by_parameter(optimizer)
    expected = _groups_by_parameter(torch.optim.AdamW(model.optimizer_param_groups(0.05, 1e-3)))
    assert groups.keys() == expected.keys() == {id(p) for p in model.parameters()}
    for name, parameter in model.named_parameters():
        group, want = groups[id(parameter)], expected[id(parameter)]
        assert (group["weight_decay"], group["lr"]) == (want["weight_decay"], want["lr"]), name
        if ".ssm." in name:  # Λ and W: no weight decay, the recurrence's learning rate
            assert (group["weight_decay"], group["lr"]) == (0.0, 2e-4)
        assert group["betas"] == (0.9, 0.98)  # the optimizer's own arguments still come from TrainingArguments


def test_a_transformers_model_keeps_trainers_optimizer(tmp_path):
    config = BertConfig(vocab_size=17, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)
    model = BertForSequenceClassification(config)
    args = _args(tmp_path, weight_decay=0.05)
    ours = _groups_by_parameter(RecurrentTrainer(model=model, args=args).create_optimizer())
    theirs = _groups_by_parameter(Trainer(model=model, args=args).create_optimizer())
    assert {k: g["weight_decay"] for k, g in ours.items()} == {k: g["weight_decay"] for k, g in theirs.items()}


def _budget(seconds: float, spent: float) -> TimeBudgetCallback:
    budget = TimeBudgetCallback(seconds)
    budget.spent = spent
    return budget


@pytest.mark.parametrize("spent", [0.0, 25.0, 50.0, 100.0, 130.0])
def test_the_schedule_is_multiplied_by_a_cosine_over_the_budget(spent):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    steps = get_scheduler("constant_with_warmup", optimizer, num_warmup_steps=10, num_training_steps=1000)
    reference = list(steps.lr_lambdas)
    budget = _budget(100.0, spent)
    scheduler = anneal_over_budget(steps, budget)
    share = min(spent / 100.0, 1.0)
    for step in (0, 5, 10, 500):
        want = reference[0](step) * 0.5 * (1 + math.cos(math.pi * share))
        assert scheduler.lr_lambdas[0](step) == pytest.approx(want, rel=1e-12, abs=1e-15)
    if share == 1.0:
        assert scheduler.lr_lambdas[0](500) == pytest.approx(0.0, abs=1e-15)


def test_an_annealed_schedule_saves_its_state():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    scheduler = anneal_over_budget(get_scheduler("cosine", optimizer, 2, 10), _budget(10.0, 1.0))
    torch.save(scheduler.state_dict(), io.BytesIO())  # Trainer writes scheduler.pt with every checkpoint


def test_bad_budgets_are_refused_by_name(tmp_path):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    with pytest.raises(ValueError, match="LambdaLR"):
        anneal_over_budget(plateau, _budget(10.0, 0.0))
    with pytest.raises(ValueError, match="budget must be a TimeBudgetCallback"):
        RecurrentTrainer(model=_dlr(), args=_args(tmp_path), budget=60.0)
    with pytest.raises(ValueError, match="budget must also be one of the Trainer's callbacks"):
        RecurrentTrainer(model=_dlr(), args=_args(tmp_path), budget=_budget(10.0, 0.0))
