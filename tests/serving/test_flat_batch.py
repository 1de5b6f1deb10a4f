"""ssmhub.serving.flat_batch against its oracle, each request's own forward: the engine adapter changes no number.

A flat batch of decode rows and prefill segments (new prompts, chunks continuing a stored state, a new one-token
request counted among the decodes, a slot reused from an earlier request) over every family's mixer gives each
request what the mixer's forward over its whole sequence gives, and leaves in each slot the state that forward ends
with. No engine is needed: the batch layout is what vLLM hands over."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "conformance"))
from comparisons import MODEL_REL, same_values
from families import FAMILIES

from ssmhub.serving.flat_batch import (
    FlatBatch,
    StepBatches,
    _eager_on_failure,
    compiled_decode,
    decode_rows,
    mix_flat_batch,
)
from ssmhub.serving.state_pages import StatePages

MIXERS = {f.name: f for f in FAMILIES if f.causal_lm is not None}


def _mixer(name: str, layer: int = 0):
    torch.manual_seed(0)
    family = MIXERS[name]
    return family.causal_lm(family.config()).eval().backbone.layers[layer].mixer


def _tables(mixer, slots: int):
    """The mixer's state tables, (slots, *shape) each, as views of one byte page per slot (what vLLM allocates);
    filled with garbage, so a request that wrongly reads a slot it did not write shows it."""
    pages = StatePages.of(mixer, torch.float32)
    raw = torch.randint(0, 255, (slots, pages.page_bytes), dtype=torch.uint8)
    tables = pages.views(raw)
    for value in tables.values():  # finite garbage of every dtype
        value.copy_(torch.rand(value.shape).to(value.dtype) if value.is_floating_point() or value.is_complex() else 0)
    return tables


def _run(mixer, tables, steps, inputs):
    """Run the engine steps: each a list of (request, n_tokens); decodes (n = 1, continuing) first, as vLLM orders
    them. Returns each request's outputs, concatenated over its steps."""
    done = {r: 0 for r in inputs}
    outputs = {r: [] for r in inputs}
    slot_of = {r: s for r, s in zip(inputs, [3, 1, 4, 0, 2, 5])}
    for step in steps:
        lengths = [n for _, n in step]
        starts = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
        seq_lens = torch.tensor([done[r] + n for r, n in step])
        num_decodes = next((i for i, n in enumerate(lengths) if n != 1), len(lengths))  # the leading one-token rows
        width = inputs[step[0][0]].shape[1]
        x = torch.cat([inputs[r][done[r] : done[r] + n] for r, n in step] + [torch.zeros(2, width)])  # 2 padding rows
        slots = torch.tensor([slot_of[r] for r, _ in step] + [7, 7])  # vLLM pads the slot list too
        batch = FlatBatch.from_offsets(num_decodes, starts, seq_lens, slots)
        with torch.no_grad():
            y = mix_flat_batch(mixer, x, batch, tables)
        assert y.shape[0] == x.shape[0] and bool((y[batch.num_tokens :] == 0).all())  # padding rows: zeros
        for (r, n), a in zip(step, starts[:-1].tolist()):
            outputs[r].append(y[a : a + n])
            done[r] += n
    return {r: torch.cat(o) for r, o in outputs.items()}, slot_of


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_flat_batch_equals_each_request_alone(name):
    mixer = _mixer(name, layer=1 if name == "h3-hybrid" else 0)
    if name == "h3-hybrid":  # its layer 1 is attention, which vLLM's own paged attention serves
        with pytest.raises(ValueError, match="grows with the context"):
            StatePages.of(mixer, torch.float32)
        return
    g = torch.Generator().manual_seed(1)
    lengths = {"a": 8, "b": 2, "c": 12, "d": 4, "e": 1}
    inputs = {r: torch.randn(n, mixer.hidden_size, generator=g) for r, n in lengths.items()}
    steps = [
        [("a", 5), ("c", 3)],  # two new prompts, chunked
        [("a", 1), ("b", 1), ("c", 6)],  # a short extend as a decode row; b: a new one-token request; c continues
        [("a", 1), ("b", 1), ("c", 3), ("d", 4)],
        [("a", 1), ("e", 1)],  # e: new, one token, in a slot whose garbage it must not read
    ]
    tables = _tables(mixer, 8)
    outputs, slot_of = _run(mixer, tables, steps, inputs)
    for request, x in inputs.items():
        n = outputs[request].shape[0]
        with torch.no_grad():
            expected, final = mixer(x[None, :n], return_state=True)
        same_values(outputs[request], expected[0], rel=MODEL_REL, what=f"{name} request {request}")
        for field, value in final.items():
            stored = tables[field][slot_of[request]]
            same_values(stored, value[0].to(stored.dtype), rel=MODEL_REL, what=f"{name} {request} {field}")


