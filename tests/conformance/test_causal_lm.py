"""Every family's causal LM behaves like a transformers model: caching, generation, padding, causality.

Checks that hold for every head (gradient checkpointing, half precision, saving) live in test_training.py,
test_precision.py and test_hub.py, where they run on the family's causal LM or, where it has none, its classifier.

Generated token ids are compared exactly (greedy and beam search choose them by argmax; sampling replays the same
computation from the same seed); logits computed two ways (cached steps and one forward, a padded batch and a row
alone) within float32 round-off of a whole model, ``MODEL_REL`` (tests/comparisons.py)."""

import pytest
import torch
from comparisons import FP32_REL, same_values, scaled_close
from conftest import random_ids
from transformers import pipeline

from ssmhub import RecurrentCache
from ssmhub.models.cache_argument import CACHE_FIELD


def test_cached_decoding_equals_full_forward(causal_lm):
    ids = random_ids(2, 20)
    full = causal_lm(ids).logits
    out = causal_lm(ids[:, :8], use_cache=True)
    cache = getattr(out, CACHE_FIELD)
    assert isinstance(cache, RecurrentCache) and cache.get_seq_length() == 8
    logits = [out.logits]
    for t in range(8, 20):
        out = causal_lm(ids[:, t : t + 1], cache=cache, use_cache=True)
        logits.append(out.logits)
    same_values(torch.cat(logits, 1), full, what="cached decoding's logits")
    assert cache.get_seq_length() == 20


def _layer_bytes(cache) -> list[int]:
    return [sum(t.numel() * t.element_size() for t in state.values()) for state in cache.layers]


def test_cache_memory_does_not_grow_with_context(causal_lm):
    """Recurrent layers hold a fixed-size state; attention layers of a hybrid (their state has "key")
    grow by exactly one key and value per token."""
    ids = random_ids(1, 64)
    cache = getattr(causal_lm(ids[:, :4], use_cache=True), CACHE_FIELD)
    before = _layer_bytes(cache)
    assert all(size > 0 for size in before)
    for t in range(4, 64):
        causal_lm(ids[:, t : t + 1], cache=cache, use_cache=True)
    for state, size_before, size_after in zip(cache.layers, before, _layer_bytes(cache)):
        if "key" in state:
            per_token = (state["key"][0, :, 0].numel() * 2) * state["key"].element_size() + 1
            assert size_after - size_before == 60 * per_token  # byte counts: integers
        else:
            assert size_after == size_before


def test_generate_equals_manual_greedy_loop(causal_lm):
    ids = random_ids(2, 6)
    generated = causal_lm.generate(ids, max_new_tokens=10, do_sample=False, pad_token_id=0)
    manual = ids
    for _ in range(10):  # no cache: the full forward each time
        next_token = causal_lm(manual, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        manual = torch.cat([manual, next_token], 1)
    assert torch.equal(generated, manual)  # greedy token ids: exact


def test_left_padded_batch_generates_what_each_row_gets_alone(causal_lm):
    rows = [random_ids(1, 9, seed=1)[0], random_ids(1, 4, seed=2)[0], random_ids(1, 6, seed=3)[0]]
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.cat([torch.zeros(width - len(r), dtype=torch.long), r]) for r in rows])
    mask = torch.stack([torch.cat([torch.zeros(width - len(r)), torch.ones(len(r))]) for r in rows]).long()
    batched = causal_lm.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    for i, row in enumerate(rows):
        alone = causal_lm.generate(row[None], max_new_tokens=8, do_sample=False, pad_token_id=0)
        # greedy token ids: exact
        assert torch.equal(batched[i, width:], alone[0, len(row) :]), f"row {i} differs when left-padded"
    # and the last-position logits of the padded forward match each row alone, within float32 round-off
    padded_logits = causal_lm(ids, attention_mask=mask).logits[:, -1]
    for i, row in enumerate(rows):
        same_values(padded_logits[i], causal_lm(row[None]).logits[0, -1], what=f"row {i}'s last logits")


def test_beam_search_reorders_the_cache(causal_lm):
    """Beam search with the cache must equal beam search recomputing everything: if beams were not
    reordered, the cached states would belong to the wrong hypotheses."""
    ids = random_ids(2, 5)
    kwargs = {"max_new_tokens": 8, "num_beams": 4, "do_sample": False, "pad_token_id": 0, "num_return_sequences": 2}
    cached = causal_lm.generate(ids, use_cache=True, **kwargs)
    uncached = causal_lm.generate(ids, use_cache=False, **kwargs)
    assert torch.equal(cached, uncached)  # token ids chosen by argmax over the beams' scores: exact


