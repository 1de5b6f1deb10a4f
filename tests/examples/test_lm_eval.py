"""lm-evaluation-harness on a saved ssmhub folder (``--model hf``, ``trust_remote_code=True``), offline, on a
local perplexity task: its log-likelihoods are ssmhub's own sliding-window NLL of the same tokens.

The oracle is :func:`ssmhub.evaluation.evaluate_perplexity` (transformers' strided protocol, which never
scores a document's first token) run on ``[prefix] + tokens`` with windows of ``max_length + 1`` tokens
advancing by ``max_length``: that scores every token of the document once, each window from a fresh
state, which is what lm-eval's ``loglikelihood_rolling`` does with its ``max_length`` (the prefix token
is the tokenizer's BOS, else EOS). Documents whose token count is a multiple of ``max_length`` keep the
two protocols window for window (lm-eval re-reads up to ``max_length`` tokens of left context for a
shorter last window; transformers' protocol does not).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from comparisons import MODEL_REL
from transformers import AutoModelForCausalLM, AutoTokenizer

from ssmhub.evaluation import evaluate_perplexity

TASK = "ssmhub_local_ppl"
TASK_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
metadata:
  version: 1.0
"""
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
WINDOW = 4  # a short max_length: documents span several windows


def _documents(tokenizer, count: int = 4) -> list[str]:
    """Texts of at least 3 windows whose token count is a multiple of WINDOW, from the tiny corpus's words."""
    words = "the cat sat on the mat and the dog sat on the log a long sequence model reads the book".split()
    texts = []
    for first in range(0, 3 * count, 3):
        chosen = words[first:] + words
        lengths = (len(tokenizer(" ".join(chosen[:n]))["input_ids"]) for n in range(1, len(chosen) + 1))
        n = next(n for n, length in enumerate(lengths, 1) if length >= 3 * WINDOW and length % WINDOW == 0)
        texts.append(" ".join(chosen[:n]))
    return texts


@pytest.fixture(scope="module")
def local_task(tmp_path_factory, tiny_lm):
    """A folder with the task YAML over a local jsonl of documents; and the documents."""
    folder = tmp_path_factory.mktemp("lm-eval-task")
    texts = _documents(AutoTokenizer.from_pretrained(tiny_lm))
    data = folder / "documents.jsonl"
    data.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    (folder / f"{TASK}.yaml").write_text(TASK_YAML.format(task=TASK, data=data), encoding="utf-8")
    return folder, texts


def _ssmhub_nll(folder, texts: list[str], max_length: int) -> list[float]:
    """Each document's summed NLL (nats) by ssmhub's sliding-window evaluation, as lm-eval windows it."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    nll = []
    for text in texts:
        ids = [prefix, *tokenizer(text, add_special_tokens=False)["input_ids"]]
        with torch.no_grad():
            nll.append(evaluate_perplexity(model, [ids], max_length=max_length + 1, stride=max_length).total_nll)
    return nll


@pytest.mark.parametrize("max_length", [WINDOW, 2048])
def test_lm_eval_loglikelihoods_are_ssmhubs_nll(tiny_lm, local_task, max_length, monkeypatch):
    for name, value in OFFLINE.items():
        monkeypatch.setenv(name, value)
    import lm_eval
    from lm_eval.tasks import TaskManager

    folder, texts = local_task
    results = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={tiny_lm},trust_remote_code=True,max_length={max_length}",
        tasks=[TASK],
        task_manager=TaskManager(include_path=str(folder), include_defaults=False),
        device="cpu",
        batch_size=2,
        log_samples=True,
    )
    samples = sorted(results["samples"][TASK], key=lambda sample: sample["doc_id"])
    loglikelihoods = [sample["word_perplexity"][0] for sample in samples]
    expected = _ssmhub_nll(tiny_lm, texts, max_length)
    # lm-eval's batches and ssmhub's windows: the model computed two ways, each NLL to twice its logits' round-off
    # (MODEL_REL of the largest logit, below the NLL of a token at initialization)
    assert [-ll for ll in loglikelihoods] == pytest.approx(expected, rel=MODEL_REL)
    words = sum(len(text.split()) for text in texts)
    measured = results["results"][TASK]["word_perplexity,none"]
    assert math.log(measured) * words == pytest.approx(sum(expected), rel=MODEL_REL)  # exp(NLL / words)


@pytest.mark.slow
def test_lm_eval_command_line_on_a_saved_folder(tiny_lm, local_task, tmp_path):
    """The README's command, in a fresh process that loads the folder's own code (trust_remote_code)."""
    folder, texts = local_task
    command = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
               f"pretrained={tiny_lm},trust_remote_code=True", "--tasks", TASK, "--include_path", str(folder),
               "--device", "cpu", "--batch_size", "2", "--output_path", str(tmp_path / "out")]  # fmt: skip
    env = {**os.environ, **OFFLINE, "HF_HOME": str(tmp_path / "hf")}
    subprocess.run(command, check=True, env=env, cwd=tmp_path, capture_output=True, timeout=300)
    (results_file,) = (tmp_path / "out").rglob("results_*.json")
    measured = json.loads(results_file.read_text())["results"][TASK]["word_perplexity,none"]
    words = sum(len(text.split()) for text in texts)
    assert math.log(measured) * words == pytest.approx(sum(_ssmhub_nll(tiny_lm, texts, 2048)), rel=MODEL_REL)
