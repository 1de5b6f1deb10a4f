"""One engine's decode step against its byte floor, measured in the process that runs it (``benchmarks/serving.py
--step-floor``; issue 71).

* **Step**: an in-process vLLM engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) is given ``rows`` requests, stepped
  through their prefill, then timed step by step while every request decodes: the median ``engine.step()`` is the
  time one output token of every request costs (scheduler, model, sampler).
* **Floor**: what no implementation of that step can avoid, timed in the same process and threads right after:
  every weight the step multiplies (each 2-d weight but the embedding tables, the LM head included) on ``rows`` rows
  through vLLM's own CPU GEMM (``dispatch_cpu_unquantized_gemm``, oneDNN), plus one pass over each request's state:
  a read and a write of a recurrent state (a copy of its bytes), a read of a transformer's keys and values at the
  requests' context lengths (a sum over their bytes).

Each engine runs in a process of its own (``python benchmarks/_step_floor.py --folder ...``, which prints its row as
JSON): vLLM 0.32 cannot start a second in-process engine in one process.

``floor ÷ step`` is the fraction of its floor an engine reaches; the counts beside it (decode parameters, state bytes
per request) say whether two models are compared at equal work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

DECODE_STEPS = 40  # timed steps, every request decoding


def engine_decode_step_ms(llm, token_prompts: list[list[int]], max_tokens: int) -> float:
    """Median ms of an in-process engine's step while all of ``token_prompts`` decode: from the step after every
    request has its first token (prefills done) to the first that finishes one."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(token_prompts):
        engine.add_request(f"floor-{i}", {"prompt_token_ids": prompt}, params)
    generated, times = {}, []
    while engine.has_unfinished_requests():
        decoding = len(generated) == len(token_prompts)
        start = time.perf_counter()
        outputs = engine.step()
        elapsed = time.perf_counter() - start
        generated.update((o.request_id, len(o.outputs[0].token_ids)) for o in outputs)
        if decoding and not any(o.finished for o in outputs) and len(times) < DECODE_STEPS:
            times.append(elapsed)
    return 1e3 * statistics.median(times)


def _timed_ms(call, repeats: int = 20) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def decode_weights(model: nn.Module) -> list[torch.Tensor]:
    """The (out, in) weights a decode step multiplies: every 2-d parameter but the embedding tables, and the LM
    head's (tied or not) once. transformers' GPT-2 ``Conv1D`` holds (in, out): transposed here."""
    head = model.get_output_embeddings()
    weights = {id(head.weight): head.weight}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, nn.Embedding) or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            continue
        weights.setdefault(id(weight), weight.t() if type(module).__name__ == "Conv1D" else weight)
    return list(weights.values())


def weight_products_ms(weights: list[torch.Tensor], rows: int) -> float:
    """ms of every weight's product with ``rows`` rows on vLLM's CPU GEMM (each timed alone, summed)."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    total = 0.0
    for weight in weights:
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        linear.weight.data = weight.detach().float().contiguous()
        dispatch_cpu_unquantized_gemm(linear, remove_weight=False)
        x = torch.randn(rows, weight.shape[1])
        total += _timed_ms(lambda linear=linear, x=x: linear.cpu_linear(x, linear.weight, None))
    return total


def state_pass_ms(state_bytes: int, write: bool, allocations: int = 3) -> float:
    """ms of one pass over ``state_bytes``: a copy (read and write) or, ``write=False``, a sum (read); the fastest
    of ``allocations`` fresh buffers (the same pass over ~300 MB took 7.5 ms in one buffer and 13.2 in another: the
    floor is what the memory allows)."""
    return min(_one_pass_ms(state_bytes, write) for _ in range(allocations))  # one buffer (pair) alive at a time


def _one_pass_ms(state_bytes: int, write: bool) -> float:
    src = torch.ones(max(1, state_bytes // 4))
    if not write:
        return _timed_ms(lambda: src.sum())
    dst = torch.empty_like(src)
    return _timed_ms(lambda: dst.copy_(src))


def state_per_request(name: str, model: nn.Module, context: int) -> dict:
    """Bytes of one request's decode state, all layers, float32, and whether a step writes it (recurrent) or reads
    it (GPT-2's keys and values at ``context`` tokens)."""
    config = model.config
    if name == "gpt2":
        return {"bytes": 2 * config.n_layer * config.n_embd * 4 * context, "writes": False}
    if name == "mamba2":
        inner = config.expand * config.hidden_size
        conv = (inner + 2 * config.n_groups * config.state_size) * (config.conv_kernel - 1)
        ssm = config.num_heads * config.head_dim * config.state_size
        return {"bytes": config.num_hidden_layers * 4 * (conv + ssm), "writes": True}
    from ssmhub.serving.state_pages import StatePages

    mixers = [block.mixer for block in model.backbone.layers if type(block.mixer).__name__ != "CausalSelfAttention"]
    return {"bytes": sum(StatePages.of(mixer, torch.float32).page_bytes for mixer in mixers), "writes": True}


def step_floor_row(name: str, llm, model: nn.Module, token_prompts: list[list[int]], state: dict) -> dict:
    """The step, its floor and their ratio for one engine; ``state``: ``bytes`` per request and whether a step
    ``writes`` it whole (a recurrent state) or reads it (keys and values, their bytes at the prompts' mean length
    plus half the output)."""
    assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0", "the step is timed in this process"
    rows, max_tokens = len(token_prompts), 128
    step = engine_decode_step_ms(llm, token_prompts, max_tokens)
    products = weight_products_ms(decode_weights(model), rows)
    state_ms = state_pass_ms(rows * state["bytes"], state["writes"])
    floor = products + state_ms
    decode_params = sum(w.numel() for w in decode_weights(model))
    return {"model": name, "rows": rows, "decode_params": decode_params, "state_bytes": state["bytes"],
            "step_ms": step, "products_ms": products, "state_ms": state_ms, "floor_ms": floor,
            "floor_fraction": floor / step, "tok_s": 1e3 * rows / step}  # fmt: skip


def main(argv=None) -> None:
    """One engine's row, printed as the last line of stdout (``benchmarks/serving.py`` runs this per model)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--arguments", required=True, help="serving.py's parsed arguments, as JSON")
    parser.add_argument("--vocab", type=int, required=True)
    args = parser.parse_args(argv)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from serving import OUTPUT_TOKENS, _engine, prompts
    from transformers import AutoModelForCausalLM

    serving_args = argparse.Namespace(**json.loads(args.arguments))
    rows = serving_args.step_floor
    batch = prompts(rows, args.vocab, 64, 512, seed=7)
    context = statistics.mean(map(len, batch)) + OUTPUT_TOKENS // 2  # keys and values read, mean over the steps
    llm = _engine(args.folder, 1024, rows, serving_args, serving_args.concurrency_budget_mib << 20)
    engine_decode_step_ms(llm, prompts(rows, args.vocab, 64, 512, seed=8), 16)  # warm-up (compilation)
    model = AutoModelForCausalLM.from_pretrained(args.folder).eval()
    row = step_floor_row(args.name, llm, model, batch, state_per_request(args.name, model, int(context)))
    print(json.dumps({**row, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
