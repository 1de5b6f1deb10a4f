"""``evaluate_perplexity_stateful`` refuses, before any work, a model whose cache would grow with the document:
the same check as ``ssmhub-eval --stateful``, in the words of the Python function."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import ssmhub
from ssmhub.evaluation import evaluate_perplexity_stateful

HYBRID = {"vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 2, "attention_layers": [1], "max_kernel_length": 8}


class _NoDocuments:
    """Documents that fail when read: a refusal must come before any document is touched."""

    def __iter__(self):
        raise AssertionError("a document was read before the model was checked")


def test_a_hybrid_without_an_attention_window_is_refused_by_name():
    model = ssmhub.H3ForCausalLM(ssmhub.H3Config(**HYBRID, num_attention_heads=2))
    with pytest.raises(ValueError, match=r"evaluate_perplexity_stateful: .* attention layers \[1\].*attention_window"):
        evaluate_perplexity_stateful(model, _NoDocuments(), max_length=8)


def test_a_transformers_model_is_refused_by_name():
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match=r"evaluate_perplexity_stateful needs an ssmhub recurrent model .* 'gpt2'"):
        evaluate_perplexity_stateful(model, _NoDocuments(), max_length=8)


def test_a_hybrid_with_a_sliding_window_is_scored():
    torch.manual_seed(0)
    model = ssmhub.H3ForCausalLM(ssmhub.H3Config(**HYBRID, num_attention_heads=2, attention_window=4))
    result = evaluate_perplexity_stateful(model, [list(range(1, 20))], max_length=8)
    assert result.to_dict()["num_tokens"] == 18
