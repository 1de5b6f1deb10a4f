"""Sliding-window perplexity against hand computations on a tiny DLR model."""

from __future__ import annotations

import math

import pytest
import torch
from comparisons import FP32_REL, MODEL_REL

import ssmhub
from ssmhub.evaluation import PerplexityResult, evaluate_perplexity, sliding_windows

VOCAB = 64


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = ssmhub.DLRConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, state_size=8)
    return ssmhub.DLRForCausalLM(config).eval()


def random_doc(length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def next_token_log_probs(model, context: torch.Tensor) -> torch.Tensor:
    """log p(. | context): the model's distribution after ``context``, in float32."""
    return torch.log_softmax(model(input_ids=context[None]).logits[0, -1].float(), dim=-1)


@torch.no_grad()
def direct(model, doc: torch.Tensor) -> tuple[float, int, int]:
    """NLL sum, top-1 and top-5 hits of one full-sequence forward pass over ``doc``."""
    logits = model(input_ids=doc[None]).logits[0, :-1].float()
    targets = doc[1:]
    nll = -torch.log_softmax(logits, -1).gather(-1, targets[:, None]).sum().item()
    top1 = int((logits.argmax(-1) == targets).sum())
    top5 = int((logits.topk(5, -1).indices == targets[:, None]).any(-1).sum())
    return nll, top1, top5


def test_windows_score_every_token_once():
    # stride < max_length: every token but the first, exactly once
    for length, max_length, stride in [(10, 4, 2), (11, 4, 3), (5, 8, 3), (16, 4, 1)]:
        scored = [p for _, end, first in sliding_windows(length, max_length, stride) for p in range(first, end)]
        assert scored == list(range(1, length))
    # stride == max_length: non-overlapping chunks, the first token of each chunk unscored
    assert sliding_windows(10, 4, 4) == [(0, 4, 1), (4, 8, 5), (8, 10, 9)]
    assert sliding_windows(9, 4, 4) == [(0, 4, 1), (4, 8, 5)]  # a lone last token scores nothing
    assert sliding_windows(1, 4, 2) == [] and sliding_windows(0, 4, 2) == []


@pytest.mark.parametrize(("max_length", "stride"), [(4, 0), (4, 5), (4, -1), (1, 1)])
def test_bad_window_arguments(model, max_length, stride):
    with pytest.raises(ValueError, match=r"stride|max_length"):
        evaluate_perplexity(model, [[1, 2, 3]], max_length, stride)


def test_one_window_equals_full_sequence_and_model_loss(model):
    doc = random_doc(23, seed=1)
    result = evaluate_perplexity(model, [doc], max_length=32, stride=16)
    nll, top1, top5 = direct(model, doc)
    assert result.num_tokens == 22 and result.num_documents == 1
    # the window is the whole document: the same forward, its NLLs summed two ways (FP32_REL); hits are argmax counts
    assert result.total_nll == pytest.approx(nll, rel=FP32_REL)
    assert (result.num_top1, result.num_top5) == (top1, top5)
    assert math.log(result.token_perplexity) == pytest.approx(nll / 22, rel=FP32_REL)
    assert result.top1_accuracy == top1 / 22  # the same count divided by the same count
    # the model's own (mean) loss over the same labels agrees
    with torch.no_grad():
        loss = model(input_ids=doc[None], labels=doc[None]).loss.item()
    assert result.nll_per_token == pytest.approx(loss, rel=FP32_REL)


def test_stride_equal_to_max_length_is_non_overlapping_chunks(model):
    doc = random_doc(30, seed=2)
    result = evaluate_perplexity(model, [doc], max_length=8, stride=8)
    chunks = [direct(model, chunk) for chunk in doc.split(8)]
    assert result.num_tokens == 7 + 7 + 7 + 5
    assert result.total_nll == pytest.approx(sum(c[0] for c in chunks), rel=FP32_REL)  # the same forwards, summed
    assert result.num_top1 == sum(c[1] for c in chunks)
    assert result.num_top5 == sum(c[2] for c in chunks)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_overlapping_windows_match_a_token_by_token_hand_computation(model, batch_size):
    doc, max_length, stride = random_doc(27, seed=3), 8, 3
    result = evaluate_perplexity(model, [doc], max_length=max_length, stride=stride, batch_size=batch_size)
    # Token p is scored by the first window (starting at k * stride) whose end passes p, with that
    # window's start as its context's start.
    nll, top1 = 0.0, 0
    for p in range(1, len(doc)):
        begin = next(k * stride for k in range(len(doc)) if min(k * stride + max_length, len(doc)) > p)
        log_probs = next_token_log_probs(model, doc[begin:p])
        nll -= log_probs[doc[p]].item()
        top1 += int(log_probs.argmax() == doc[p])
    assert result.num_tokens == len(doc) - 1
    assert result.total_nll == pytest.approx(nll, rel=MODEL_REL)  # a window and a shorter context: two computations
    assert result.num_top1 == top1  # argmax hits, as greedy tokens


def test_documents_do_not_share_context_and_word_perplexity(model):
    docs = [random_doc(13, seed=4), random_doc(1, seed=5), random_doc(20, seed=6)]
    result = evaluate_perplexity(model, iter(docs), max_length=6, stride=4, num_words=10)
    parts = [evaluate_perplexity(model, [d], max_length=6, stride=4) for d in docs]
    assert result.num_documents == 3
    assert result.num_tokens == 12 + 0 + 19 == sum(p.num_tokens for p in parts)
    # one window at a time either way: the same forwards, their float64 sums added in another order
    assert result.total_nll == pytest.approx(sum(p.total_nll for p in parts), rel=1e-9)
    assert result.word_perplexity == pytest.approx(math.exp(result.total_nll / 10))
    assert parts[0].word_perplexity is None


def test_empty_result_and_dict():
    result = PerplexityResult()
    assert math.isnan(result.token_perplexity) and result.word_perplexity is None
    assert set(result.to_dict()) >= {"total_nll", "num_tokens", "token_perplexity", "top5_accuracy"}


class FullLogitsOnly(torch.nn.Module):
    """A causal LM whose forward has no ``logits_to_keep``: every position's logits come back."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, use_cache=None):
        return self.inner(input_ids=input_ids, use_cache=use_cache)


def test_models_without_logits_to_keep_give_the_same_numbers(model):
    docs = [random_doc(29, seed=7)]
    kept = evaluate_perplexity(model, docs, max_length=8, stride=3, batch_size=2)
    full = evaluate_perplexity(FullLogitsOnly(model), docs, max_length=8, stride=3, batch_size=2)
    assert full.total_nll == pytest.approx(kept.total_nll, rel=FP32_REL)  # the head's matmul over more rows
    assert (full.num_tokens, full.num_top1, full.num_top5) == (kept.num_tokens, kept.num_top1, kept.num_top5)