def test_sampling_is_reproducible(causal_lm):
    ids = random_ids(2, 5)
    torch.manual_seed(3)
    a = causal_lm.generate(ids, max_new_tokens=6, do_sample=True, top_k=10, pad_token_id=0)
    torch.manual_seed(3)
    b = causal_lm.generate(ids, max_new_tokens=6, do_sample=True, top_k=10, pad_token_id=0)
    assert torch.equal(a, b) and a.shape == (2, 11)  # token ids, the same computation from the same seed


def test_model_is_causal(causal_lm):
    """The gradient of output t with respect to input t+1 (and later) is zero, up to FFT round-off."""
    embeds = causal_lm.get_input_embeddings()(random_ids(1, 16)).detach().requires_grad_()
    logits = causal_lm(inputs_embeds=embeds).logits
    for t in (0, 7, 14):
        (grad,) = torch.autograd.grad(logits[0, t].square().sum(), embeds, retain_graph=True)
        # an FFT convolution's round-off reaches later positions: one op's, FP32_REL (measured: 8e-8 at most)
        assert grad[0, t + 1 :].abs().max() < FP32_REL * grad[0, : t + 1].abs().max()


def test_text_generation_pipeline(causal_lm):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(64)}
    vocab["[UNK]"] = 63
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="w0")
    generator = pipeline("text-generation", model=causal_lm, tokenizer=tokenizer)
    out = generator("w5 w9 w3", max_new_tokens=4, do_sample=False, return_tensors=True)
    token_ids = list(out[0]["generated_token_ids"])
    expected = causal_lm.generate(torch.tensor([[5, 9, 3]]), max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert token_ids == expected[0].tolist()  # greedy token ids: exact


def test_loss_matches_shifted_cross_entropy(causal_lm):
    ids = random_ids(2, 10)
    labels = ids.clone()
    labels[0, :3] = -100
    out = causal_lm(ids, labels=labels)
    expected = torch.nn.functional.cross_entropy(
        out.logits[:, :-1].reshape(-1, out.logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
    )
    scaled_close(out.loss, expected, rel=FP32_REL)  # one op (a cross-entropy) on the same logits


@pytest.mark.parametrize("logits_to_keep", [1, 3])
def test_logits_to_keep(causal_lm, logits_to_keep):
    ids = random_ids(2, 8)
    full = causal_lm(ids).logits
    kept = causal_lm(ids, logits_to_keep=logits_to_keep).logits
    same_values(kept, full[:, -logits_to_keep:], what="kept logits")


def test_generate_continues_from_a_returned_cache(causal_lm):
    """generate(..., return_dict_in_generate=True) hands back the cache; a second generate from it
    (given the full sequence so far) continues exactly where the first stopped."""
    ids = random_ids(2, 5)
    in_one_go = causal_lm.generate(ids, max_new_tokens=10, do_sample=False, pad_token_id=0)
    first = causal_lm.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0, return_dict_in_generate=True)
    returned = getattr(first, CACHE_FIELD)  # `cache` from transformers 5.24 on, `past_key_values` before
    assert returned.get_seq_length() == 5 + 3  # the last generated token is not fed yet
    second = causal_lm.generate(
        first.sequences, max_new_tokens=6, do_sample=False, pad_token_id=0, **{CACHE_FIELD: returned}
    )
    assert torch.equal(second, in_one_go)  # greedy token ids: exact


def test_the_cache_is_taken_under_either_name(causal_lm):
    """transformers 5.24 renamed `past_key_values` to `cache`; forward takes both, and not both at once."""
    ids = random_ids(1, 6)
    full = causal_lm(ids).logits
    for name in ("cache", "past_key_values"):
        cache = getattr(causal_lm(ids[:, :4], use_cache=True), CACHE_FIELD)
        steps = [causal_lm(ids[:, t : t + 1], use_cache=True, **{name: cache}).logits for t in (4, 5)]
        same_values(torch.cat(steps, 1), full[:, 4:], what=f"logits of steps given {name}")
    with pytest.raises(ValueError, match="once, as `cache` or as `past_key_values`"):
        causal_lm(ids[:, 4:5], cache=cache, past_key_values=cache)
