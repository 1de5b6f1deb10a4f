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


@pytest.mark.parametrize("name", SERVED)
def test_served_tokens_equal_generate(name, tmp_path):
    folder = save_folder(name, tmp_path / name)
    model = reference_model(name, folder)
    batch = prompts(len(LENGTHS), LENGTHS)
    crowd = prompts(31, [3, 20, 9, 50, 1], seed=1)
    with engine(folder) as llm:
        served = generate_ids(llm, batch, logprobs=1)
        alone = generate_ids(llm, batch[6:7])  # after the batch: its slot was used before, and starts clean
        among = generate_ids(llm, [*crowd[:15], batch[6], *crowd[15:]])[15]
    assert len(batch) > MAX_SEQS
    for prompt, output in zip(batch, served):
        tokens = list(output.outputs[0].token_ids)
        assert tokens == _generate_reference(model, prompt), (name, len(prompt))  # greedy ids: promised equal
        logprobs = torch.tensor([step[token].logprob for step, token in zip(output.outputs[0].logprobs, tokens)])
        torch.testing.assert_close(logprobs, _log_softmax_of(model, prompt, tokens), atol=LOGPROB_ATOL, rtol=0)
    # the same request alone and among 31 others: the same greedy ids (a request's tokens are its own)
    assert list(alone[0].outputs[0].token_ids) == list(served[6].outputs[0].token_ids)
    assert list(among.outputs[0].token_ids) == list(served[6].outputs[0].token_ids)


def test_an_option_it_cannot_serve_fails_at_engine_start(tmp_path):
    """A hybrid with a sliding attention window: refused when the engine builds the model, naming the option."""
    folder = save_folder("h3-hybrid", tmp_path / "windowed", attention_window=4)
    with pytest.raises(Exception, match="attention_window"), engine(folder):
        pass


@pytest.mark.parametrize("name", ["dlr", "mamba-transformers"])
def test_prefix_caching_of_an_attention_free_model_fails_at_engine_start(name, tmp_path):
    """``enable_prefix_caching=True`` (``--enable-prefix-caching``) on an attention-free folder: refused when the
    engine is created, naming the option (it used to start, then kill its worker at the first request)."""
    folder = save_folder(name, tmp_path / name)
    with pytest.raises(Exception, match="enable_prefix_caching"), engine(folder, enable_prefix_caching=True):
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
