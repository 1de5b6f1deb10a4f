"""One layer's served decode step (``ssmhub.serving.flat_batch``) at N running rows, compiled as the vLLM plugin runs
it: what the step derives from the parameters alone formed inside the compiled graph (as before issue 71) against formed
once outside it (``TokenMixer.kept_step_coefficients``), against a copy of the state bytes the step must read and write.

What is measured (issue 71 §1)
------------------------------
For each family, the first mixer of a one-layer model at ``--width`` (the ~100M models of ``benchmarks/serving.py``:
``_serving_models``), its state tables laid out as vLLM's slot pages (``ssmhub.serving.state_pages``), ``--rows``
running requests in ``--slots`` slots. Per call, median of ``--repeats`` calls after warm-up:

- ``in graph``: the step's coefficients (DLR's Λ from its float64 polar form, H3's shift taps and modal λ) formed
  inside the compiled function, where Inductor fuses them into the per-element loop;
- ``hoisted``: ``compiled_decode`` as the plugin runs it, the coefficients formed outside the graph, once for as long
  as the weights do not change (``TokenMixer.kept_step_coefficients``);
- ``eager``: ``decode_rows`` without compilation;
- ``state copy``: ``index_select`` + ``index_copy_`` of the rows' state tables: one read and one write of the state
  bytes, the state part of the step's memory floor;
- ``weight products``: each of the mixer's ``nn.Linear`` maps on ``--rows`` rows (``F.linear``, the GEMM a step
  cannot avoid), the weight part of the floor;
- ``floor ÷ hoisted``: (state copy + weight products) ÷ hoisted, the fraction of its floor the served step reaches.

Run: ``python benchmarks/decode_step.py``; ``--families dlr h3-ssm`` for some.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import markdown_table, median, report
from _serving_models import Size, _ssmhub_model

from ssmhub.serving.flat_batch import compiled_decode, decode_rows
from ssmhub.serving.state_pages import StatePages

FAMILIES = ["dlr", "h3-ssm", "h3", "bdlrnn", "serpent-mamba"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--families", nargs="+", default=FAMILIES, choices=FAMILIES)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--rows", type=int, default=32, help="running requests, one decode row each")
    p.add_argument("--slots", type=int, default=64, help="slots in the state tables (rows take every other one)")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--name", default="decode_step", help="results/<name>.md")
    p.add_argument("--no-write", action="store_true")
    return p.parse_args(argv)


def layer_and_tables(name: str, args):
    """The family's first mixer at ``--width`` and its state tables (slots, *shape), views of one byte page a slot."""
    torch.manual_seed(0)
    mixer = _ssmhub_model(name, Size("one layer", args.width, 1, 256)).eval().backbone.layers[0].mixer
    pages = StatePages.of(mixer, torch.float32)
    tables = pages.views(torch.zeros(args.slots, pages.page_bytes, dtype=torch.uint8))
    for table in tables.values():
        if table.is_floating_point() or table.is_complex():
            table.copy_(torch.randn(table.shape).to(table.dtype) * 0.1)
    return mixer, tables, pages.page_bytes


def _step_forming_coefficients(mixer, x, state, coefficients):
    return mixer.step(x, state)  # coefficients (empty here) formed inside the step


def in_graph_decode(mixer):
    """The compiled decode rows with the coefficients formed inside the graph (the plugin before issue 71): whole
    where the state is one tensor, else the step alone (as :func:`compiled_decode` compiles them)."""
    if len(mixer.state_layout(1)) == 1:
        whole = torch.compile(functools.partial(decode_rows, step=_step_forming_coefficients), dynamic=True)
        return lambda m, x, t, s, n: whole(m, x, t, s, n, {})
    step = torch.compile(_step_forming_coefficients, dynamic=True)
    return lambda m, x, t, s, n: decode_rows(m, x, t, s, n, {}, step=step)


def timed(call, repeats: int) -> float:
    """Median seconds of ``call()`` over ``repeats`` calls, after 3 warm-up calls (compilation included there)."""
    for _ in range(3):
        call()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return median(seconds)


@torch.no_grad()
def family_row(name: str, args) -> list[str]:
    mixer, tables, page_bytes = layer_and_tables(name, args)
    x = torch.randn(args.rows, mixer.hidden_size)
    slots = torch.arange(0, 2 * args.rows, 2)  # every other slot: the rows are not one contiguous block
    new = torch.zeros(args.rows, dtype=torch.bool)
    hoisted = compiled_decode(mixer)
    in_graph = in_graph_decode(mixer)

    def copy_state():
        for table in tables.values():
            table.index_copy_(0, slots, table.index_select(0, slots))

    linears = [m for m in mixer.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(args.rows, m.in_features) for m in linears]

    def weight_products():
        for linear, rows in zip(linears, inputs):
            torch.nn.functional.linear(rows, linear.weight, linear.bias)

    ms = {
        "in graph": timed(lambda: in_graph(mixer, x, tables, slots, new), args.repeats),
        "hoisted": timed(lambda: hoisted(mixer, x, tables, slots, new, mixer.kept_step_coefficients()), args.repeats),
        "eager": timed(lambda: decode_rows(mixer, x, tables, slots, new), args.repeats),
        "state copy": timed(copy_state, args.repeats),
        "weight products": timed(weight_products, args.repeats),
    }
    ms = {key: value * 1e3 for key, value in ms.items()}
    state_mib = args.rows * page_bytes / 2**20
    weight_mib = sum(m.weight.numel() * m.weight.element_size() for m in linears) / 2**20
    floor = (ms["state copy"] + ms["weight products"]) / ms["hoisted"]
    return [name, f"{state_mib:.2f}", f"{weight_mib:.2f}", *(f"{ms[k]:.2f}" for k in ms),
            f"{ms['in graph'] / ms['hoisted']:.2f}×", f"{floor:.0%}"]  # fmt: skip


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [family_row(name, args) for name in args.families]
    headers = ["family", "state MiB (rows)", "linear weights MiB", "in graph ms", "hoisted ms", "eager ms",
               "state copy ms", "weight products ms", "hoisted vs in graph", "floor ÷ hoisted"]  # fmt: skip
    setup = (f"One layer at width {args.width}, {args.rows} decode rows in {args.slots} slots (every other one), "
             f"float32, {torch.get_num_threads()} threads; milliseconds per call, median of "
             f"{args.repeats}.")  # fmt: skip
    title = "One layer's served decode step: coefficients in the graph vs hoisted"
    report(args, title, [setup, markdown_table(headers, rows)])


if __name__ == "__main__":
    main()
