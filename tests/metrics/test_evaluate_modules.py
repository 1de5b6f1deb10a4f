"""The ``evaluate`` modules shipped in ssmhub.metrics: they load from the package with no network, give the
hand-computed values, pool batches exactly, and agree with ``ssmhub-eval``'s sums on a real model."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

import ssmhub
from ssmhub.evaluation import evaluate_perplexity
from ssmhub.metrics import METRIC_NAMES, load_metric, metric_path


def test_every_module_loads_offline_from_the_package():
    script = (
        "from ssmhub.metrics import METRIC_NAMES, load_metric\n"
        "for name in METRIC_NAMES: load_metric(name)\n"
        "load_metric('listops_accuracy', 'subtrees')\nprint('ok')"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_EVALUATE_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
    assert all(os.path.isfile(os.path.join(metric_path(name), f"{name}.py")) for name in METRIC_NAMES)


def test_unknown_metric_is_refused_by_name():
    with pytest.raises(ValueError, match="name must be one of"):
        metric_path("perplexity")
    with pytest.raises(ValueError, match="config_name"):
        load_metric("listops_accuracy", "sub_trees")


def test_nll_perplexity_pools_sums_not_rows():
    metric = load_metric("nll_perplexity")
    metric.add_batch(nll_sums=[1.0], num_tokens=[1])
    metric.add_batch(nll_sums=[9.0, 2.0], num_tokens=[3, 1])
    result = metric.compute(num_words=4)
    assert result["nll_per_token"] == pytest.approx(12.0 / 5)
    assert result["token_perplexity"] == pytest.approx(math.exp(12.0 / 5))
    assert result["word_perplexity"] == pytest.approx(math.exp(12.0 / 4))
    assert "word_perplexity" not in load_metric("nll_perplexity").compute(nll_sums=[1.0], num_tokens=[2])


def test_top_k_and_last_token_and_listops_by_hand():
    top_k = load_metric("top_k_accuracy").compute(
        predictions=[[3, 1, 0], [2, 0, 1], [5, 6, 7]], references=[1, 1, -100], k=[1, 2, 3]
    )
    assert top_k == {"top_1_accuracy": 0.0, "top_2_accuracy": 0.5, "top_3_accuracy": 1.0, "num_scored": 2}
    last = load_metric("last_token_accuracy").compute(
        predictions=[[1, 2, 3], [0, 4]], references=[[1, 2, -100], [-100, 5]]
    )
    assert last == {"last_token_accuracy": 0.5}
    listops = load_metric("listops_accuracy").compute(predictions=[3, 9, 0], references=[3, 1, 0])
    assert listops == {"accuracy": pytest.approx(2 / 3), "num_scored": 3}
    tags = load_metric("listops_accuracy", "subtrees").compute(
        predictions=[[7, 0, 6], [1]], references=[[-100, 0, 5], [1]]
    )
    assert tags == {"accuracy": pytest.approx(2 / 3), "num_scored": 3}


def test_nll_perplexity_matches_ssmhub_eval_sums():
    """The module fed per-document NLL sums gives ssmhub-eval's token perplexity of the same documents."""
    torch.manual_seed(0)
    config = ssmhub.DLRConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, state_size=4)
    model = ssmhub.DLRForCausalLM(config).eval()
    documents = [torch.randint(0, 32, (n,)) for n in (9, 14)]
    per_document = [evaluate_perplexity(model, [doc], max_length=16) for doc in documents]
    together = evaluate_perplexity(model, documents, max_length=16, num_words=10)
    metric = load_metric("nll_perplexity")
    result = metric.compute(
        nll_sums=[r.total_nll for r in per_document], num_tokens=[r.num_tokens for r in per_document], num_words=10
    )
    assert result["token_perplexity"] == pytest.approx(together.token_perplexity, rel=1e-9)
    assert result["word_perplexity"] == pytest.approx(together.word_perplexity, rel=1e-9)
