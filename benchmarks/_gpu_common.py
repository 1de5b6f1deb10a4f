"""What every step of ``gpu_suite.py`` shares: the run's context (deadline, device), timing, and result tables that
reach the results file row by row, so that a run stopped by its machine's time limit keeps every finished row."""

from __future__ import annotations

import importlib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from _report import markdown_table, median, write_report

from ssmhub.preflight import first_line

REPORT_NAME, REPORT_TITLE = "gpu", "ssmhub on a GPU: kernels, scans, decode, training, tests"


class StepTimeout(BaseException):
    """Raised by the alarm when a step passes its time cap (a BaseException: per-cell ``except Exception`` handlers
    let it through, so the step stops there and the next one runs)."""


@dataclass
class Section:
    """One step's part of the report: text and tables in order; ``report.write()`` after every change."""

    title: str
    report: Report
    parts: list = field(default_factory=list)
    footer: str = ""

    def text(self, text: str) -> None:
        self.parts.append(text)
        self.report.write()

    def table(self, headers: list[str]) -> Table:
        table = Table(headers, self.report)
        self.parts.append(table)
        return table

    def render(self) -> str:
        parts = [p.render() if isinstance(p, Table) else p for p in self.parts if not _empty(p)]
        return "\n\n".join([f"## {self.title}", *parts, *([self.footer] if self.footer else [])])


def _empty(part) -> bool:
    return isinstance(part, Table) and not part.rows


@dataclass
class Table:
    headers: list[str]
    report: Report
    rows: list = field(default_factory=list)

    def add(self, *cells) -> None:
        self.rows.append([str(c) for c in cells])
        self.report.write()

    def render(self) -> str:
        return markdown_table(self.headers, self.rows)


@dataclass
class Report:
    """The results file: a preamble and the steps' sections, rewritten whole (atomically) on every change."""

    results_dir: str
    preamble: list[str]
    name: str = REPORT_NAME  # the file's stem: gpu.md; step e or f alone writes gpu_training.md or gpu_tests.md
    sections: list[Section] = field(default_factory=list)

    def section(self, title: str) -> Section:
        self.sections.append(Section(title, self))
        return self.sections[-1]

    def write(self) -> str:
        blocks = [*self.preamble, *(s.render() for s in self.sections)]
        return write_report(self.name, REPORT_TITLE, blocks, results_dir=self.results_dir)


@dataclass
class Context:
    """What a step gets: the arguments, the plan (sizes), the device and the run's deadline (``time.monotonic``)."""

    args: object
    plan: dict
    device: torch.device
    deadline: float

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def run_with_alarm(seconds: float, fn: Callable, *args):
    """``fn(*args)``, interrupted by :class:`StepTimeout` after ``seconds`` (SIGALRM; main thread only)."""

    def _raise(signum, frame):
        raise StepTimeout(f"stopped at its {seconds:.0f} s time cap")

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        return fn(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def measure(ctx: Context, fn: Callable, repeats: int | None = None, slow_s: float = 5.0) -> tuple[float, int]:
    """Median ms of ``fn()`` after one warm-up call, synchronizing the device; a warm-up slower than ``slow_s`` is
    followed by one timed call only. Returns (median ms, timed calls)."""
    repeats = ctx.args.repeats if repeats is None else repeats
    start = time.perf_counter()
    fn()
    ctx.sync()
    n = 1 if time.perf_counter() - start > slow_s else repeats
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        ctx.sync()
        times.append(time.perf_counter() - start)
    return 1e3 * median(times), n


def failure(error: BaseException) -> str:
    """A table cell for a failed measurement: ``failed: Type: first line`` (120 characters at most)."""
    return f"failed: {type(error).__name__}: {first_line(error)[:120]}"


def optional(module: str, name: str) -> tuple[Callable | None, str]:
    """``module.name`` if it imports, else (None, "not available: reason"): the Triton scans land separately."""
    try:
        return getattr(importlib.import_module(module), name), ""
    except (ImportError, AttributeError) as error:
        return None, f"not available: {type(error).__name__}: {first_line(error)[:120]}"


def free_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def ratio(numerator: float | None, denominator: float | None) -> str:
    ok = isinstance(numerator, float) and isinstance(denominator, float) and denominator > 0
    return f"{numerator / denominator:.2f}×" if ok else "–"
