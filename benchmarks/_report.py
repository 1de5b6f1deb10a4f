"""Shared helpers for the benchmark scripts: markdown tables, machine description, atomic result files.

Every script prints its table(s) to stdout and writes ``benchmarks/results/<script_name>.md`` with
:func:`write_report`, which records the exact command line, the machine, the library versions and
the date next to the numbers, so that a results file can be traced back to how it was produced.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import statistics
import sys
from collections.abc import Sequence

import torch

from ssmhub.fileio import write_text_atomic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
RESULTS_DIR = os.path.join(ROOT, "benchmarks", "results")  # experiments/_experiments.py points it at its own


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def _cpuinfo(field: str) -> str | None:
    """The value of the first ``field`` line of /proc/cpuinfo (None where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (falls back to platform.processor())."""
    return _cpuinfo("model name") or platform.processor() or "unknown"


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    return set((_cpuinfo("flags") or "").split())


def cpu_features() -> dict[str, object]:
    """What decides CPU timings between hosts: the vector ISA torch dispatches to (``AVX2``, ``AVX512``)
    and whether the CPU has AVX512-BF16, without which ``matmul_precision="medium"`` is plain float32
    (``ops.precision``); ``avx512_bf16`` is None where /proc/cpuinfo cannot tell."""
    flags = cpu_flags()
    return {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "avx512_bf16": ("avx512_bf16" in flags) if flags else None,
    }


def machine_info() -> list[tuple[str, str]]:
    try:
        import transformers

        transformers_version = transformers.__version__
    except ImportError:  # pragma: no cover - the project depends on transformers
        transformers_version = "not installed"
    return [
        ("platform", platform.platform()),
        ("python", platform.python_version()),
        ("CPU model", cpu_model()),
        ("CPU features", ", ".join(f"{k}: {v}" for k, v in cpu_features().items())),
        ("os.cpu_count()", str(os.cpu_count())),
        ("torch", torch.__version__),
        ("transformers", transformers_version),
        ("torch.get_num_threads()", str(torch.get_num_threads())),
        # other jobs on a shared machine slow every timing in the report alike; their ratios still hold
        ("load average (1, 5, 15 min) when written", ", ".join(f"{v:.2f}" for v in os.getloadavg())),
    ]


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured markdown table; cells are str()-ed, numbers should be pre-formatted."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def command_line() -> str:
    """The command that produced the run as it could be typed again in a fresh clone's root: ``python``, then the
    script's path relative to the repository (absolute where it lies outside) and its arguments."""
    script = os.path.abspath(sys.argv[0])
    if script.startswith(ROOT + os.sep):
        script = os.path.relpath(script, ROOT)
    return " ".join(shlex.quote(a) for a in ["python", script, *sys.argv[1:]])


def write_report(script_name: str, title: str, sections: Sequence[str], results_dir: str | None = None) -> str:
    """Write ``<results_dir>/<script_name>.md`` atomically and return its path.

    Args:
        script_name: file stem of the benchmark script (``decode_vs_context``).
        title: the markdown title.
        sections: markdown blocks (tables, check lists, notes) appended in order after the header.
        results_dir: where to write it; default :data:`RESULTS_DIR` as it is when called.
    """
    now = _dt.datetime.now(_dt.timezone.utc).astimezone()
    header = [
        f"# {title}",
        "",
        "Command:",
        "",
        "```",
        command_line(),
        "```",
        "",
        f"Date: {now.isoformat(timespec='seconds')}",
        "",
        "Machine:",
        "",
        *[f"- {key}: {value}" for key, value in machine_info()],
        "",
    ]
    text = "\n".join(header) + "\n" + "\n\n".join(s.rstrip("\n") for s in sections) + "\n"
    path = os.path.join(results_dir or RESULTS_DIR, f"{script_name}.md")
    write_text_atomic(path, text)
    return path


def print_and_write(args, title: str, text: str, table: str) -> None:
    """Print ``table``; unless ``args.no_write``, write ``text`` and ``table`` to ``results/<args.name>.md``."""
    print(table)
    if not args.no_write:
        print(f"wrote {write_report(args.name, title, [text, table])}")


def parse_args_with_defaults(parser, argv, choice: str, defaults: dict[str, dict[str, object]]):
    """Parse ``argv``; every flag left None takes its default for the value of ``--<choice>`` (``defaults[value]``),
    and ``--threads``, where given, sets torch's thread count."""
    args = parser.parse_args(argv)
    for key, value in defaults[getattr(args, choice)].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    return args


def report(args, title: str, sections: Sequence[str]) -> None:
    """Print ``sections``; unless ``args.no_write``, write them to ``results/<args.name>.md`` under ``title``."""
    for section in sections:
        print("\n" + section)
    if not args.no_write:
        print(f"\nwrote {write_report(args.name, title, sections)}")