@pytest.mark.parametrize("name", ["dlr", "serpent", "serpent-mamba", "h3", "h3-ssm"])
def test_compiled_decode_rows_equal_eager(name):
    """:func:`compiled_decode` (what the vLLM plugin runs unless vLLM is eager; DLR's state is one tensor, fused
    whole; SeRpEnt's, Mamba's and H3's several, the step compiled alone, from step coefficients formed eagerly): the
    same outputs and slot states as eager, a new row reset, other slots untouched; float32 round-off apart (fused,
    reordered sums)."""
    mixer = _mixer(name)
    eager, compiled = _tables(mixer, 8), _tables(mixer, 8)
    for name_, value in compiled.items():
        value.copy_(eager[name_])
    g = torch.Generator().manual_seed(2)
    slots, new = torch.tensor([5, 2, 6]), torch.tensor([False, True, False])
    step = compiled_decode(mixer)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(3, mixer.hidden_size, generator=g)
            coefficients = mixer.step_coefficients()  # formed eagerly, inputs of the graph (as the plugin runs it)
            y = step(mixer, x, compiled, slots, new, coefficients)
            same_values(y, decode_rows(mixer, x, eager, slots, new), rel=MODEL_REL)
    for field, value in eager.items():
        same_values(compiled[field], value, rel=MODEL_REL, what=f"{name} {field}")


@pytest.mark.parametrize("name", ["dlr", "serpent-mamba", "serpent"])
def test_a_mixer_with_a_one_pass_kernel_compiles_only_what_the_kernel_leaves(name):
    """A served mixer whose kernel (numba) steps all of its state runs it eagerly under a compiled engine, and
    compiles its whole step without one; SeRpEnt with resampling branches (its base Mamba's kernel, the branches'
    many small ops) compiles its whole step either way."""
    mixer = _mixer(name)
    compiled = name == "serpent" or not mixer.steps_rows_in_one_pass
    assert mixer.compiles_whole_step is compiled
    assert (compiled_decode(mixer) is decode_rows) is not compiled


def test_a_decode_torch_compile_fails_on_falls_back_to_eager_with_a_warning():
    calls = []

    def failing(*args):
        calls.append("compiled")
        raise torch._dynamo.exc.TorchDynamoException("no kernel for this")

    decode = _eager_on_failure(failing, lambda *args: calls.append("eager") or "eager result")
    with pytest.warns(RuntimeWarning, match="no kernel for this"):
        assert decode(1, 2) == "eager result"
    assert decode(1, 2) == "eager result" and calls == ["compiled", "eager", "eager"]  # compiled is not tried again


def test_a_steps_batch_is_read_once_and_again_at_the_next_step_even_from_the_same_buffers():
    batches = StepBatches()
    offsets, seq_lens, slots = torch.tensor([0, 1, 2, 5]), torch.tensor([4, 1, 3]), torch.tensor([2, 0, 1, 9])
    step = object()  # what an engine makes anew for each step (vLLM's forward context)
    first = batches.batch(step, 2, offsets, seq_lens, slots)
    assert batches.batch(step, 2, offsets, seq_lens, slots) is first  # the step's next layer: nothing read again
    assert first.lengths == (1, 1, 3) and first.continues == (True, False, False)
    assert first.fresh_decodes.tolist() == [False, True] and first.slots.tolist() == [2, 0, 1]
    group = batches.batch(step, 2, offsets, seq_lens, torch.tensor([5, 6, 7, 9]))  # another KV-cache group's slots
    assert group.lengths == first.lengths and group.slots.tolist() == [5, 6, 7]
    offsets.copy_(torch.tensor([0, 1, 3, 5])), seq_lens.copy_(torch.tensor([5, 4, 2]))  # an engine's buffers, reused
    following = batches.batch(object(), 1, offsets, seq_lens, slots)  # the next step: read again
    assert following.lengths == (1, 2, 2) and following.continues == (True, True, False)
    assert following.fresh_decodes.tolist() == [False]
