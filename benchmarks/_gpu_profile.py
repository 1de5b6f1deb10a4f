"""What a profile of one training step says (issue 52 §1): the ops that take the device's time, and how many
launches a step makes, the gauge the CPU can read between GPU calls.

- :func:`count_aten_ops`: the leaf ATen ops one call dispatches (ops that launch a kernel themselves, none of them under
  another; views and allocations left out: they launch no kernel): on a GPU each is about one kernel launch, and the CPU
  counts the same ops wherever the two run the same code (``launch_count.py``), so it moves with the launch count.
- :func:`top_ops`: torch.profiler's top ATen ops by self device time (CUDA; CPU time on a CPU) with their share
  of the step, plus the kernels launched under no ATen op (Triton kernels called from Python), and the count of
  device kernels.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

NO_KERNEL_OPS = frozenset(  # metadata and allocation: no kernel behind them
    "aten::" + name
    for name in (
        "view as_strided reshape expand t transpose permute unsqueeze squeeze slice select detach alias "
        "_unsafe_view empty empty_strided empty_like resize_ view_as_real view_as_complex unflatten flatten "
        "split chunk narrow unbind lift_fresh _reshape_alias expand_as numpy_T contiguous to _to_copy "
        "resolve_conj resolve_neg conj _conj _neg_view result_type is_same_size"
    ).split()
)


def _runs_a_kernel_below(event) -> bool:
    """Whether some ATen op under ``event`` (at any depth) is counted itself."""
    return any(_counted(child) or _runs_a_kernel_below(child) for child in event.cpu_children)


def _counted(event) -> bool:
    if not event.name.startswith("aten::") or event.name in NO_KERNEL_OPS:
        return False
    return not _runs_a_kernel_below(event)


def leaf_aten_ops(events) -> list:
    """The ATen ops that launch a kernel themselves: under none of them runs another such op (``aten::mm`` counts
    once, not its ``resolve_conj`` children; ``aten::linear`` not, its ``addmm`` does)."""
    return [event for event in events if _counted(event)]


def count_aten_ops(fn: Callable[[], object]) -> int:
    """How many leaf ATen ops (that launch a kernel) one call of ``fn`` dispatches, forward and backward."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return len(leaf_aten_ops(prof.events()))


def profile_step(fn: Callable[[], object], device: torch.device):
    """One call of ``fn`` under torch.profiler: CPU ops, and on CUDA the kernels they launch."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return prof


def _self_time_us(entry, on_device: bool) -> float:
    return entry.self_device_time_total if on_device else entry.self_cpu_time_total


def top_ops(prof, device: torch.device, n: int = 10) -> tuple[list[list[str]], str]:
    """The ``n`` ATen ops with the most self time on the device (CUDA time; CPU time on a CPU) as table rows
    (op, calls, ms, share of the step's total), and a one-line summary of the step's totals."""
    on_device = device.type == "cuda"
    averages = prof.key_averages()
    ops = [e for e in averages if e.device_type == DeviceType.CPU and e.key.startswith("aten::")]
    ops = [e for e in ops if _self_time_us(e, on_device) > 0]
    if on_device:
        kernels = [e for e in averages if e.device_type == DeviceType.CUDA]
        total = sum(e.self_device_time_total for e in kernels)
        launched = sum(e.count for e in kernels)
    else:
        total, launched = sum(_self_time_us(e, False) for e in averages if e.device_type == DeviceType.CPU), None
    ops.sort(key=lambda e: _self_time_us(e, on_device), reverse=True)
    rows = [_op_row(e.key, e.count, _self_time_us(e, on_device), total) for e in ops[:n]]
    unattributed = total - sum(_self_time_us(e, on_device) for e in ops) if on_device else 0.0
    if unattributed > 0.01 * total:
        rows.append(_op_row("(kernels under no ATen op: Triton, called from Python)", "–", unattributed, total))
    what = "kernel time on the device" if on_device else "self CPU time of every profiled op"
    summary = f"{what}: {total / 1e3:.1f} ms"
    summary += f"; {launched} kernels launched" if launched is not None else ""
    summary += f"; {len(leaf_aten_ops(prof.events()))} leaf ATen ops"
    return rows, summary


def _op_row(name: str, calls, time_us: float, total_us: float) -> list[str]:
    share = f"{100 * time_us / total_us:.1f}%" if total_us > 0 else "–"
    return [f"`{name}`", str(calls), f"{time_us / 1e3:.2f}", share]
