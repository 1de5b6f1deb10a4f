"""A decode step reads nothing back from the device, every family with a causal LM: no ``.item()``, ``.tolist()``,
``.cpu()``, ``nonzero``, boolean-mask indexing or Python branch on a tensor's value. On a GPU each would be a host
synchronization per token and a break in a captured CUDA graph; checks that need host values run where the input
enters (the prefill, the first step that builds kept weights), on host integers (the cache's token count)."""

import numpy as np
import pytest
import torch
from comparisons import MODEL_REL, scaled_close
from conftest import random_ids
from torch.overrides import TorchFunctionMode
from transformers import DataCollatorWithFlattening

from ssmhub.data import PackedWindows, TokenStream
from ssmhub.ops import host_reads
from ssmhub.training.batches import window_inputs

# Tensor methods and functions that copy a value to the host (a data-dependent shape is one too: nonzero)
HOST_READS = {"item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__"}


class _NoHostReads(TorchFunctionMode):
    """Fails at the first op that reads a tensor's values back to the host (``count``: counts them instead)."""

    def __init__(self, count: bool = False):
        super().__init__()
        self.count, self.reads = count, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        index = args[1] if name == "__getitem__" and len(args) > 1 else None
        indices = index if isinstance(index, tuple) else (index,)
        if name in HOST_READS or any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices):
            if not self.count:
                raise AssertionError(f"a host read in a decode step: {name}")
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


def _host_reads(model, **inputs) -> list[str]:
    """The host reads of one forward of ``model`` on ``inputs`` (after one unwatched forward, which may keep
    what later ones reuse)."""
    model(**inputs)
    with _NoHostReads(count=True) as spy:
        model(**inputs)
    return spy.reads


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


@pytest.fixture
def reads_not_free():
    """The code paths of an accelerator (or ``torch.compile``) on this CPU: no shortcut by a host read."""
    with host_reads.static_paths():
        yield


def test_a_packed_training_forward_reads_nothing_back(causal_lm, reads_not_free):
    """A training forward, plain or on ``DataCollatorWithFlattening``'s batch (its ``max_length_q`` and
    ``cu_seq_lens``: the sizes of a batch of documents, host integers from the collator), reads nothing back; with
    ``position_ids`` alone, one read at most (the sizes, once per forward, not per layer)."""
    documents = [random_ids(1, n, seed=n)[0].tolist() for n in (5, 9, 3, 7)]
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True)([{"input_ids": ids} for ids in documents])
    assert isinstance(batch["max_length_q"], int) and batch["input_ids"].shape == (1, 24)
    model = causal_lm.train()
    assert _host_reads(model, input_ids=batch["input_ids"], labels=batch["labels"]) == []
    assert _host_reads(model, **batch) == []
    assert len(_host_reads(model, input_ids=batch["input_ids"], position_ids=batch["position_ids"])) <= 1


def test_ssmhub_trains_packed_windows_without_a_read(causal_lm, reads_not_free):
    """``ssmhub-train --packing``'s batches (:meth:`PackedWindows.collate`: several windows, documents crossing
    their edges) carry their documents' sizes from the host: a training forward reads nothing back, and its loss
    is the loss of the same windows sized by a read (``position_ids`` alone)."""
    stream = TokenStream(random_ids(1, 60, seed=1)[0].numpy(), np.array([0, 7, 20, 22, 41, 60]))
    windows = PackedWindows(stream, 12)
    inputs = window_inputs(PackedWindows.collate([windows[i] for i in (3, 0, 2)]))
    assert inputs["cu_seq_lens_q"].tolist() == [0, 5, 12, 19, 24, 36] and inputs["max_length_q"] == 12
    model = causal_lm.train()
    assert _host_reads(model, **inputs) == []
    sized_by_a_read = {name: value for name, value in inputs.items() if name not in ("cu_seq_lens_q", "max_length_q")}
    scaled_close(model(**inputs).loss, model(**sized_by_a_read).loss, rel=MODEL_REL)


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


@pytest.mark.parametrize("mode", ["causal", "faithful"])
def test_a_serpent_training_forward_reads_nothing_back(mode, reads_not_free):
    """SeRpEnt's parallel forward and backward, as on an accelerator or under ``torch.compile`` (the grid padded to
    L slots, Δ's time lattice built on the device), read no value back: not Δ, not max L̄, not a mask's ``all()``;
    nor does a causal forward that continues a state (stateful training), whose rows reach different numbers of
    new grid points (all rows in one branch-Mamba call, no per-row loop over their counts)."""
    from ssmhub.layers import serpent

    torch.manual_seed(0)
    mixer = serpent.SerpentMixer(12, resampling_rates=[0.5, 0.2], resampling_window=3, num_distance_features=4,
                                 state_size=4, resampling_mode=mode)  # fmt: skip
    x = torch.randn(2, 9, 12, requires_grad=True)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :3] = False
    with _NoHostReads():
        y, state = mixer(x, mask, return_state=mode == "causal")
        if mode == "causal":
            more, _ = mixer(x[:, 2:7].flip(0) * 3, state=state, return_state=True)  # rows differ: other grid counts
            y = torch.cat([y, more], 1)
        y.square().sum().backward()
    assert x.grad.abs().sum() > 0 and mixer.resampled[0].ssm.log_grid_step.grad is not None
