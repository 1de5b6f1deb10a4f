"""Step f of ``gpu_suite.py``: the test suite on the device, last, within the time the measurements left. pytest runs
in its own process group; at the budget it gets SIGINT (it stops and prints its summary), then SIGKILL. The report
gives how far it got (progress, counts, the failing tests); pytest's whole output goes to ``gpu_test_output.log``
and tests/conftest.py writes each failure's traceback to ``gpu_test_failures.md``, both in the results folder."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys

from _gpu_common import Context, Section

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUMMARY = re.compile(r"\d+ (passed|failed|errors?|skipped|deselected|xfailed|xpassed)\b")
PROGRESS = re.compile(r"^([.FEsxX]+)\s*\[\s*(\d+)%\]\s*$")
GRACE_S = 20  # after SIGINT: time for pytest to print its summary


def pytest_command(ctx: Context) -> tuple[list[str], dict]:
    args, plan = ctx.args, ctx.plan
    env = {**os.environ, "SSMHUB_TEST_DEVICE": ctx.device.type, "SSMHUB_TEST_FAILURE_LOG": failure_log(ctx)}
    command = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *plan["tests"]]
    if importlib.util.find_spec("pytest_timeout") is not None:
        command += [f"--timeout={args.test_timeout}"]  # per test; the run's budget is the process timeout
    workers = args.test_workers if args.test_workers is not None else (16 if ctx.device.type == "cuda" else 0)
    if workers and importlib.util.find_spec("xdist") is not None:
        command += ["-n", str(workers)]  # one CUDA context per worker: the suite's tiny tensors leave the GPU idle
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))  # not workers × all cores
    return command, env


def failure_log(ctx: Context) -> str:
    return os.path.join(ctx.args.results_dir, "gpu_test_failures.md")


def run_pytest(command: list[str], env: dict, budget: float) -> tuple[str, bool, int]:
    """pytest's output, whether it was stopped at ``budget`` seconds, and its exit status."""
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    stopped = False
    try:
        output = process.communicate(timeout=max(budget, 1))[0]
    except subprocess.TimeoutExpired:
        stopped = True
        process.send_signal(signal.SIGINT)  # pytest's own KeyboardInterrupt: stops and prints the summary
        try:
            output = process.communicate(timeout=GRACE_S)[0]
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output = process.communicate()[0]
    try:
        os.killpg(process.pid, signal.SIGKILL)  # whatever pytest left in its group (xdist workers)
    except ProcessLookupError:
        pass
    return output or "", stopped, process.returncode


def how_far(output: str) -> str:
    """The last progress percentage and the outcome letters counted from pytest's -q progress lines."""
    letters, percent = "", "?"
    for line in output.splitlines():
        match = PROGRESS.match(line.strip())
        if match:
            letters, percent = letters + match.group(1), match.group(2)
    names = {".": "passed", "F": "failed", "E": "error", "s": "skipped"}
    counts = ", ".join(f"{letters.count(c)} {name}" for c, name in names.items())
    return f"progress {percent}% ({counts})"


def step_tests(ctx: Context, section: Section) -> None:
    """Whatever time is left before the deadline, less a margin for writing the report."""
    if os.path.exists(failure_log(ctx)):
        os.remove(failure_log(ctx))
    command, env = pytest_command(ctx)
    budget = ctx.left() - GRACE_S - 10
    shown = f"SSMHUB_TEST_DEVICE={ctx.device.type} pytest {' '.join(command[3:])}"
    if budget < 30:
        raise RuntimeError(f"not run: {ctx.left():.0f} s left before the deadline")
    section.text(f"`{shown}` within {budget:.0f} s (the time left before the deadline).")
    output, stopped, status = run_pytest(command, env, budget)
    summaries = [line.strip("= ") for line in output.splitlines() if SUMMARY.search(line)]
    failed = [line for line in output.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    summary = summaries[-1] if summaries else "(no summary line)"
    section.text(f"{'Stopped at the budget' if stopped else 'Finished'}: {summary}; {how_far(output)}.")
    if failed:
        section.text("Failing:\n\n" + "\n".join(f"- `{line[:200]}`" for line in failed[:40]))
    elif status != 0:
        section.text("```\n" + "\n".join(output.splitlines()[-15:]) + "\n```")
    with open(os.path.join(ctx.args.results_dir, "gpu_test_output.log"), "w", encoding="utf-8") as log:
        log.write(output)  # the whole output, beside the report
    if stopped or status != 0:
        raise RuntimeError(f"tests {'stopped at the budget' if stopped else f'exit {status}'}: {summary}")
