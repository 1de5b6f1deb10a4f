"""One engine's decode step against its byte floor, measured in the process that runs it (``benchmarks/serving.py
--step-floor``; issue 71).

* **Step**: an in-process vLLM engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) is given ``rows`` requests, stepped
  through their prefill, then timed step by step while every request decodes: the median ``engine.step()`` is the
  time one output token of every request costs (scheduler, model, sampler).
* **Floor**: what no implementation of that step can avoid, timed in the same process and threads right after:
  every weight the step multiplies (each 2-d weight but the embedding tables, the LM head included) on ``rows`` rows
  through vLLM's own CPU GEMM (``dispatch_cpu_unquantized_gemm``, oneDNN), one after the other as the step reads
  them (each from memory; runs before 2026-12-05 evening summed each product timed alone, with its weight in the
  cache, which is ``products_alone_ms`` here), plus one pass over each request's state: a read and a write of a
  recurrent state, in place in the engine's own state tables (:func:`engine_state_pass_ms`; earlier runs copied a
  fresh buffer of the same bytes, ``state_fresh_ms`` here), a read of a transformer's keys and values at the
  requests' context lengths (a sum over a buffer of their bytes).

Each engine runs in a process of its own (``python benchmarks/_step_floor.py --folder ...``, which prints its row as
JSON): vLLM 0.32 cannot start a second in-process engine in one process.

``floor ÷ step`` is the fraction of its floor an engine reaches; the counts beside it (decode parameters, state bytes
per request) say whether two models are compared at equal work.
"""

from __future__ import annotations

import argparse
import functools
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
    forwards, hooks = llm.apply_model(_time_forwards)[0]  # the model's forward alone: less its sampler and head
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(token_prompts):
        engine.add_request(f"floor-{i}", {"prompt_token_ids": prompt}, params)
    generated, times, forward_times = {}, [], []
    while engine.has_unfinished_requests():
        decoding = len(generated) == len(token_prompts)
        start, calls = time.perf_counter(), len(forwards)
        outputs = engine.step()
        elapsed = time.perf_counter() - start
        generated.update((o.request_id, len(o.outputs[0].token_ids)) for o in outputs)
        if decoding and not any(o.finished for o in outputs) and len(times) < DECODE_STEPS:
            times.append(elapsed)
            forward_times.extend(forwards[calls:])
    for hook in hooks:
        hook.remove()
    return {"step": 1e3 * statistics.median(times), "forward": 1e3 * statistics.median(forward_times)}


def _time_forwards(model: nn.Module) -> tuple[list[float], list]:
    """Hooks on vLLM's model (``LLM.apply_model``, in this process) that append each forward's seconds to the list
    returned, and their handles: the layers, without the LM head (vLLM's ``compute_logits``), the sampler or the
    scheduler."""
    times, start = [], [0.0]
    hooks = [
        model.register_forward_pre_hook(lambda module, args: start.__setitem__(0, time.perf_counter())),
        model.register_forward_hook(lambda module, args, output: times.append(time.perf_counter() - start[0])),
    ]
    return times, hooks


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


