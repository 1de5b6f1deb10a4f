"""A decode step reads nothing back from the device, every family with a causal LM: no ``.item()``, ``.tolist()``,
``.cpu()``, ``nonzero``, boolean-mask indexing or Python branch on a tensor's value. On a GPU each would be a host
synchronization per token and a break in a captured CUDA graph; checks that need host values run where the input
enters (the prefill, the first step that builds kept weights), on host integers (the cache's token count)."""

import pytest
import torch
from conftest import random_ids
from torch.overrides import TorchFunctionMode

# Tensor methods and functions that copy a value to the host (a data-dependent shape is one too: nonzero)
HOST_READS = {"item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__"}


class _NoHostReads(TorchFunctionMode):
    """Fails at the first op that reads a tensor's values back to the host."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        index = args[1] if name == "__getitem__" and len(args) > 1 else None
        indices = index if isinstance(index, tuple) else (index,)
        if name in HOST_READS or any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices):
            raise AssertionError(f"a host read in a decode step: {name}")
        return func(*args, **(kwargs or {}))


@torch.no_grad()
def test_a_static_cache_decode_step_reads_nothing_back(causal_lm):
    ids = random_ids(2, 6)
    cache = causal_lm.static_cache(batch_size=2, max_length=16)
    causal_lm(ids, cache=cache, use_cache=True)  # the prefill checks the ids once
    causal_lm(ids[:, :1], cache=cache, use_cache=True)  # a first step may build what it keeps between steps
    with _NoHostReads():
        for t in range(1, 4):
            logits = causal_lm(ids[:, t : t + 1], cache=cache, use_cache=True).logits
    assert logits.shape[:2] == (2, 1) and cache.get_seq_length() == 10


@torch.no_grad()
def test_the_spy_catches_a_read():
    with pytest.raises(AssertionError, match="item"), _NoHostReads():
        torch.ones(1).item()
    with pytest.raises(AssertionError, match="__bool__"), _NoHostReads():
        bool(torch.ones(1) > 0)


@torch.no_grad()
def test_a_static_cache_refuses_more_tokens_than_its_slots_before_the_forward(family):
    """Attention layers hold keys and values in fixed slots: the cache counts its tokens on the host and names
    the bound before a forward would overflow them."""
    if family.causal_lm is None:
        pytest.skip(f"{family.name} has no causal LM")
    model = family.causal_lm(family.config()).eval()
    cache = model.static_cache(batch_size=1, max_length=6)
    model(random_ids(1, 5), cache=cache, use_cache=True)
    if cache.max_length is None:  # recurrent layers only: their states do not grow
        model(random_ids(1, 3), cache=cache, use_cache=True)
        return
    with pytest.raises(ValueError, match="static cache holds 6 tokens; it has 5 and got 2 more"):
        model(random_ids(1, 2), cache=cache, use_cache=True)


@torch.no_grad()
def test_a_distilled_h3_decode_step_reads_nothing_back():
    """A distilled H3 whose heads straddle the tolerance (some modal at several orders, some exact) keeps its head
    groups between steps instead of reading its fit's buffers (``unique().tolist()``, ``nonzero``) every token."""
    import ssmhub

    torch.manual_seed(0)
    config = ssmhub.H3Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, max_kernel_length=32,
                             attention_layers=[], ssm_num_heads=8)  # fmt: skip
    model = ssmhub.H3ForCausalLM(config).eval()
    model.distill_for_decoding(8, tolerance=0.3)
    ids = random_ids(2, 6, vocab=64)
    cache = model.static_cache(batch_size=2, max_length=16)
    model(ids, cache=cache, use_cache=True)
    model(ids[:, :1], cache=cache, use_cache=True)  # the first step keeps the head groups
    with _NoHostReads():
        for t in range(1, 4):
            model(ids[:, t : t + 1], cache=cache, use_cache=True)
    assert cache.get_seq_length() == 10
