"""Packed rows (several documents back to back, marked as transformers' padding-free collators mark them) give
every document what it gets alone: outputs and gradients, every family and variant; the loss of a
``DataCollatorWithFlattening`` batch is the loss of its documents; bad boundaries are refused by name.

A packed row and its documents alone are different computations (other lengths, so other FFT sizes, blockings and
reduction orders): they agree within float32 round-off of a whole model, ``MODEL_REL`` for outputs and losses and
``MODEL_GRAD_REL`` for gradients (tests/comparisons.py derives both)."""

import pytest
import torch
from comparisons import MODEL_GRAD_REL, same_values, scaled_close
from conftest import random_ids
from devices import device_type
from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments

ROWS = [[1, 2, 17, 5], [9, 16]]  # document lengths per row (25 tokens each): 17 > every H3 kernel length here


def _model(family):
    head = family.token_classification or family.causal_lm
    torch.manual_seed(0)
    kwargs = {"num_labels": 3} if head is family.token_classification else {}
    return head(family.config(use_cache=False, **kwargs)).backbone.eval()


def _packed_position_ids(rows):
    return torch.tensor([[i for length in row for i in range(length)] for row in rows])


def _per_document_hidden(model, ids, rows):
    """Each document run alone, put back where it sits in its packed row."""
    out = []
    for b, row in enumerate(rows):
        begin, pieces = 0, []
        for length in row:
            pieces.append(model(ids[b : b + 1, begin : begin + length]).last_hidden_state)
            begin += length
        out.append(torch.cat(pieces, 1))
    return torch.cat(out, 0)


def test_packed_rows_equal_each_document_alone_outputs_and_gradients(family):
    model = _model(family)
    ids = random_ids(2, 25)
    weights = torch.randn(2, 25, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    packed = model(ids, position_ids=_packed_position_ids(ROWS)).last_hidden_state
    alone = _per_document_hidden(model, ids, ROWS)
    same_values(packed, alone, what="hidden states")
    names, params = zip(*model.named_parameters())
    grads = torch.autograd.grad((packed * weights).sum(), params, allow_unused=True)
    grads_alone = torch.autograd.grad((alone * weights).sum(), params, allow_unused=True)
    for name, got, expected in zip(names, grads, grads_alone):
        if expected is None:
            assert got is None or not got.any(), name  # unused alone: no path to the outputs, so exactly 0
            continue
        scaled_close(got, expected, rel=MODEL_GRAD_REL, what=name)


def test_seq_idx_and_cu_seq_lens_mark_the_same_documents(family):
    model = _model(family)
    lengths = ROWS[0]
    ids = random_ids(1, sum(lengths))
    by_positions = model(ids, position_ids=_packed_position_ids([lengths])).last_hidden_state
    seq_idx = torch.tensor([[d for d, length in enumerate(lengths) for _ in range(length)]])
    cu_seq_lens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    # each marking becomes the same document starts (booleans), but every forward is a computation of its own
    same_values(model(ids, seq_idx=seq_idx).last_hidden_state, by_positions, what="seq_idx")
    same_values(model(ids, cu_seq_lens_q=cu_seq_lens).last_hidden_state, by_positions, what="cu_seq_lens_q")


def test_one_document_per_row_is_the_plain_forward(family):
    """Position ids that start no second document give the plain forward's output, within float32 round-off."""
    model = _model(family)
    ids = random_ids(2, 9)
    plain = model(ids).last_hidden_state
    positions = torch.arange(9).expand(2, 9)
    same_values(model(ids, position_ids=positions).last_hidden_state, plain, what="hidden states")


def test_flattening_collator_loss_is_the_loss_of_its_documents(family):
    if family.causal_lm is None:
        pytest.skip(f"{family.name} has no causal LM")
    torch.manual_seed(0)
    model = family.causal_lm(family.config()).eval()
    documents = [random_ids(1, n, seed=n)[0].tolist() for n in (6, 1, 11)]
    batch = DataCollatorWithFlattening()([{"input_ids": d} for d in documents])
    packed = model(**batch).loss
    token_losses = [
        model(torch.tensor([d]), labels=torch.tensor([d])).loss * (len(d) - 1) for d in documents if len(d) > 1
    ]
    expected = torch.stack(token_losses).sum() / sum(len(d) - 1 for d in documents)
    # a cross-entropy moves by at most 2 max|Δlogits| ≤ 2 MODEL_REL max|logits|, and |logits| < 0.5 < the loss here
    same_values(packed, expected, what="loss")


def test_trainer_trains_with_the_flattening_collator(family, tmp_path):
    if family.causal_lm is None:
        pytest.skip(f"{family.name} has no causal LM")
    torch.manual_seed(0)
    model = family.causal_lm(family.config())
    dataset = [{"input_ids": random_ids(1, n, seed=n)[0].tolist()} for n in (5, 9, 3, 12, 7, 4)]
    args = TrainingArguments(  # train where the model is; the collator builds its batches there, so none is pinned
        tmp_path, per_device_train_batch_size=3, max_steps=2, report_to=[], save_strategy="no",
        use_cpu=device_type() == "cpu", dataloader_pin_memory=False,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=DataCollatorWithFlattening())
    result = trainer.train()
    assert torch.isfinite(torch.tensor(result.training_loss))


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"position_ids": torch.tensor([[1, 2, 0, 1]])}, "position_ids must be 0 at each row's first real token"),
        ({"position_ids": torch.tensor([[0, 1, 2]])}, "position_ids must have shape"),
        ({"seq_idx": torch.tensor([[0, 1, 0, 1]])}, "seq_idx must be non-decreasing"),
        ({"cu_seq_lens_q": torch.tensor([0, 3])}, "cu_seq_lens_q must increase strictly from 0 to the batch's B·L = 4"),
    ],
)
def test_bad_document_boundaries_are_refused_by_name(family, arguments, says):
    with pytest.raises(ValueError, match=says):
        _model(family)(random_ids(1, 4), **arguments)


def test_a_document_cannot_start_inside_a_cached_decode(causal_lm):
    out = causal_lm(random_ids(1, 4), use_cache=True)
    with pytest.raises(ValueError, match="cannot start in the middle of a cached decode"):
        causal_lm(random_ids(1, 2), cache=out.past_key_values, position_ids=torch.tensor([[4, 0]]), use_cache=True)
