"""Rollback, assisted and prompt-lookup decoding, for every family with a causal LM (and H3 distilled).

Oracles: after a recording forward of k tokens, ``cache.crop`` returns to the state after any of them, equal within
float32 round-off to a cache fed only those tokens (the crop replays them in one forward from the states before the
recorded forward, or, in assisted decoding, the next forward runs them ahead of its own; the references feed them
likewise, but in forwards of their own, whose kernels may round otherwise: ``same_states``, ``MODEL_REL``); greedy
assisted decoding (every draft rejected, all accepted, a draft of another family) and prompt lookup give plain greedy
decoding's tokens, one for one (token ids: exact)."""

import copy

import pytest
import torch
from comparisons import same_states, same_values
from conftest import random_ids
from families import FAMILIES
from torch import nn

import ssmhub
from ssmhub.models.cache_argument import CACHE_FIELD
from ssmhub.models.generation import record_for_assisted_decoding

DECODERS = [f for f in FAMILIES if f.causal_lm is not None]


def build(family, seed=0):
    torch.manual_seed(seed)
    model = family.causal_lm(family.config()).eval()
    if family.name == "h3-distilled":
        model.distill_for_decoding(2)
    return model


DISTILLED = next(f for f in FAMILIES if f.name == "h3")
DISTILLED = type(DISTILLED)("h3-distilled", DISTILLED.config_class, DISTILLED.config_kwargs, DISTILLED.causal_lm)


@pytest.fixture(params=[*DECODERS, DISTILLED], ids=lambda f: f.name)
def decoder(request):
    return request.param


def states(cache):
    return [None if s is None else {k: v.clone() for k, v in s.items()} for s in cache.layers]


def fed_only(model, ids, start, stop):
    """A cache that absorbed ids[:, :start] in one forward, then ids[:, start:stop] in another (if any)."""
    cache = getattr(model(ids[:, :start], use_cache=True), CACHE_FIELD)
    if stop > start:
        model(ids[:, start:stop], cache=cache, use_cache=True)
    return cache


@torch.no_grad()
def test_rollback_equals_a_cache_fed_only_the_kept_tokens(decoder):
    """After a recording forward of k = 5 tokens, a crop to any of them (or back before them all) leaves the
    cache, and the next token's logits, equal within float32 round-off to a cache fed only the kept tokens;
    batch of 2."""
    model = build(decoder)
    ids = random_ids(2, 14)
    prompt, k = 8, 5
    for kept in range(k + 1):
        cache = getattr(model(ids[:, :prompt], use_cache=True), CACHE_FIELD)
        cache.activate_past_recording()
        model(ids[:, prompt : prompt + k], cache=cache, use_cache=True)
        cache.crop(-(k - kept))
        reference = fed_only(model, ids, prompt, prompt + kept)
        same_states(cache, reference)
        nxt = ids[:, prompt + kept : prompt + kept + 1]
        got = model(nxt, cache=cache, use_cache=True).logits
        same_values(got, model(nxt, cache=reference, use_cache=True).logits, what="the next token's logits")


@torch.no_grad()
def test_rollback_within_a_first_forward(decoder):
    """A verifier's first forward (prompt and drafts at once, logits_to_keep = drafts + 1) runs the prompt as an
    ordinary forward and keeps just the states to drop every draft; a crop further back names tokens_to_remove."""
    model = build(decoder)
    ids = random_ids(2, 12)
    drafts, prompt = 3, 9
    for kept in range(drafts + 1):
        cache = ssmhub.RecurrentCache(model.config.num_hidden_layers)
        cache.activate_past_recording()
        model(ids, cache=cache, use_cache=True, logits_to_keep=drafts + 1)
        assert cache.rollback_lengths() == list(range(prompt, 13))  # integers
        cache.crop(-(drafts - kept))
        same_states(cache, fed_only(model, ids, prompt, prompt + kept))
    with pytest.raises(ValueError, match="tokens_to_remove=-4"):
        cache.activate_past_recording()
        model(ids[:, :1], cache=cache, use_cache=True)  # a one-token forward keeps the state before it
        cache.crop(-1)
        model(ids, cache=cache, use_cache=True, logits_to_keep=drafts + 1)
        cache.crop(-4)


@torch.no_grad()
def test_the_next_forward_absorbs_a_crop_replay(decoder):
    """In assisted decoding a crop's replay waits for the next forward, which runs the kept tokens ahead of its own
    in one pass (each layer called once): its logits and the cache then equal, within float32 round-off, those of
    a cache fed the kept and the new tokens in one forward (a crop outside it replays at once, as in the rollback
    test above)."""
    model = build(decoder)
    ids = random_ids(2, 16)
    prompt, k, new = 8, 5, 3
    for kept in (1, 2, k - 1):  # a crop that keeps some tokens and drops others
        cache = getattr(model(ids[:, :prompt], use_cache=True), CACHE_FIELD)
        record_for_assisted_decoding(cache)  # as generate does for assisted decoding
        model(ids[:, prompt : prompt + k], cache=cache, use_cache=True)
        first_layer = _CountForwards(model.backbone.layers[0])
        cache.crop(-(k - kept))
        assert cache.get_seq_length() == prompt + kept
        got = model(ids[:, prompt + kept : prompt + kept + new], cache=cache, use_cache=True).logits
        first_layer.handle.remove()
        assert first_layer.count == 1 and got.shape[1] == new
        reference = getattr(model(ids[:, :prompt], use_cache=True), CACHE_FIELD)
        want = model(ids[:, prompt : prompt + kept + new], cache=reference, use_cache=True).logits[:, kept:]
        same_values(got, want, what="logits after the replay")
        same_states(cache, reference)


