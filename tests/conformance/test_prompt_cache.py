"""Prompt caches that persist, every family with a causal LM: a prefilled document saved, loaded later and continued
gives exactly what continuing after re-prefilling gives (greedy, prompt lookup, assisted); forks are independent; a
cache loaded into another model, dtype or batch size is refused by name. The oracles compare greedy token ids, which
are exact."""

import pytest
import torch
from conftest import random_ids
from families import FAMILIES

import ssmhub
from ssmhub.models.cache_argument import CACHE_FIELD

DECODERS = [f for f in FAMILIES if f.causal_lm is not None]


def build(family, seed=0):
    torch.manual_seed(seed)
    return family.causal_lm(family.config()).eval()


def prefill(model, ids):
    return getattr(model(ids, use_cache=True), CACHE_FIELD)


@pytest.mark.parametrize("family", DECODERS, ids=lambda f: f.name)
@torch.no_grad()
def test_a_loaded_cache_continues_as_a_re_prefill(family, tmp_path):
    model = build(family)
    document, question = random_ids(2, 9), random_ids(2, 3, seed=1)
    prefill(model, document).save(tmp_path / "doc.safetensors", model)
    assert [p.name for p in tmp_path.iterdir()] == ["doc.safetensors"]  # written atomically, nothing left over
    loaded = ssmhub.RecurrentCache.load(tmp_path / "doc.safetensors", model, batch_size=2)
    prompt = torch.cat([document, question], 1)
    continued = model.generate(prompt, max_new_tokens=6, do_sample=False, **{CACHE_FIELD: loaded})
    re_prefilled = model.generate(prompt, max_new_tokens=6, do_sample=False, **{CACHE_FIELD: prefill(model, document)})
    assert torch.equal(continued, re_prefilled)  # greedy token ids: exact
    assert torch.equal(continued, model.generate(prompt, max_new_tokens=6, do_sample=False))


@pytest.mark.parametrize("family", DECODERS, ids=lambda f: f.name)
@torch.no_grad()
def test_lookup_and_assisted_decoding_continue_a_loaded_cache(family, tmp_path):
    """A prompt cache continued with prompt lookup or a draft gives plain greedy's tokens (the first verification
    feeds only the prompt's tokens the cache has not absorbed); batch 1, as transformers requires."""
    model, draft = build(family), build(family, seed=1)
    document = random_ids(1, 12)
    prompt = torch.cat([document, document[:, :4]], 1)  # a repeat: lookup has candidates to check
    prefill(model, document).save(tmp_path / "doc.safetensors", model)
    plain = model.generate(prompt, max_new_tokens=8, do_sample=False)
    for extra in ({"prompt_lookup_num_tokens": 3}, {"assistant_model": draft}):
        loaded = ssmhub.RecurrentCache.load(tmp_path / "doc.safetensors", model)
        out = model.generate(prompt, max_new_tokens=8, do_sample=False, **extra, **{CACHE_FIELD: loaded})
        assert torch.equal(out, plain), extra  # greedy token ids: exact


@torch.no_grad()
def test_forks_are_independent_continuations():
    model = build(DECODERS[0])
    document = random_ids(1, 8)
    cache = prefill(model, document)
    answers = []
    for seed in (1, 2):
        prompt = torch.cat([document, random_ids(1, 2, seed=seed)], 1)
        answers.append(model.generate(prompt, max_new_tokens=4, do_sample=False, **{CACHE_FIELD: cache.fork()}))
        assert torch.equal(answers[-1], model.generate(prompt, max_new_tokens=4, do_sample=False))  # token ids
    assert cache.get_seq_length() == 8


@torch.no_grad()
def test_a_cache_for_another_model_dtype_or_batch_is_refused(tmp_path):
    by_name = {f.name: f for f in FAMILIES}
    model = build(by_name["dlr"])
    path = tmp_path / "doc.safetensors"
    prefill(model, random_ids(2, 5)).save(path, model)
    others = {
        "model_type": build(by_name["h3"]),
        "config_hash": by_name["dlr"].causal_lm(by_name["dlr"].config(state_size=4)),
        "weights_fingerprint": build(by_name["dlr"], seed=1),
        "dtype": build(by_name["dlr"]).to(torch.float64),
    }
    for field, other in others.items():
        with pytest.raises(ValueError, match=field):
            ssmhub.RecurrentCache.load(path, other)
    with pytest.raises(ValueError, match="batch_size is 3"):
        ssmhub.RecurrentCache.load(path, model, batch_size=3)
    with pytest.raises(ValueError, match="cache is empty"):
        ssmhub.RecurrentCache(model.config.num_hidden_layers).save(path, model)
