"""Every family's training step compiles whole: ``torch.compile(model, fullgraph=True)`` captures the forward and
the backward with no graph break, gives eager's loss and gradients, and a second step of the same shapes runs the
same graph (no recompilation), on plain rows and on packed rows as transformers'
``DataCollatorWithFlattening(return_flash_attn_kwargs=True)`` hands them over (document sizes on the host).

The backend is ``aot_eager``: Dynamo's capture and AOTAutograd's joint forward-backward graph, what ``fullgraph``
and a GPU's Inductor rely on, without Inductor's C++ code generation (minutes per model on a 2-core CPU);
``test_inductor_compiles_a_training_step`` runs Inductor itself on one family. A compiled graph and eager run the
same ATen ops, but functionalization may reorder in-place work, so the bits are not promised: losses within
``MODEL_REL`` and gradients within ``MODEL_GRAD_REL`` of the largest value (tests/comparisons.py derives both)."""

import pytest
import torch
import torch._dynamo
from comparisons import MODEL_GRAD_REL, MODEL_REL, scaled_close
from families import FAMILIES
from transformers import DataCollatorWithFlattening

# one variant per mixer: the others share these mixers' code (the registry's other rows change options)
COMPILED = ["dlr", "bdlrnn", "h3", "h3-hybrid", "serpent-mamba", "serpent"]
# document lengths per step, 21 tokens each: steps 0 and 1 have the same count and longest document (the same
# shapes), step 2 other ones
DOCUMENTS = [[7, 3, 11], [11, 5, 5], [5, 9, 2, 5]]


def _family(name):
    return next(f for f in FAMILIES if f.name == name)


def _model(name):
    family = _family(name)
    torch.manual_seed(0)
    return family.causal_lm(family.config(use_cache=False)).train()


def _plain_batch(step):
    ids = torch.randint(1, 64, (2, 16), generator=torch.Generator().manual_seed(step))
    return {"input_ids": ids, "labels": ids}


def _packed_batch(step):
    """One flattened row of documents with ``cu_seq_lens_q/k`` and ``max_length_q/k`` (host ints), as the collator
    gives them; steps differ in their documents' count and lengths."""
    generator = torch.Generator().manual_seed(step)
    documents = [{"input_ids": torch.randint(1, 64, (n,), generator=generator).tolist()} for n in DOCUMENTS[step]]
    return DataCollatorWithFlattening(return_flash_attn_kwargs=True)(documents)


def _loss_and_grads(model, batch, run=None):
    """The loss of ``batch`` and the gradients of ``model``'s parameters, the step run by ``run`` (a compiled
    wrapper of ``model``) or by ``model`` itself."""
    model.zero_grad(set_to_none=True)
    loss = (model if run is None else run)(**batch).loss
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def _check_like_eager(compiled, eager_model, batch):
    loss, grads = _loss_and_grads(compiled._orig_mod, batch, run=compiled)
    loss_ref, grads_ref = _loss_and_grads(eager_model, batch)
    scaled_close(loss, loss_ref, rel=MODEL_REL, what="loss")
    assert grads.keys() == grads_ref.keys()
    for name, grad in grads.items():
        scaled_close(grad, grads_ref[name], rel=MODEL_GRAD_REL, what=name)


@pytest.mark.parametrize("rows", ["plain", "packed"])
@pytest.mark.parametrize("name", COMPILED)
def test_training_step_compiles_whole_and_matches_eager(name, rows):
    torch._dynamo.reset()
    batch = _plain_batch if rows == "plain" else _packed_batch
    eager = _model(name)
    compiled = torch.compile(_model(name), fullgraph=True, backend="aot_eager")
    _check_like_eager(compiled, eager, batch(0))
    with torch._dynamo.config.patch(error_on_recompile=True):  # the next step, other tokens of the same shapes
        _check_like_eager(compiled, eager, batch(1))


def test_packed_rows_of_other_sizes_compile_once_more_then_never():
    """Packed steps whose documents' count and longest length change: Dynamo makes both symbolic at the first
    change (automatic dynamic shapes), and that graph serves every later size."""
    torch._dynamo.reset()
    eager = _model("dlr")
    compiled = torch.compile(_model("dlr"), fullgraph=True, backend="aot_eager")
    _check_like_eager(compiled, eager, _packed_batch(0))
    _check_like_eager(compiled, eager, _packed_batch(2))
    with torch._dynamo.config.patch(error_on_recompile=True):
        _check_like_eager(compiled, eager, _packed_batch(1))