@torch.no_grad()
def test_ordinary_decoding_keeps_no_snapshots(decoder):
    """Snapshots only while assisted decoding records: plain generate and forwards keep none, and a verifier's
    cache stops recording when generate returns."""
    model = build(decoder)
    ids = random_ids(1, 6)
    out = model.generate(ids, max_new_tokens=4, do_sample=False, return_dict_in_generate=True)
    cache = getattr(out, CACHE_FIELD)
    assert not cache.record_past and cache.snapshot_bytes() == 0 and cache.rollback_lengths() == [9]
    out = model.generate(
        ids, max_new_tokens=4, do_sample=False, prompt_lookup_num_tokens=2, return_dict_in_generate=True
    )
    cache = getattr(out, CACHE_FIELD)
    assert not cache.record_past and cache.snapshot_bytes() == 0
    model(ids[:, :1], cache=cache, use_cache=True)
    assert cache.rollback_lengths() == [cache.get_seq_length()]


class _CountForwards:
    def __init__(self, model):
        self.count = 0
        self.handle = model.register_forward_pre_hook(self)

    def __call__(self, module, args):
        self.count += 1


def greedy(model, ids, **kwargs):
    return model.generate(ids, max_new_tokens=12, do_sample=False, **kwargs)


def fixed_drafts(assistant, count):
    """Make ``assistant`` draft exactly ``count`` tokens a round (no schedule, no confidence cut-off)."""
    config = assistant.generation_config
    config.num_assistant_tokens_schedule, config.num_assistant_tokens = "constant", count
    config.assistant_confidence_threshold = 0.0
    return assistant


def contrary(model):
    """An assistant that always proposes the token the model ranks last: every draft token is rejected."""
    draft = copy.deepcopy(model)
    draft.lm_head = nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=False)
    draft.lm_head.weight.data = -model.get_output_embeddings().weight.detach().clone()
    return draft


@torch.no_grad()
def test_assisted_greedy_equals_greedy(decoder):
    """Greedy assisted decoding gives plain greedy's tokens when every draft is rejected (12 verifier forwards
    for 12 tokens), when all are accepted (an exact copy as assistant: 3 forwards of 4 drafts + 1), and with a
    draft of its own family with other weights."""
    model = build(decoder)
    ids = random_ids(1, 7)
    plain = greedy(model, ids)
    for assistant, forwards in ((contrary(model), 12), (copy.deepcopy(model), 3), (build(decoder, seed=1), None)):
        fixed_drafts(assistant, 4)
        counter = _CountForwards(model)
        assert torch.equal(greedy(model, ids, assistant_model=assistant), plain)  # greedy token ids: exact
        counter.handle.remove()
        if forwards is not None:
            assert counter.count == forwards


@torch.no_grad()
def test_prompt_lookup_equals_greedy(decoder):
    """Prompt lookup on a prompt that repeats itself (so candidates are found) gives greedy's tokens."""
    model = build(decoder)
    ids = random_ids(1, 5).repeat(1, 3)
    assert torch.equal(greedy(model, ids, prompt_lookup_num_tokens=3), greedy(model, ids))  # greedy token ids
    continuation = greedy(model, ids)[:, 15:]
    echo = torch.cat([ids, continuation[:, :6], ids, continuation[:, :3]], 1)  # the next tokens are in the prompt
    assert torch.equal(greedy(model, echo, prompt_lookup_num_tokens=4), greedy(model, echo))  # greedy token ids


@torch.no_grad()
def test_assisted_and_lookup_sampling(decoder):
    """Sampling with an assistant (speculative sampling) or prompt lookup runs to the requested length, and is
    reproducible under a seed."""
    model = build(decoder)
    ids = random_ids(1, 6).repeat(1, 2)
    for extra in ({"assistant_model": build(decoder, seed=1)}, {"prompt_lookup_num_tokens": 2}):
        runs = []
        for _ in range(2):
            torch.manual_seed(3)
            runs.append(model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=True, **extra))
        # sampled token ids of the same computation run twice from the same seed: exact
        assert runs[0].shape == (1, 20) and torch.equal(runs[0], runs[1])


@torch.no_grad()
def test_a_draft_of_another_family():
    """A DLR draft for an H3 target (sharing the vocabulary) gives the H3 model's greedy tokens."""
    by_name = {f.name: f for f in FAMILIES}
    target, draft = build(by_name["h3-hybrid"]), build(by_name["dlr"])
    ids = random_ids(1, 6)
    assert torch.equal(greedy(target, ids, assistant_model=draft), greedy(target, ids))  # greedy token ids: exact


@pytest.mark.parametrize("value", [0, -2, 1.5])
def test_prompt_lookup_needs_a_positive_count(value):
    model = build(DECODERS[0])
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens"):
        model.generate(random_ids(1, 4), max_new_tokens=3, prompt_lookup_num_tokens=value)


def test_an_assistant_with_another_vocabulary_is_refused():
    model = build(DECODERS[0])
    torch.manual_seed(0)
    other = DECODERS[0].causal_lm(DECODERS[0].config(vocab_size=80)).eval()
    with pytest.raises(ValueError, match="assistant_model has a vocabulary of 80"):
        model.generate(random_ids(1, 4), max_new_tokens=3, assistant_model=other)