def weight_products_ms(weights: list[torch.Tensor], rows: int) -> dict[str, float]:
    """ms of every weight's product with ``rows`` rows on vLLM's CPU GEMM: ``sweep``, all of them one after the
    other, each once, as a step multiplies them (median of sweeps: each weight read from memory, the floor), and
    ``each_alone``, each timed alone and summed (the floor of earlier runs: 20 products in a row with one weight
    read it from the cache 19 times, which no step can, its weights together some 300 MB)."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    products = []
    for weight in weights:
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        linear.weight.data = weight.detach().float().contiguous()
        dispatch_cpu_unquantized_gemm(linear, remove_weight=False)
        x = torch.randn(rows, weight.shape[1])
        products.append(lambda linear=linear, x=x: linear.cpu_linear(x, linear.weight, None))
    sweep = _timed_ms(lambda: [product() for product in products])
    return {"sweep": sweep, "each_alone": sum(_timed_ms(product) for product in products)}


def state_pass_ms(state_bytes: int, write: bool, allocations: int = 3) -> float:
    """ms of one pass over ``state_bytes``: a copy (read and write) or, ``write=False``, a sum (read); the fastest
    of ``allocations`` fresh buffers (the same pass over ~300 MB took 7.5 ms in one buffer and 13.2 in another: the
    floor is what the memory allows)."""
    return min(_one_pass_ms(state_bytes, write) for _ in range(allocations))  # one buffer (pair) alive at a time


def engine_state_pass_ms(llm, rows: int) -> float | None:
    """ms of one pass over the engine's own state tables, where its requests' states lie: a read and a write of
    every byte of ``rows`` slots of every recurrent layer (vLLM's ``MambaBase`` layers, ssmhub's and its own), in
    place as a step updates them; None for a model without such tables (GPT-2). The floor's state pass: a fresh
    buffer's copy took 7.3 ms in one process and 12.6 ms in another for the same bytes, and what the step pays is
    the memory its tables were given."""
    return llm.apply_model(functools.partial(_state_tables_pass_ms, rows=rows))[0]


def _state_tables_pass_ms(model: nn.Module, rows: int) -> float | None:
    from vllm.model_executor.layers.mamba.abstract import MambaBase

    layers = [*model.modules(), *getattr(model, "served", [])]  # ssmhub's served layers sit outside the tree
    tables = [t for layer in layers if isinstance(layer, MambaBase) for t in layer.kv_cache if t.numel()]
    # slots 1..rows (0 is vLLM's null block), as 32-bit integers: a read and a write of each byte, and no float
    # arithmetic (a state's subnormal floats would cost a microcode assist each)
    slots = [table[1 : 1 + rows].view(torch.int32) for table in tables]
    return _timed_ms(lambda: [view.bitwise_or_(0) for view in slots]) if slots else None


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
    timed = engine_decode_step_ms(llm, token_prompts, max_tokens)
    step = timed["step"]
    weights = decode_weights(model)
    products = weight_products_ms(weights, rows)
    fresh_ms = state_pass_ms(rows * state["bytes"], state["writes"])
    state_ms = (engine_state_pass_ms(llm, rows) if state["writes"] else None) or fresh_ms
    floor = products["sweep"] + state_ms
    decode_params = sum(w.numel() for w in weights)
    return {"model": name, "rows": rows, "decode_params": decode_params, "state_bytes": state["bytes"],
            "step_ms": step, "forward_ms": timed["forward"], "products_ms": products["sweep"],
            "products_alone_ms": products["each_alone"],
            "state_ms": state_ms, "state_fresh_ms": fresh_ms, "floor_ms": floor, "floor_fraction": floor / step,
            "tok_s": 1e3 * rows / step}  # fmt: skip


TIMED = ("step_ms", "forward_ms", "products_ms", "products_alone_ms", "state_ms", "state_fresh_ms", "floor_ms")


def median_rounds(rows: list[dict]) -> list[dict]:
    """:func:`step_floor_row` s of several rounds (each with its ``round``) -> one row per model: the median of its
    rounds' times and floor fractions, the tokens/s of the median step, ``step_range`` (the fastest and slowest
    step), and ``vs_mamba2``: the median over rounds of its tokens/s over vLLM's Mamba-2's in the same round (None
    where no round ran Mamba-2), so that a slow minute on the machine moves both sides of a ratio."""
    mamba2 = {r["round"]: r["tok_s"] for r in rows if r["model"] == "mamba2"}
    by_model: dict[str, list[dict]] = {}
    for row in rows:
        by_model.setdefault(row["model"], []).append(row)
    medians = []
    for group in by_model.values():
        row = {**group[0], **{key: statistics.median(r[key] for r in group) for key in TIMED}}
        ratios = [r["tok_s"] / mamba2[r["round"]] for r in group if r["round"] in mamba2]
        medians.append({**row, "floor_fraction": statistics.median(r["floor_fraction"] for r in group),
                        "tok_s": 1e3 * row["rows"] / row["step_ms"], "rounds": len(group),
                        "step_range": (min(r["step_ms"] for r in group), max(r["step_ms"] for r in group)),
                        "vs_mamba2": statistics.median(ratios) if ratios else None})  # fmt: skip
    return medians


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
