"""Stateful (whole-document) perplexity: a document scored in windows that carry the recurrent cache gets the
numbers of one full-length forward pass, for every family of the conformance registry that has a causal LM."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

import ssmhub
from ssmhub.evaluation import POSITION_BUCKETS, evaluate_perplexity_stateful
from ssmhub.evaluation.scores import bucket_name

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
from comparisons import MODEL_REL, scaled_close
from families import FAMILIES

CAUSAL = [family for family in FAMILIES if family.causal_lm is not None]
DOC_LENGTH = 37  # 36 inputs: longer than H3's kernels (12, 16), so windows must carry its window of inputs
ATTENTION_WINDOW = 6  # hybrids: each token attends to its last 6 positions, full forward and stateful alike


def _model(family):
    overrides = {"attention_window": ATTENTION_WINDOW} if family.config().to_dict().get("attention_layers") else {}
    torch.manual_seed(0)
    return family.causal_lm(family.config(**overrides)).eval()


def _document(vocab_size: int, length: int = DOC_LENGTH, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, vocab_size, (length,), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def _full_forward_nll(model, doc: torch.Tensor) -> torch.Tensor:
    """(n − 1,) NLL of tokens 1..n−1 from one forward pass over the whole document, in float64."""
    logits = model(input_ids=doc[None], use_cache=False).logits[0, :-1].float()
    return -torch.log_softmax(logits, -1).gather(-1, doc[1:, None])[:, 0].double()


@pytest.mark.parametrize("max_length", [5, 16], ids=["windows-5", "windows-16"])
@pytest.mark.parametrize("family", CAUSAL, ids=[family.name for family in CAUSAL])
def test_stateful_score_equals_one_full_length_forward(family, max_length):
    """Windows of 5 (36 = 7·5 + 1) and 16 (16 + 16 + 4) split the document unevenly, some shorter than H3's
    kernel; one bucket per position gives each token's NLL, held to the full forward's to float32 round-off."""
    model = _model(family)
    doc = _document(model.config.vocab_size)
    expected = _full_forward_nll(model, doc)
    result = evaluate_perplexity_stateful(model, [doc], max_length, bucket_starts=range(DOC_LENGTH))
    per_token = torch.tensor([bucket.total_nll for bucket in result.by_position[1:]], dtype=torch.float64)
    assert [bucket.num_tokens for bucket in result.by_position] == [0] + [1] * (DOC_LENGTH - 1)
    # the model computed two ways (windows carrying the cache, one forward): a token's NLL moves by at most twice its
    # logits' round-off, MODEL_REL of the largest logit, which stays below the largest NLL (~log V) at initialization
    scaled_close(per_token, expected, rel=MODEL_REL, what="per-token NLL")
    assert result.num_tokens == DOC_LENGTH - 1 and result.num_documents == 1
    assert math.isclose(result.total_nll, expected.sum().item(), rel_tol=MODEL_REL)  # a sum of positive terms
    assert math.isclose(math.log(result.token_perplexity), expected.mean().item(), rel_tol=MODEL_REL)


def test_position_buckets_count_each_scored_token_once():
    """Positions are a token's index in its document (the tokens before it); position 0 is never scored; a
    bucket counts the documents that reach it; the buckets add up to the totals, which equal the sliding-window
    protocol's with one window per document (the same tokens, the same context)."""
    torch.manual_seed(0)
    model = ssmhub.DLRForCausalLM(ssmhub.DLRConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, state_size=4))
    docs = [_document(64, length, seed) for seed, length in enumerate([1, 2, 4, 5, 30])]
    result = evaluate_perplexity_stateful(model, docs, max_length=3, bucket_starts=(0, 4, 16))
    assert [b.num_tokens for b in result.by_position] == [0 + 1 + 3 + 3 + 3, 0 + 0 + 0 + 1 + 12, 14]
    assert [b.num_documents for b in result.by_position] == [4, 2, 1]
    assert result.num_documents == 5 and result.num_tokens == sum(length - 1 for length in [2, 4, 5, 30])
    assert math.isclose(sum(b.total_nll for b in result.by_position), result.total_nll, rel_tol=1e-12)
    assert sum(b.num_top5 for b in result.by_position) == result.num_top5
    windowed = ssmhub.evaluation.evaluate_perplexity(model, docs, max_length=30, stride=30, bucket_starts=(0, 4, 16))
    assert windowed.num_tokens == result.num_tokens
    assert math.isclose(windowed.total_nll, result.total_nll, rel_tol=MODEL_REL)  # the model computed two ways
    for mine, theirs in zip(windowed.by_position, result.by_position):
        assert (mine.num_tokens, mine.num_documents) == (theirs.num_tokens, theirs.num_documents)
        assert math.isclose(mine.total_nll, theirs.total_nll, rel_tol=MODEL_REL)
    names = [entry["positions"] for entry in result.to_dict()["by_position"]]
    assert names == ["0-4", "4-16", "16+"]


def test_default_buckets_are_named_and_split_at_1k():
    torch.manual_seed(0)
    model = ssmhub.DLRForCausalLM(ssmhub.DLRConfig(vocab_size=64, hidden_size=8, num_hidden_layers=1, state_size=4))
    result = evaluate_perplexity_stateful(model, [_document(64, 1500)], max_length=700)
    names = [bucket_name(begin, end) for begin, end in result.bucket_ranges()]
    assert result.bucket_starts == POSITION_BUCKETS and names == ["0-1K", "1K-4K", "4K-16K", "16K-64K", "64K+"]
    assert [b.num_tokens for b in result.by_position] == [1023, 476, 0, 0, 0]
    payload = result.to_dict()
    assert payload["by_position"][2]["token_perplexity"] != payload["by_position"][2]["token_perplexity"]  # NaN
    assert payload["by_position"][4]["end_position"] is None and "word_perplexity" not in payload["by_position"][0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"max_length": 0}, "max_length"), ({"max_length": 4, "bucket_starts": (1, 8)}, "bucket_starts")],
)
def test_bad_arguments_are_named(kwargs, message):
    model = ssmhub.DLRForCausalLM(ssmhub.DLRConfig(vocab_size=64, hidden_size=8, num_hidden_layers=1, state_size=4))
    with pytest.raises(ValueError, match=message):
        evaluate_perplexity_stateful(model, [[1, 2, 3]], **kwargs)
