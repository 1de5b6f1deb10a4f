"""The targets of issue 52 §4, read off the training table: each stated, its measured value, met or missed, and
whether the arithmetic caps it (``_gpu_arithmetic.py``: even the step's lower bound could not reach it).

A family is judged by its faster row at each length (compiled if that ran and was faster, else eager), against
the compiled GPT-2 at the same length; the memory target compares the peaks of those rows.
"""

from __future__ import annotations

from _gpu_arithmetic import arithmetic, best_row
from _gpu_common import Context, Section

# (family, index of the length in the plan (0: 2048, 1: 8192), least speed ratio vs the compiled GPT-2)
SPEED_TARGETS = (
    ("dlr", 0, 1.0),
    ("dlr", 1, 1.5),
    ("h3", 0, 1.0),
    ("h3", 1, 1.5),
    ("mamba", 0, 0.7),
    ("mamba", 1, 1.3),
    ("bdlrnn", 0, 0.6),
)
SERPENT_OVER_MAMBA = 1.3  # SeRpEnt's step ≤ 1.3 × Mamba's at equal parameters
MEMORY_FAMILIES = ("dlr", "h3", "h3-hybrid", "bdlrnn", "mamba", "serpent")


def verdict(met: bool | None, capped: bool) -> str:
    if met is None:
        return "not measured"
    return "met" if met else "missed (capped by arithmetic)" if capped else "missed"


def speed_rows(ctx: Context, results: dict, bounds: dict) -> list[list[str]]:
    rows = []
    for name, index, least in SPEED_TARGETS:
        length = ctx.plan["train_lengths"][index][0]
        best, gpt2 = best_row(results, name, length), results.get(("gpt2", length, "compiled"), {})
        ratio = gpt2["ms"] / best[1] if best and "ms" in gpt2 else None
        bound = bounds[(name, length)][2]
        most = gpt2["ms"] / bound if bound and "ms" in gpt2 else None
        capped = most is not None and most < least
        measured = f"{ratio:.2f}× ({best[0]})" if ratio is not None else "–"
        target = f"{name} ≥ {least}× the compiled GPT-2 at L {length}"
        met = None if ratio is None else ratio >= least
        rows.append([target, measured, "–" if most is None else f"{most:.1f}×", verdict(met, capped)])
    return rows


def serpent_rows(ctx: Context, results: dict) -> list[list[str]]:
    rows = []
    for length, _ in ctx.plan["train_lengths"]:
        serpent, mamba = best_row(results, "serpent", length), best_row(results, "mamba", length)
        times = serpent[1] / mamba[1] if serpent and mamba else None
        measured = "–" if times is None else f"{times:.2f}× ({serpent[0]} / {mamba[0]})"
        target = f"serpent's step ≤ {SERPENT_OVER_MAMBA}× mamba's at L {length}"
        rows.append([target, measured, "–", verdict(None if times is None else times <= SERPENT_OVER_MAMBA, False)])
    return rows


def memory_rows(ctx: Context, results: dict) -> list[list[str]]:
    length = ctx.plan["train_lengths"][-1][0]
    gpt2 = results.get(("gpt2", length, "compiled"), {}).get("peak")
    rows = []
    for name in MEMORY_FAMILIES:
        best = best_row(results, name, length)
        peak = results[(name, length, best[0])]["peak"] if best else None
        ok = None if peak is None or gpt2 is None else peak <= gpt2
        measured = "–" if peak is None or gpt2 is None else f"{peak:.1f} vs {gpt2:.1f} GiB ({best[0]})"
        rows.append([f"{name}'s peak memory ≤ GPT-2's at L {length}", measured, "–", verdict(ok, False)])
    return rows


def write_targets(ctx: Context, section: Section, results: dict) -> None:
    section.text(
        "### Targets (issue 52 §4)\n\n'at most': the ratio the step's arithmetic bound would give against the "
        "compiled GPT-2's measured step (`_gpu_arithmetic.py`); a target above it is capped. The block scan's "
        "target (≥ 5× torch's parallel scan at T 4096) is step b's, not this step's."
    )
    table = section.table(["target", "measured", "at most", "verdict"])
    bounds = arithmetic(ctx)
    for cells in speed_rows(ctx, results, bounds) + serpent_rows(ctx, results) + memory_rows(ctx, results):
        table.add(*cells)
