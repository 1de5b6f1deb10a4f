"""Truncated backpropagation through time with the public API, every family with a causal LM.

``model(window, cache=cache, use_cache=True)`` in training mode starts from the cache's states and leaves the
window's final states in it, graph included; ``cache.detach_()`` truncates the gradient there. Oracles: the
windows' logits and per-token losses equal one long forward's; the gradient of a window's loss is the full
one while the graph is kept and the truncated one after ``detach_``; ``position_ids`` 0 inside a window (or at
its first token) starts that row's next document from a fresh state, as a forward of that document alone.
Windows and one long forward are different computations (other lengths, FFT sizes and reduction orders): they
agree within float32 round-off of a whole model, ``MODEL_REL`` for logits and losses and ``MODEL_GRAD_REL`` for
gradients (tests/comparisons.py derives both).
"""

import pytest
import torch
from comparisons import MODEL_GRAD_REL, same_values, scaled_close
from conftest import random_ids

from ssmhub import RecurrentCache

LENGTH, WINDOW = 24, 8  # three windows


def _training_lm(family):
    if family.causal_lm is None:
        pytest.skip(f"{family.name} has no causal LM")
    torch.manual_seed(0)
    model = family.causal_lm(family.config())
    for module in model.modules():  # training mode without randomness, so forwards can be compared
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model.train()


def _next_tokens(ids):
    """The label of each position in a stream: the next token; -100 after the last."""
    return torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], 1)


def _windows(model, ids, cache, position_ids=None, detach=True):
    """Logits of each window of ``ids`` run in turn through ``cache``; the cache detached after each if asked."""
    logits = []
    for start in range(0, ids.shape[1], WINDOW):
        extra = {} if position_ids is None else {"position_ids": position_ids[:, start : start + WINDOW]}
        logits.append(model(ids[:, start : start + WINDOW], cache=cache, use_cache=True, **extra).logits)
        if detach:
            cache.detach_()
    return logits


def test_windows_through_the_cache_equal_one_long_forward(family):
    model = _training_lm(family)
    ids = random_ids(2, LENGTH)
    full = model(ids).logits
    cache = RecurrentCache(model.config.num_hidden_layers)
    windows = _windows(model, ids, cache)
    same_values(torch.cat(windows, 1), full, what="logits")
    # the per-token losses too: a window's shift_labels carry the next window's first token as its last label
    labels = _next_tokens(ids)
    long_losses = torch.nn.functional.cross_entropy(full.flatten(0, 1), labels.flatten(), reduction="none")
    for k, logits in enumerate(windows):
        window_labels = labels[:, k * WINDOW : (k + 1) * WINDOW].contiguous()
        loss = model.loss_function(logits, None, vocab_size=model.config.vocab_size, shift_labels=window_labels)
        expected = long_losses.view(2, LENGTH)[:, k * WINDOW : (k + 1) * WINDOW]
        expected = expected[window_labels != -100].mean()
        same_values(loss, expected, what=f"loss of window {k}")
    assert cache.get_seq_length() == LENGTH


def _window_loss_gradients(model, ids, detach):
    """Gradients of the last window's summed logits (fixed weights), after the earlier windows ran through a cache."""
    cache = RecurrentCache(model.config.num_hidden_layers)
    logits = _windows(model, ids, cache, detach=detach)
    weights = torch.randn(logits[-1].shape, generator=torch.Generator().manual_seed(3))
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.autograd.grad((logits[-1] * weights).sum(), params, allow_unused=True), weights


def test_the_cache_keeps_the_graph_until_detach(family):
    model = _training_lm(family)
    ids = random_ids(2, LENGTH)
    params = [p for p in model.parameters() if p.requires_grad]
    kept, weights = _window_loss_gradients(model, ids, detach=False)
    full = model(ids).logits[:, -WINDOW:]
    full_grads = torch.autograd.grad((full * weights).sum(), params, allow_unused=True)
    for got, expected in zip(kept, full_grads):  # graph kept: backpropagation through all windows
        if expected is not None:
            scaled_close(got, expected, rel=MODEL_GRAD_REL, what="gradient through every window")
    truncated, _ = _window_loss_gradients(model, ids, detach=True)
    with torch.no_grad():  # the last window's initial states, computed without a graph
        cache = RecurrentCache(model.config.num_hidden_layers)
        model(ids[:, : LENGTH - WINDOW], cache=cache, use_cache=True)
    alone = model(ids[:, -WINDOW:], cache=cache, use_cache=True).logits
    alone_grads = torch.autograd.grad((alone * weights).sum(), params, allow_unused=True)
    differs = False
    for got, expected, whole in zip(truncated, alone_grads, full_grads):
        if expected is not None:
            scaled_close(got, expected, rel=MODEL_GRAD_REL, what="gradient truncated at the window's start")
            # truncation moves some gradient by more than the round-off allowed above (measured: 4e-2 to 2e2 of
            # the largest entry, against round-off of 1e-7 to 2e-5)
            differs = differs or (got - whole).abs().max() > MODEL_GRAD_REL * whole.abs().max()
    assert differs, "detach_ did not truncate any gradient"


def test_a_kept_graph_is_freed_by_backward_so_a_loop_must_detach(family):
    """The usual TBPTT mistake (no detach between windows) fails loudly instead of training on stale graphs."""
    model = _training_lm(family)
    ids = random_ids(2, 2 * WINDOW)
    cache = RecurrentCache(model.config.num_hidden_layers)
    model(ids[:, :WINDOW], cache=cache, use_cache=True).logits.sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        model(ids[:, WINDOW:], cache=cache, use_cache=True).logits.sum().backward()
    cache.detach_()
    model(ids[:, WINDOW:], cache=cache, use_cache=True).logits.sum().backward()


def test_a_row_starts_its_next_document_fresh_inside_a_window(family):
    """Row 0 continues its document for 3 tokens, then starts a new one; row 1 starts a new one at the
    window's first token: both new documents get what they get alone, within float32 round-off."""
    model = _training_lm(family)
    ids = random_ids(2, 2 * WINDOW)
    cache = RecurrentCache(model.config.num_hidden_layers)
    model(ids[:, :WINDOW], cache=cache, use_cache=True)
    cache.detach_()
    window = ids[:, WINDOW:]
    position_ids = torch.tensor([[WINDOW, WINDOW + 1, WINDOW + 2, *range(WINDOW - 3)], list(range(WINDOW))])
    logits = model(window, cache=cache, use_cache=True, position_ids=position_ids).logits
    same_values(logits[0, 3:], model(window[:1, 3:]).logits[0], what="a document started inside the window")
    same_values(logits[1], model(window[1:]).logits[0], what="a document started at the window's first token")
    continued = model(ids[:1]).logits[0, WINDOW : WINDOW + 3]
    same_values(logits[0, :3], continued, what="the continued document")


def test_gradient_checkpointing_keeps_a_given_cache(family):
    model = _training_lm(family)
    ids = random_ids(2, 2 * WINDOW)
    expected = torch.cat(_windows(model, ids, RecurrentCache(model.config.num_hidden_layers)), 1)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    got = torch.cat(_windows(model, ids, RecurrentCache(model.config.num_hidden_layers)), 1)
    same_values(got, expected, what="logits with gradient checkpointing")
    got.sum().backward()


def test_a_decode_step_in_eval_mode_still_refuses_a_document_start(family):
    model = _training_lm(family).eval()
    out = model(random_ids(1, 4), use_cache=True)
    with pytest.raises(ValueError, match="training mode may"):
        model(random_ids(1, 2), cache=out.past_key_values, position_ids=torch.tensor([[4, 0]]))
