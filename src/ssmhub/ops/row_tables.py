"""A state table as the one-pass row kernels read it (:mod:`~ssmhub.ops.diagonal_rows`,
:mod:`~ssmhub.ops.selective_rows`): one flat array and the stride between slots.

A decode step's table is (slots, *state shape), one row (slot) per request. In ``generate`` it is a contiguous tensor;
in a serving engine it is a view into the engine's byte pages, (slots, page), whose slot stride exceeds the state's
size (a page holds every state of the layer, padded). numba compiles a kernel for each array layout it is handed:
a C-contiguous array's innermost stride is known to be one, which is what lets LLVM vectorize the loop over a row's
modes, while a strided view compiles as a layout-'A' array whose every index goes through runtime strides, and that
loop stays scalar. So the kernels take the table as :func:`flat_rows` gives
it: one C-contiguous array from slot 0's first element to the last slot's last, and the slot stride as an integer;
they index slot ``s``'s element ``i`` (row-major within the slot) at ``s * stride + i``. That needs each slot's
block contiguous, the one layout condition :func:`rows_kernel_usable` checks.

The kernels form those indices as unsigned integers (``np.uint64``): numba wraps a signed index that may be negative
(``a[-1]``) with a test and a select per element, which again keeps the loop scalar; an unsigned one it takes as it
is. (What either costs is in the notes of ``benchmarks/results/serving_floor.md``.)
"""

from __future__ import annotations

import functools
import importlib.util

import torch

__all__ = ["check_row_operands", "flat_rows", "import_numba", "kernel_importable", "rows_kernel_usable", "table_layout"]


@functools.cache
def kernel_importable() -> bool:
    """Whether numba is installed (looked up once; not imported until a kernel first runs)."""
    return importlib.util.find_spec("numba") is not None


def import_numba():
    """numba, imported for a kernel, with llvmlite's library wrapper made safe for vLLM's start-up scan.

    vLLM 0.32's CPU worker, as it starts, rebinds Triton kernels by scanning the globals of every loaded module and
    reading ``vars(value).get("kernel")`` of each value that has a ``__dict__``. llvmlite's ``ffi.lib`` (loaded with
    numba) answers any attribute with a wrapped C function, ``__dict__`` included, so once a kernel has run, the next
    engine started in the process failed with ``AttributeError: '_lib_fn_wrapper' object has no attribute 'get'``
    (``generate`` then ``LLM(...)``, or two engines one after the other). An empty ``__dict__`` entry in the wrapper's
    table of functions gives the scan a dict without a kernel; llvmlite itself never asks for that name."""
    import numba
    from llvmlite.binding import ffi

    functions = getattr(getattr(ffi, "lib", None), "_fntab", None)
    if isinstance(functions, dict):
        functions.setdefault("__dict__", {})
    return numba


def _slot_blocks_apart(table: torch.Tensor) -> bool:
    """Whether each slot's block of ``table`` (slots, *shape) is contiguous and slots do not overlap."""
    block = table[0] if table.shape[0] else table.new_empty(table.shape[1:])
    return block.is_contiguous() and (table.shape[0] <= 1 or table.stride(0) >= block.numel())


def rows_kernel_usable(table: torch.Tensor, dtype: torch.dtype, dim: int) -> bool:
    """Whether a row kernel can update ``table`` in place: numba importable, a CPU table of ``dtype`` with ``dim``
    dimensions, each slot's block contiguous (slots may lie apart, as an engine's pages do), and not under
    ``torch.compile`` (which cannot trace a numba call)."""
    return (
        kernel_importable()
        and table.device.type == "cpu"
        and table.dtype == dtype
        and table.dim() == dim
        and _slot_blocks_apart(table)
        and not torch.compiler.is_compiling()
    )


def check_row_operands(shapes: dict, table: torch.Tensor, num_rows: int) -> None:
    """``shapes``: name -> (tensor, the shape it must have) for a step of ``num_rows`` rows of ``table``; a
    ValueError naming the first that differs, before any work."""
    for name, (tensor, shape) in shapes.items():
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} for {num_rows} rows of a table {tuple(table.shape)}; "
                             f"got {tuple(tensor.shape)}")  # fmt: skip


def flat_rows(table: torch.Tensor):
    """``table`` (slots, *shape), each slot's block contiguous -> (flat, stride): a C-contiguous numpy array over
    the same memory, from slot 0's first element to the last slot's last (the bytes between slots included, never
    written), and the slot stride in elements. Slot ``s``'s element ``i`` is ``flat[s * stride + i]``."""
    slots, stride = table.shape[0], table.stride(0)
    span = (slots - 1) * stride + table[0].numel() if slots else 0
    return table.detach().as_strided((span,), (1,), table.storage_offset()).numpy(), stride


def table_layout(table: torch.Tensor | None) -> tuple | None:
    """What a kernel's checks of ``table`` depend on (shape, strides, dtype, device), not where it lies: a step formed
    and checked for one table serves any other of the same layout."""
    return None if table is None else (table.shape, table.stride(), table.dtype, table.device)
