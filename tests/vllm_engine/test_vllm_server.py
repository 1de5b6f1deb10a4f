"""vLLM's OpenAI-compatible server over an ssmhub folder, for real on 127.0.0.1, started by ``ssmhub-serve`` and
stopped by its process id; the ``openai`` client talks to it. Skipped where vLLM is not installed."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm")

import httpx
import openai
import torch

import ssmhub
from ssmhub.tokenization import PLAIN_CHAT_TEMPLATE, train_bpe_tokenizer

TEXTS = ["the cat sat on the mat .", "a dog ran in the park .", "the history of the world is long ."] * 20
START_TIMEOUT_S = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _folder(path: Path, chat_template: str | None) -> Path:
    torch.manual_seed(0)
    tokenizer = train_bpe_tokenizer(TEXTS, vocab_size=300, chat_template=chat_template)
    config = ssmhub.DLRConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, state_size=8,
                              pad_token_id=tokenizer.pad_token_id, eos_token_id=None, bos_token_id=None)  # fmt: skip
    ssmhub.DLRForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


class Server:
    """``ssmhub-serve FOLDER`` on 127.0.0.1 in a process group of its own, stopped by its process id."""

    def __init__(self, folder: Path, log: Path, options: tuple[str, ...] = ()):
        self.port = _free_port()
        command = [shutil.which("ssmhub-serve", path=os.path.dirname(sys.executable)), str(folder),
                   "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32", "--max-model-len", "128",
                   "--enforce-eager", "--max-num-batched-tokens", "16", "--served-model-name", "tiny",
                   *options]  # fmt: skip
        self.log = log.open("w")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise AssertionError(f"the server did not start in {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()


@contextlib.contextmanager
def _serving(root: Path, chat_template: str | None, options: tuple[str, ...] = ()):
    running = Server(_folder(root / "dlr", chat_template), root / "server.log", options)
    try:
        yield running
    finally:
        running.stop()


# the chat server keeps conversations' states (vLLM's prefix caching) and reports its hits in each answer's usage
CACHING = ("--enable-prefix-caching", "--enable-prompt-tokens-details")
BLOCK = 16  # vLLM's block on a CPU: where the states are checkpointed


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with _serving(tmp_path_factory.mktemp("served"), PLAIN_CHAT_TEMPLATE, CACHING) as running:
        yield running


@pytest.fixture(scope="module")
def server_without_template(tmp_path_factory):
    with _serving(tmp_path_factory.mktemp("served-plain"), None) as running:
        yield running


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_completions_plain_and_streamed(server):
    client = _client(server)
    plain = client.completions.create(model="tiny", prompt="the cat sat", max_tokens=6, temperature=0)
    assert plain.choices[0].finish_reason == "length" and plain.usage.completion_tokens == 6
    streamed = client.completions.create(model="tiny", prompt="the cat sat", max_tokens=6, temperature=0, stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed) == plain.choices[0].text  # greedy: the same tokens


def test_chat_completions_plain_and_streamed(server):
    client = _client(server)
    messages = [{"role": "user", "content": "the dog ran"}]
    plain = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0)
    streamed = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)
    assert plain.usage.completion_tokens == 5 and text == plain.choices[0].message.content


def test_a_conversations_second_turn_starts_from_the_first_turns_state(server):
    """An attention-free model served with --enable-prefix-caching: the second turn (the first turn's messages and
    answer, then a new message) finds the state checkpointed at the last block boundary the first turn reached,
    at most one block and the new message short of its prompt, and the server keeps serving."""
    client = _client(server)
    messages = [{"role": "user", "content": "the history of the world is long . the cat sat on the mat ."}]
    first = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "a dog ran in the park ."}]  # fmt: skip
    second = client.chat.completions.create(model="tiny", messages=messages, max_tokens=4, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens  # token counts: integers
    assert cached % BLOCK == 0 and cached >= first.usage.prompt_tokens // BLOCK * BLOCK > 0, (cached, first.usage)
    assert second.usage.completion_tokens == 4


def test_sampling_options(server):
    client = _client(server)
    sampling = {"max_tokens": 8, "temperature": 0.9, "top_p": 0.9, "seed": 7, "extra_body": {"top_k": 20}}
    seeded = [client.completions.create(model="tiny", prompt="a dog", **sampling).choices[0].text for _ in range(2)]
    assert seeded[0] == seeded[1]  # the same seed, the same sample
    many = client.completions.create(model="tiny", prompt="a dog", max_tokens=4, temperature=1.0, n=3, seed=3)
    assert len(many.choices) == 3  # parallel samples: each its own state, forked from one prompt
    probs = client.completions.create(model="tiny", prompt="a dog", max_tokens=3, temperature=0, logprobs=2)
    assert len(probs.choices[0].logprobs.token_logprobs) == 3
    greedy = client.completions.create(model="tiny", prompt="the", max_tokens=10, temperature=0).choices[0].text
    stop = greedy.strip()[-2:]
    assert len(stop) == 2, greedy
    stopped = client.completions.create(model="tiny", prompt="the", max_tokens=10, temperature=0, stop=[stop])
    assert stopped.choices[0].text == greedy[: greedy.index(stop)] and stopped.choices[0].finish_reason == "stop"


def test_a_bad_request_gets_an_http_error_and_the_next_is_served(server):
    client = _client(server)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="the cat " * 200, max_tokens=4)  # beyond max_model_len
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="the cat", max_tokens=4, temperature=-1.0)
    after = client.completions.create(model="tiny", prompt="the cat", max_tokens=3, temperature=0)
    assert after.usage.completion_tokens == 3


def test_chat_without_a_template_is_a_clear_error_and_completions_still_serve(server_without_template):
    client = _client(server_without_template)
    with pytest.raises(openai.BadRequestError, match="chat template"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert client.completions.create(model="tiny", prompt="the", max_tokens=2).usage.completion_tokens == 2
