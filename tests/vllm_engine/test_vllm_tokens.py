"""Every family served by real vLLM (CPU build): greedy ids equal ``generate``'s, neighbours change nothing, logprobs
equal the model's log-softmax. Runs in ``make test-vllm``'s environment; skipped where vLLM is not installed."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from served_folders import CHUNK, MAX_SEQS, SERVED, engine, generate_ids, prompts, reference_model, save_folder

NEW_TOKENS = 8
# 1 token to several times the prefill chunk; 12 requests, more than MAX_SEQS, so some wait in the queue
LENGTHS = [1, 2, 5, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5, 7, 1, 40, 11, 4 * CHUNK]
# logprobs: float32 log-softmax over 64 logits computed two ways (a tiny model's forward in chunks vs whole, see
# tests/comparisons.py's MODEL_REL: 2e-4 of max|logit|, logits here of magnitude ≲ 5): 1e-3 absolute
LOGPROB_ATOL = 1e-3


def _generate_reference(model, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, len(prompt) :].tolist()


def _reference_logits(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The transformers model's logits before each of ``tokens`` (teacher-forced on them), (len(tokens), vocab)."""
    with torch.no_grad():
        return model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()


def _log_softmax_of(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """log p(token_t | prompt, tokens_<t) of each generated token, from one full forward of the transformers model."""
    return _reference_logits(model, prompt, tokens).log_softmax(-1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


# every family with vLLM's prefix caching on (its "align" mode), and three without it, vLLM's default
CASES = [pytest.param(name, True, id=name) for name in SERVED] + [
    pytest.param(name, False, id=f"{name}-uncached") for name in ("dlr", "serpent-mamba", "h3-hybrid")
]


def _hit(tokens_before: int, prompt: int, block: int) -> int:
    """The tokens a prompt of ``prompt`` tokens finds cached when ``tokens_before`` of them were fed to the model by
    an earlier request: the last block boundary of both (a checkpoint at each; one token is always computed)."""
    return min(tokens_before, prompt - 1) // block * block


@pytest.mark.parametrize("name, prefix_caching", CASES)
def test_served_tokens_equal_generate(name, prefix_caching, tmp_path):
    """Greedy ids equal ``generate``'s and logprobs the model's log-softmax, with chunked prefill and queueing; the
    same request alone and among 31 others gives the same ids. With prefix caching, a repeated prompt, a prompt
    sharing a prefix and a conversation's second turn (the first turn's prompt and answer, then new tokens) find
    their checkpoints, in one batch with misses, as many tokens as the block boundaries promise (vLLM's own count,
    ``num_cached_tokens``), and decode as the uncached model does."""
    folder = save_folder(name, tmp_path / name)
    model = reference_model(name, folder)
    batch = prompts(len(LENGTHS), LENGTHS)
    crowd = prompts(31, [3, 20, 9, 50, 1], seed=1)
    with engine(folder, enable_prefix_caching=prefix_caching, max_model_len=512) as llm:
        # the block of the cache's hashes: 16 tokens for an attention-free model (ssmhub's config hook makes it
        # the state block), a hybrid's attention block (128 on a CPU) where it is larger
        block = llm.llm_engine.vllm_config.cache_config.block_size if prefix_caching else 16
        turn1 = prompts(1, [3 * block - 2], seed=2)[0]  # its answer crosses the block boundary at 3 blocks
        served = generate_ids(llm, [*batch, turn1], logprobs=1)
        turn2 = turn1 + list(served[-1].outputs[0].token_ids) + prompts(1, [5], seed=3)[0]
        sibling = batch[6][: 2 * block + 3] + prompts(1, [4], seed=4)[0]  # a shared prefix, then its own tokens
        second = [batch[6], turn2, sibling, *prompts(2, [9, 30], seed=5)]  # hits and misses in one batch
        again = generate_ids(llm, second)
        among = generate_ids(llm, [*crowd[:15], batch[6], *crowd[15:]])[15]
    assert len(batch) > MAX_SEQS
    for prompt, output in zip([*batch, turn1], served):
        tokens = list(output.outputs[0].token_ids)
        assert tokens == _generate_reference(model, prompt), (name, len(prompt))  # greedy ids: promised equal
        logprobs = torch.tensor([step[token].logprob for step, token in zip(output.outputs[0].logprobs, tokens)])
        torch.testing.assert_close(logprobs, _log_softmax_of(model, prompt, tokens), atol=LOGPROB_ATOL, rtol=0)
    for prompt, output in zip(second, again):
        assert list(output.outputs[0].token_ids) == _generate_reference(model, prompt), (name, len(prompt))
    # the same request alone and among 31 others: the same greedy ids (a request's tokens are its own)
    assert list(again[0].outputs[0].token_ids) == list(served[6].outputs[0].token_ids)
    assert list(among.outputs[0].token_ids) == list(served[6].outputs[0].token_ids)
    if prefix_caching:  # token counts: integers
        fed = len(turn1) + NEW_TOKENS - 1  # the first turn's prompt and answer but its last token
        expected = [_hit(len(batch[6]), len(batch[6]), block), _hit(fed, len(turn2), block),
                    _hit(2 * block + 3, len(sibling), block), 0, 0]  # fmt: skip
        assert [o.num_cached_tokens for o in again] == expected, name
        assert expected[1] == 3 * block  # the answer's own checkpoint, past the first turn's prompt
    else:
        assert all(not o.num_cached_tokens for o in again)


def test_an_option_it_cannot_serve_fails_at_engine_start(tmp_path):
    """A hybrid with a sliding attention window: refused when the engine builds the model, naming the option."""
    folder = save_folder("h3-hybrid", tmp_path / "windowed", attention_window=4)
    with pytest.raises(Exception, match="attention_window"), engine(folder):
        pass


@pytest.mark.parametrize("name", ["dlr", "serpent"])
def test_a_compiled_engine_serves_the_same_model(name, tmp_path):
    """vLLM's default compilation (not ``enforce_eager``) compiles each mixer's decode step: not the same float
    operations as eager, so each greedy token must be the reference's argmax up to the logprob tolerance (a near tie
    may go either way) and its logprob the reference's log-softmax, teacher-forced on the served tokens."""
    folder = save_folder(name, tmp_path / name)
    model = reference_model(name, folder)
    batch = prompts(len(LENGTHS), LENGTHS)
    with engine(folder, enforce_eager=False) as llm:
        served = generate_ids(llm, batch, logprobs=1)
    for prompt, output in zip(batch, served):
        tokens = list(output.outputs[0].token_ids)
        reference = _reference_logits(model, prompt, tokens).log_softmax(-1)  # (NEW_TOKENS, vocab)
        chosen = reference.gather(1, torch.tensor(tokens)[:, None])[:, 0]
        assert bool((chosen >= reference.max(-1).values - LOGPROB_ATOL).all()), (name, len(prompt))
        logprobs = torch.tensor([step[token].logprob for step, token in zip(output.outputs[0].logprobs, tokens)])
        torch.testing.assert_close(logprobs, chosen, atol=LOGPROB_ATOL, rtol=0)


# bfloat16: each logit is its float32 value to within 4 bfloat16 round-offs (u = 2^-8) of max|logits|
# (tests/conformance/test_precision.py's bound, measured there), so two bfloat16 computations of it (vLLM's, in
# chunks and steps on its GEMM; generate's model, in one forward) differ by at most 8u of max|logits|, and a
# log-softmax (a logit minus a log-sum-exp, each off by that much) by twice that
BF16_UNIT_ROUNDOFF = 2.0**-8


@pytest.mark.parametrize("name", ["dlr", "serpent-mamba", "h3-ssm", "h3-hybrid", "bdlrnn"])
def test_bfloat16_serving_keeps_the_recurrence_in_float32(name, tmp_path):
    """Served in bfloat16 (vLLM's CPU default), a model computes what ``from_pretrained(dtype=torch.bfloat16)``
    computes, its recurrence in float32 (the served model's parameters: tests/serving/test_servable.py): logprobs
    within bfloat16's tolerance of that model's log-softmax, greedy ids its argmax wherever the top two logprobs are
    further apart than the tolerance."""
    folder = save_folder(name, tmp_path / name)
    reference = reference_model(name, folder).to(torch.bfloat16)
    batch = prompts(6, [1, 5, CHUNK + 3, 40, 9, 2 * CHUNK])
    with engine(folder, dtype="bfloat16") as llm:
        served = generate_ids(llm, batch, logprobs=1)
    for prompt, output in zip(batch, served):
        tokens = list(output.outputs[0].token_ids)
        logits = _reference_logits(reference, prompt, tokens)  # (NEW_TOKENS, vocab) float32 of bfloat16 values
        tolerance = 2 * 8 * BF16_UNIT_ROUNDOFF * logits.abs().max().item()
        log_probs = logits.log_softmax(-1)
        logprobs = torch.tensor([step[token].logprob for step, token in zip(output.outputs[0].logprobs, tokens)])
        chosen = log_probs.gather(1, torch.tensor(tokens)[:, None])[:, 0]
        torch.testing.assert_close(logprobs, chosen, atol=tolerance, rtol=0)
        top2 = log_probs.topk(2, dim=-1).values  # (NEW_TOKENS, 2)
        clear = top2[:, 0] - top2[:, 1] > tolerance
        assert torch.equal(torch.tensor(tokens)[clear], log_probs.argmax(-1)[clear]), (name, len(prompt))
