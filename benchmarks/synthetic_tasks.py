"""Benchmark: synthetic sequence tasks (issue 8): the DLR paper's Tables 1-2 and Zoology's MQAR sweep.

Sections (``--sections``, all by default), each with its budget as flags (defaults: the papers'):

``table1``
    The DLR paper's Table 1 layout at L = 2^9 (arXiv:2212.00768, columns e and f): the eleven atomic
    tasks, DLR with 6 layers (H 128, N 4096, dt 1e-5, post-norm, lr 5e-5) against 2-layer attention
    (transformers' GPT-2, H 128, 4 heads, lr 1e-3), batch 64, 11K steps, R² on a fixed held-out set; H3,
    SeRpEnt and bdlrnn (not in the paper) as the attention column: 2 layers, H 128, lr 1e-3.
``shift``
    Table 2: Shift with one layer (H 32, N 4096, batch 4, lr 1e-5, 86K steps) at L = 2^14 and 2^16,
    the plain DLR kernel ``Re(K)`` against DLR-prod ``Re(K)·Im(K)`` (``kernel_type``).
``mqar``
    Zoology's multi-query associative recall (Arora et al. 2023, Figure 2; its
    ``iclr24_zoology_figure2/configs.py``) at (L, pairs) = (64, 4), (128, 8), (256, 16), 2 layers,
    widths 64, 128, 256, vocabulary 8192, no random tokens between the queries, batch 512 (256 at
    L = 256) for 64 epochs of 100K examples (12.5K / 25K steps; ours are fresh batches, the same number
    of examples), learning rates ``logspace(-4, -2, 4)``; a cell is the best accuracy at the query
    positions over the learning rates, for every family; a PNG of accuracy against width. Zoology's
    blocks have no MLP (as ours for dlr, h3, bdlrnn) and its attention 1 head with dropout 0.1; our
    attention is GPT-2 (4 heads, with its MLP and the exact GELU, no dropout).

Every run goes through :func:`ssmhub.training.synthetic.run_synthetic` (what ``ssmhub-synthetic`` runs).
Rows are appended to ``<results_dir>/synthetic.jsonl`` as runs finish; a run already there (same
section and settings) is not repeated, and the report ``<results_dir>/synthetic.md`` is rebuilt from
every row (a cell shows the row with the largest step budget), so a long sweep can be filled in over
several invocations::

    python benchmarks/synthetic_tasks.py --sections table1 --table1_families dlr,attention --table1_steps 300
    python benchmarks/synthetic_tasks.py --sections mqar --mqar_steps 4000 --mqar_lrs 1e-3

With ``--checkpoint_dir DIR`` every run saves a checkpoint there (named by its settings without the
budget), so a run cut short resumes where it stopped, and asking again for the same cell with a larger
``--*_steps`` continues the finished run instead of starting over (``ssmhub-synthetic --checkpoint``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from dataclasses import asdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
from _report import RESULTS_DIR, command_line, cpu_features, markdown_table, write_report

from ssmhub.data.synthetic import REGRESSION_TASK_NAMES
from ssmhub.fileio import append_jsonl, read_jsonl
from ssmhub.ops.precision import MATMUL_PRECISIONS
from ssmhub.training.synthetic import RESUMABLE_CHANGES, SyntheticRunConfig, run_synthetic

TITLE = "Synthetic tasks: the DLR paper's atomic tasks (Tables 1-2) and MQAR"
# The paper's Table 1 row order and its columns e (DLR, 6 layers, L = 2^9) and f (attention, 2 layers).
TABLE1_ORDER = (
    "shift",
    "cumsum",
    "cummax",
    "select_fixed",
    "solve_fixed",
    "reverse",
    "solve",
    "select",
    "sort",
    "context_shift",
    "mips",
)
TABLE1_PAPER = {
    "shift": ("1", "1"),
    "cumsum": ("1", "1"),
    "cummax": ("1", "1"),
    "select_fixed": ("1", ".94"),
    "solve_fixed": ("1", ".95"),
    "reverse": (".95", ".28"),
    "solve": (".95", "0"),
    "select": (".86", ".97"),
    "sort": (".50", ".51"),
    "context_shift": (".11", ".04"),
    "mips": (".01", ".97"),
}
ZOOLOGY_LRS = (1e-4, 10 ** (-10 / 3), 10 ** (-8 / 3), 1e-2)  # np.logspace(-4, -2, 4)
SHIFT_PAPER = {"real": {16384: ".83", 65536: ".39"}, "prod": {16384: "1", 65536: "1"}}  # Table 2


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sections", default="table1,shift,mqar")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval_examples", type=int, default=1024, help="held-out set of table1 and mqar")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--results_dir", default=RESULTS_DIR)
    p.add_argument("--report_only", action="store_true", help="rebuild the report from the JSONL file")
    p.add_argument(
        "--checkpoint_dir",
        default=None,
        help="checkpoint every run here and resume it: a run asked for again with a larger budget continues",
    )
    p.add_argument("--checkpoint_every", type=int, default=100, help="steps between checkpoints")
    p.add_argument("--log_every", type=int, default=0, help="print the training loss every N steps (0: never)")
    p.add_argument(
        "--matmul_precision",
        default="high",
        choices=MATMUL_PRECISIONS,
        help="of every run ('medium': float32 matmuls as bfloat16 passes on CPUs with AVX512-BF16)",
    )
    # table1
    p.add_argument("--table1_tasks", default=",".join(TABLE1_ORDER))
    p.add_argument("--table1_families", default="dlr,attention,h3,serpent,bdlrnn")
    p.add_argument("--table1_seq_len", type=int, default=512)
    p.add_argument("--table1_steps", type=int, default=11_000)
    p.add_argument("--table1_batch", type=int, default=64)
    p.add_argument("--table1_width", type=int, default=128)
    p.add_argument("--table1_dlr_layers", type=int, default=6)
    p.add_argument("--table1_layers", type=int, default=2, help="of every family but DLR (the paper's attention: 2)")
    p.add_argument("--table1_state_size", type=int, default=4096)
    p.add_argument("--table1_dlr_lr", type=float, default=5e-5)
    p.add_argument("--table1_lr", type=float, default=1e-3, help="of every family but DLR (attention's lr)")
    # shift (Table 2)
    p.add_argument("--shift_lengths", default="16384,65536")
    p.add_argument("--shift_kernels", default="real,prod")
    p.add_argument("--shift_steps", type=int, default=86_000)
    p.add_argument("--shift_batch", type=int, default=4)
    p.add_argument("--shift_width", type=int, default=32)
    p.add_argument("--shift_state_size", type=int, default=4096)
    p.add_argument("--shift_lr", type=float, default=1e-5)
    p.add_argument("--shift_eval_examples", type=int, default=64)
    # mqar
    p.add_argument("--mqar_configs", default="64:4,128:8,256:16", help="L:pairs,...")
    p.add_argument("--mqar_widths", default="64,128,256")
    p.add_argument("--mqar_families", default="dlr,h3,serpent,bdlrnn,attention")
    p.add_argument("--mqar_layers", type=int, default=2)
    p.add_argument(
        "--mqar_steps", type=int, default=None, help="default: Zoology's 64 epochs of 100K examples, 6.4M / batch"
    )
    p.add_argument("--mqar_batch", type=int, default=None, help="default: Zoology's 512 (256 at L = 256)")
    p.add_argument(
        "--mqar_lrs",
        default=",".join(f"{v:.3g}" for v in ZOOLOGY_LRS),
        help="the cell is the best accuracy over these (default: Zoology's logspace(-4, -2, 4))",
    )
    p.add_argument(
        "--mqar_random_non_queries",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="random tokens between the queries (Zoology's Figure 2 config: off, 0s)",
    )
    p.add_argument("--mqar_vocab", type=int, default=8192)
    p.add_argument("--mqar_state_size", type=int, default=256, help="DLR's N in the MQAR runs")
    return p


def planned_runs(args) -> list[tuple[str, SyntheticRunConfig]]:
    """(section, config) of every run the flags ask for."""
    sections = set(args.sections.split(","))
    unknown = sections - {"table1", "shift", "mqar"}
    if unknown:
        raise SystemExit(f"unknown --sections {sorted(unknown)}; expected table1, shift, mqar")
    common = {
        "seed": args.seed,
        "device": args.device,
        "checkpoint_every": args.checkpoint_every,
        "log_every": args.log_every,
        "matmul_precision": args.matmul_precision,
    }
    runs = []
    if "table1" in sections:
        for task in args.table1_tasks.split(","):
            if task not in REGRESSION_TASK_NAMES:
                raise SystemExit(f"--table1_tasks: unknown task {task!r}")
            for family in args.table1_families.split(","):
                is_dlr = family == "dlr"
                layers = args.table1_dlr_layers if is_dlr else args.table1_layers
                config = SyntheticRunConfig(
                    task=task,
                    model_type=family,
                    seq_len=args.table1_seq_len,
                    num_layers=layers,
                    hidden_size=args.table1_width,
                    max_steps=args.table1_steps,
                    batch_size=args.table1_batch,
                    lr=args.table1_dlr_lr if is_dlr else args.table1_lr,
                    eval_examples=args.eval_examples,
                    eval_batch_size=args.table1_batch,
                    model_config={"state_size": args.table1_state_size} if is_dlr else {},
                    **common,
                )
                runs.append(("table1", config))
    if "shift" in sections:
        for length in _ints(args.shift_lengths):
            for kernel in args.shift_kernels.split(","):
                config = SyntheticRunConfig(
                    task="shift",
                    model_type="dlr",
                    seq_len=length,
                    num_layers=1,
                    hidden_size=args.shift_width,
                    max_steps=args.shift_steps,
                    batch_size=args.shift_batch,
                    lr=args.shift_lr,
                    eval_examples=args.shift_eval_examples,
                    eval_batch_size=args.shift_batch,
                    model_config={"state_size": args.shift_state_size, "kernel_type": kernel},
                    **common,
                )
                runs.append(("shift", config))
    if "mqar" in sections:
        for item in args.mqar_configs.split(","):
            length, pairs = (int(v) for v in item.split(":"))
            batch = args.mqar_batch or (512 if length <= 128 else 256 if length <= 256 else 128)
            steps = args.mqar_steps or 64 * 100_000 // batch
            for width in _ints(args.mqar_widths):
                for family in args.mqar_families.split(","):
                    for lr in _floats(args.mqar_lrs):
                        config = SyntheticRunConfig(
                            task="mqar",
                            model_type=family,
                            seq_len=length,
                            num_layers=args.mqar_layers,
                            hidden_size=width,
                            max_steps=steps,
                            batch_size=batch,
                            lr=lr,
                            eval_examples=args.eval_examples,
                            eval_batch_size=batch,
                            vocab_size=args.mqar_vocab,
                            num_kv_pairs=pairs,
                            random_non_queries=args.mqar_random_non_queries,
                            model_config={"state_size": args.mqar_state_size} if family == "dlr" else {},
                            **common,
                        )
                        runs.append(("mqar", config))
    return runs


# Environment variables that change a run's speed (threads, glibc's allocator), recorded in its row.
RUN_ENVIRONMENT = ("OMP_NUM_THREADS", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")
# Fields of a run's config that do not change what it computes: those a resumed run may change, except its
# budget. A checkpoint is shared by the configs that may resume each other (all of RESUMABLE_CHANGES ignored).
NOT_SETTINGS = tuple(name for name in RESUMABLE_CHANGES if name != "max_steps")


def _settings(config: dict, ignore: tuple[str, ...] = ()) -> dict:
    """What a run computes from: its config (fields added since a row was written take their defaults)."""
    full = {**asdict(SyntheticRunConfig()), **config}
    return {k: v for k, v in full.items() if k not in (*NOT_SETTINGS, *ignore)}


def run_key(section: str, config: dict) -> str:
    return json.dumps([section, _settings(config)], sort_keys=True)


def checkpoint_path(checkpoint_dir: str, section: str, config: dict) -> str:
    """The run's checkpoint file: named by its settings without the budget, so a larger budget resumes it."""
    settings = _settings(config, ignore=RESUMABLE_CHANGES)
    digest = hashlib.sha256(json.dumps([section, settings], sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(checkpoint_dir, f"{section}-{config['task']}-{config['model_type']}-{digest}.pt")


def _matching(records: list[dict], **match) -> list[dict]:
    return [r for r in records if all(r.get(k) == v for k, v in match.items())]


def _best(records: list[dict], **match) -> dict | None:
    """The matching row with the largest step budget (the latest among equals)."""
    found = _matching(records, **match)
    return max(reversed(found), key=lambda r: r["steps"]) if found else None


def _cell(record: dict | None) -> str:
    if record is None:
        return "not run"
    return f"{record['value']:.3f} ({record['steps']} steps{_precision_note(record)})"


def _precision_note(record: dict) -> str:
    """', medium' for a run with float32 matmuls as bfloat16 passes (rows before the field: 'high');
    a "medium" run on a CPU without AVX512-BF16 computed plain float32 and is marked so (rows written
    before the ``cpu`` field do not say, and are shown as "medium")."""
    if record.get("matmul_precision", "high") != "medium":
        return ""
    without_bf16 = (record.get("cpu") or {}).get("avx512_bf16") is False  # None: /proc/cpuinfo did not tell
    return ", medium: float32, no AVX512-BF16" if without_bf16 else ", medium"


def _timing(record: dict | None) -> str:
    """Seconds per training step and the run's whole wall time."""
    return f"{record['s_per_step']:.2f} ({record['wall_s'] / 60:.0f} min)" if record else ""


def table1_section(records: list[dict]) -> str | None:
    rows = [r for r in records if r["section"] == "table1"]
    if not rows:
        return None
    families = sorted({r["family"] for r in rows}, key=lambda f: (f != "dlr", f))
    table = []
    for task in TABLE1_ORDER:
        cells = [_best(rows, task=task, family=f) for f in families]
        if all(c is None for c in cells):
            continue
        timing = [_timing(c) for c in cells]
        table.append([task, *(_cell(c) for c in cells), *TABLE1_PAPER[task], *timing])
    example = rows[0]
    headers = ["task", *(f"{f} ({_best(rows, family=f)['layers']} layers)" for f in families)]
    headers += ["paper e: DLR 6 layers", "paper f: attention 2 layers", *(f"{f} s/step (wall)" for f in families)]
    return (
        f"## Table 1 layout: R² at L = {example['L']}\n\n"
        + markdown_table(headers, table)
        + "\n\nR² on a fixed held-out set (mean over its batches of the batch R², the paper's metric). "
        "DLR: post-norm, N and dt from the row's model_config (paper: N 4096, dt 1e-5, lr 5e-5); attention is "
        "transformers' GPT-2 (4 heads, with its MLP, exact GELU; the paper's block has no MLP), lr 1e-3; H3, "
        "SeRpEnt and bdlrnn (not in the paper) as attention: 2 layers, lr 1e-3, their synthetic-run defaults (H3 "
        "without attention layers or MLP, SeRpEnt with one resampling branch, κ = 0.5); "
        'batch and steps as listed (paper: 64, 11K); "medium" marks a run with float32 matmuls as bfloat16 passes '
        "(`--matmul_precision`). Budgets differ between cells, and each states its own: the slower families' "
        "cells ran 100-300 steps (1-3% of the paper's) to fit the CPU time we had, so a cell near 0 there is a "
        "measurement at that budget, not that family's ceiling. "
        "Reverse and Sort inputs are 2L long, Select L + 64. Timing: training seconds per step and the run's whole "
        "wall time (evaluation included), on the device of the row (the machine below: each run one torch thread, "
        "two runs at a time). A run resumed over several sessions reports its mean over all of them, each at "
        "that session's code (the DLR kernel's backward became 3-4× faster at commit 2281257) and host: "
        "sessions draw different CPUs, which a row's `cpu` field in synthetic.jsonl names from 2026-11-23 on "
        "(torch's vector ISA, AVX2 or AVX512, and AVX512-BF16), so s/step compare only between rows of one host."
    )


def shift_section(records: list[dict]) -> str | None:
    rows = [r for r in records if r["section"] == "shift"]
    if not rows:
        return None
    lengths = sorted({r["L"] for r in rows})
    table = []
    for kernel in ("real", "prod"):
        cells = [_best(rows, L=n, kernel_type=kernel) for n in lengths]
        if all(c is None for c in cells):
            continue
        paper = [SHIFT_PAPER[kernel].get(n, "") for n in lengths]
        timing = [_timing(c) for c in cells]
        table.append(["DLR" if kernel == "real" else "DLR-prod", *(_cell(c) for c in cells), *paper, *timing])
    headers = ["kernel", *(f"L = {n}" for n in lengths), *(f"paper, L = {n}" for n in lengths)]
    headers += [f"s/step (wall), L = {n}" for n in lengths]
    return (
        "## Table 2: Shift, one layer, plain DLR kernel vs DLR-prod\n\n"
        + markdown_table(headers, table)
        + "\n\nOne DLR layer, H 32; N, batch, learning rate and steps as in each row (paper: N 4096, batch 4, "
        "lr 1e-5, 86K steps). The inputs are divided by their max-norm, so the targets' variance is small "
        "(about 0.03 at L = 2^14 and 2^16): an R² below 0 is a training loss still above it, not a broken metric. "
        "Timing as in Table 1."
    )


def _mqar_best(rows: list[dict], length: int, pairs: int, family: str, width: int) -> dict | None:
    """The cell's row: among the runs with the largest step budget, the best over learning rates."""
    found = _matching(rows, L=length, num_kv_pairs=pairs, family=family, width=width)
    if not found:
        return None
    steps = max(r["steps"] for r in found)
    return max((r for r in found if r["steps"] == steps), key=lambda r: r["value"])


def _mqar_cell(record: dict | None) -> str:
    if record is None:
        return "not run"
    budget = f"{record['steps']} steps × {record['batch_size']}, {record['wall_s'] / 60:.0f} min"
    return f"{record['value']:.3f} (lr {record['lr']:g}, {budget}{_precision_note(record)})"


def mqar_section(records: list[dict]) -> str | None:
    rows = [r for r in records if r["section"] == "mqar"]
    if not rows:
        return None
    families = sorted({r["family"] for r in rows})
    widths = sorted({r["width"] for r in rows})
    configs = sorted({(r["L"], r["num_kv_pairs"]) for r in rows})
    table = [
        [
            f"L {length}, {pairs} pairs",
            family,
            *(_mqar_cell(_mqar_best(rows, length, pairs, family, w)) for w in widths),
        ]
        for length, pairs in configs
        for family in families
    ]
    headers = ["setting", "family", *(f"width {w}" for w in widths)]
    return (
        "## MQAR: accuracy at the query positions\n\n"
        + markdown_table(headers, table)
        + "\n\nZoology's MQAR (power-law gaps a = 0.01, vocabulary 8192 unless synthetic.jsonl says otherwise; "
        "0s between the queries unless a row's random_non_queries is set), fresh batches every step, 2 layers; "
        "each cell is the best accuracy over the learning rates run at its largest budget (steps × batch; "
        "Zoology: 64 epochs of 100K examples), on a fixed held-out set (the row's eval_examples), with the run's "
        "whole wall time (one torch thread). DLR uses post-norm, dt 1e-5 and the N of its model_config; "
        "attention is transformers' GPT-2 and mamba transformers' MambaModel (the peer of SeRpEnt, whose base "
        "branch is the same mixer); SeRpEnt, bdlrnn and mamba use their family defaults unless the row's "
        "model_config says otherwise. Mamba is a reference point run at one cell only (L 64, 4 pairs, width 64): "
        "without its CUDA kernels transformers' MambaModel scans token by token on CPU, about 8× SeRpEnt's time "
        "there. Budgets differ between cells, and each cell states its own: the widest cells "
        "of the slower families ran fewer steps to fit the CPU time we had (a bdlrnn layer's transition MLP, H·b "
        "hidden units as the authors' default, costs O(H²b²) per token: 5-10 s a step at L 128 and width 256, by host, "
        "on one thread), so a row is a measurement at its budget, not that family's ceiling."
        + "\n\n"
        + _mqar_runs(rows)
    )


def _mqar_runs(rows: list[dict]) -> str:
    """Every MQAR row (a run resumed to a larger budget appears once per budget), with its final training loss."""
    ordered = sorted(rows, key=lambda r: (r["L"], r["num_kv_pairs"], r["family"], r["width"], r["lr"], r["steps"]))
    table = [
        [
            f"L {r['L']}, {r['num_kv_pairs']} pairs",
            r["family"],
            r["width"],
            f"{r['lr']:g}",
            f"{r['steps']} × {r['batch_size']}",
            f"{r['value']:.3f}",
            f"{r['final_train_loss']:.2f}",
        ]
        for r in ordered
    ]
    vocabularies = sorted({r["vocab_size"] for r in rows})
    uniform = ", ".join(f"{math.log(v // 2):.2f} (V = {v})" for v in vocabularies)
    in_context = ", ".join(f"{math.log(p):.2f} (P = {p})" for p in sorted({r["num_kv_pairs"] for r in rows}))
    return (
        "### Every MQAR run\n\n"
        + markdown_table(["setting", "family", "width", "lr", "steps × batch", "accuracy", "final train loss"], table)
        + f"\n\nFor scale: ln(V/2) = {uniform} is the loss of a uniform guess over the value tokens, ln P = "
        f"{in_context} that of a uniform guess among the sequence's P values (accuracy 1/P)."
    )


def mqar_plot(records: list[dict], results_dir: str) -> str:
    """A PNG of MQAR accuracy against width, one panel per (L, pairs); returns a line for the report."""
    rows = [r for r in records if r["section"] == "mqar"]
    if not rows:
        return ""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError:
        return "matplotlib is not installed: no MQAR plot."
    configs = sorted({(r["L"], r["num_kv_pairs"]) for r in rows})
    fig, axes = plt.subplots(1, len(configs), figsize=(4 * len(configs), 3.8), squeeze=False)
    families, widths = sorted({r["family"] for r in rows}), sorted({r["width"] for r in rows})
    # One colour and marker per family in every panel; each family's points sit slightly apart along the
    # (log) width axis, so families at the same accuracy (many at 0) stay visible instead of hiding each other.
    colors = {family: f"C{i}" for i, family in enumerate(families)}
    markers = {family: "osD^vP*X"[i % 8] for i, family in enumerate(families)}
    nudge = {family: 2 ** (0.05 * (i - (len(families) - 1) / 2)) for i, family in enumerate(families)}
    for ax, (length, pairs) in zip(axes[0], configs):
        for family in families:
            cells = {w: _mqar_best(rows, length, pairs, family, w) for w in widths}
            points = {w: cell["value"] for w, cell in cells.items() if cell is not None}
            if points:
                xs = sorted(points)
                ax.plot(
                    [x * nudge[family] for x in xs],
                    [points[x] for x in xs],
                    marker=markers[family],
                    markersize=5,
                    color=colors[family],
                    label=family,
                )
        ax.set_xscale("log", base=2)
        ax.set_xticks(widths, [str(w) for w in widths])  # the same width axis in every panel
        ax.set_xlim(widths[0] / 1.3, widths[-1] * 1.3)
        ax.set_title(f"L = {length}, {pairs} pairs")
        ax.set_xlabel("width")
        ax.set_ylim(-0.03, 1.02)
    axes[0][0].set_ylabel("MQAR accuracy")
    legend = [Line2D([], [], color=colors[f], marker=markers[f], label=f) for f in families]  # every family, once
    fig.legend(handles=legend, loc="upper center", ncol=len(families), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    path = os.path.join(results_dir, "synthetic_mqar.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"![MQAR accuracy against width]({os.path.basename(path)})"


def report(records: list[dict], results_dir: str) -> list[str]:
    sections = [table1_section(records), shift_section(records), mqar_section(records), mqar_plot(records, results_dir)]
    sections = [s for s in sections if s]
    sections.append(
        "Every run: `ssmhub.training.synthetic.run_synthetic` (the `ssmhub-synthetic` CLI), fresh batches each step, "
        "AdamW with no weight decay at a constant learning rate; every row, with its full settings, is in "
        "`synthetic.jsonl`."
    )
    return sections


def main() -> None:
    args = _parser().parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.makedirs(args.results_dir, exist_ok=True)
    jsonl = os.path.join(args.results_dir, "synthetic.jsonl")
    records = read_jsonl(jsonl)
    if not args.report_only:
        done = {run_key(r["section"], r["config"]) for r in records}
        for section, config in planned_runs(args):
            key = run_key(section, asdict(config))
            if key in done:
                continue
            if args.checkpoint_dir:
                config.checkpoint = checkpoint_path(args.checkpoint_dir, section, asdict(config))
            print(
                f"== {section}: {config.model_type} on {config.task}, L {config.seq_len}, width {config.hidden_size}, "
                f"{config.num_layers} layers, {config.max_steps} steps, lr {config.lr:g} {config.model_config or ''}",
                flush=True,
            )
            row = run_synthetic(config, log=lambda line: print(f"   {line}", flush=True))
            row["section"] = section
            row["command"] = command_line()
            row["environment"] = {k: os.environ[k] for k in RUN_ENVIRONMENT if k in os.environ}
            row["cpu"] = cpu_features() if row["device"] == "cpu" else None
            row["kernel_type"] = config.model_config.get("kernel_type", "real") if config.model_type == "dlr" else None
            print(
                f"   {row['metric']} {row['value']:.4f} in {row['wall_s']:.1f} s ({row['s_per_step']:.3f} s/step)",
                flush=True,
            )
            append_jsonl(jsonl, row)
            records.append(row)
            done.add(key)
            write_report("synthetic", TITLE, report(records, args.results_dir), results_dir=args.results_dir)
    path = write_report("synthetic", TITLE, report(records, args.results_dir), results_dir=args.results_dir)
    print(path)


if __name__ == "__main__":
    main()
