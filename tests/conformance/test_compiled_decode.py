"""The static decode step (issue 28 §1), every family with a causal LM: with a preallocated cache
(``model.static_cache``), ``generate`` gives eager ``generate``'s tokens, keeps every state tensor in place, and with
its decode step compiled by ``torch.compile(fullgraph=True)`` (transformers' ``compile_config``) gives the same tokens
again: a graph break would raise. Dynamo is run with the ``eager`` backend in CI (it checks the capture, which is
where a graph breaks, in seconds) for every family; Inductor code generation runs in ``make test-all`` (``slow``)."""

import pytest
import torch
from conftest import random_ids
from families import FAMILIES
from torch._dynamo.utils import counters
from transformers import CompileConfig

from ssmhub.models.cache_argument import CACHE_FIELD

FAST = tuple(f.name for f in FAMILIES)  # Dynamo's capture takes seconds: every family in CI
NEW_TOKENS, PROMPT = 12, 5


def _params(fast=FAST):
    params = []
    for family in FAMILIES:
        if family.causal_lm is None:
            continue
        marks = [] if family.name in fast else [pytest.mark.slow]
        params.append(pytest.param(family, marks=marks, id=family.name))
    return params


def _model(family):
    torch.manual_seed(0)
    return family.causal_lm(family.config()).eval()


def _compile_config(backend: str) -> CompileConfig:
    config = CompileConfig(fullgraph=True, backend=backend, mode=None if backend == "eager" else "default")
    config._compile_all_devices = True  # transformers compiles the decode step on accelerators only by default
    return config


def _compiled_decodes_as_generate(family, backend: str) -> int:
    """Assert that generate with the decode step compiled by ``backend`` gives eager generate's tokens; returns the
    number of graphs Dynamo captured."""
    model = _model(family)
    prompt = random_ids(1, PROMPT)
    expected = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
    torch._dynamo.reset()
    counters.clear()
    cache = model.static_cache(1, PROMPT + NEW_TOKENS)
    tokens = model.generate(
        prompt,
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        compile_config=_compile_config(backend),
        **{CACHE_FIELD: cache},
    )
    graphs = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    assert torch.equal(tokens, expected)  # greedy token ids: exact
    return graphs


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.causal_lm is not None], ids=lambda f: f.name)
@torch.no_grad()
def test_a_static_cache_decodes_as_generate_in_place(family):
    model = _model(family)
    prompt = random_ids(2, PROMPT)
    expected = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
    cache = model.static_cache(2, PROMPT + NEW_TOKENS)
    assert cache.is_compileable
    addresses = [{name: t.data_ptr() for name, t in state.items()} for state in cache.layers]
    got = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, **{CACHE_FIELD: cache})
    assert torch.equal(got, expected)  # greedy token ids: exact
    assert [{name: t.data_ptr() for name, t in state.items()} for state in cache.layers] == addresses  # integers
    assert cache.get_seq_length() == PROMPT + NEW_TOKENS - 1


@pytest.mark.parametrize("family", _params())
@torch.no_grad()
def test_the_compiled_decode_step_has_no_graph_break(family):
    # one graph, and one more once the token count becomes a dynamic size (Dynamo's automatic dynamic shapes)
    assert _compiled_decodes_as_generate(family, "eager") <= 2


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.causal_lm is not None], ids=lambda f: f.name)
@torch.no_grad()
def test_decode_steps_get_fixed_input_shapes(family):
    """Every decode step's inputs have the same shapes: generate's attention mask, which grows by a column per token,
    reaches the model as the new token's column only (the states hold the rest), so a compiled step with static
    shapes (or one traced under a mode that defeats Dynamo's automatic dynamic shapes) does not recompile per token."""
    model = _model(family)
    shapes = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["attention_mask"].shape)), with_kwargs=True
    )
    prompt = random_ids(2, PROMPT)
    mask = torch.ones_like(prompt)
    mask[1, :2] = 0  # a left-padded row: generate passes a mask only where one is needed
    model.generate(prompt, attention_mask=mask, max_new_tokens=4, do_sample=False)
    hook.remove()
    assert shapes == [(2, PROMPT)] + [(2, 1)] * 3  # integers


@pytest.mark.slow
@pytest.mark.parametrize("family", _params(fast=()))
@torch.no_grad()
def test_the_inductor_compiled_decode_step_decodes_as_generate(family):
    _compiled_decodes_as_generate(family, "inductor")


def test_static_cache_arguments_are_checked():
    model = _model(next(f for f in FAMILIES if f.name == "h3-hybrid"))
    for kwargs, name in (({"batch_size": 0}, "batch_size"), ({"max_length": True}, "max_length")):
        with pytest.raises(ValueError, match=name):
            model.static_cache(**kwargs)
