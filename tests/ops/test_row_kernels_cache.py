"""The row kernels compile once per machine, not once per process: a second process loads numba's on-disk cache.

A kernel that closed over another numba function never hit that cache (numba keys a closure's entry by the pickled
bytes of what it closes over, which differ between processes), so every serving engine and every ``generate``
compiled it again, seconds each. ssmhub.ops.row_kernels keeps the kernels as module globals; this runs each of them
in two fresh processes sharing one cache directory and reads numba's own count of cache hits in the second.

The same processes set torch to one thread before the first kernel: starting numba's OpenMP pool set the runtime's
thread count, which torch reads, to the pool's size, so a user's ``torch.set_num_threads(1)`` read 2 after ssmhub's
first kernel on a 2-core machine (``row_kernels.use_torch_threads`` puts it back)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("numba")

_KERNELS = ("diagonal_step_rows", "modal_step_rows", "selective_step_rows", "window3_step_rows", "window_step_rows")

_RUN_EACH_KERNEL = f"""
import json, torch
torch.set_num_threads(1)
from ssmhub.ops import row_kernels
from ssmhub.ops.diagonal_rows import diagonal_step_rows_, modal_kv_step_rows_
from ssmhub.ops.selective_rows import selective_step_rows_
from ssmhub.ops.window_rows import window_step_rows_
KERNELS = {_KERNELS!r}
rows, new = torch.tensor([1, 0]), torch.tensor([True, False])
selective_step_rows_(torch.zeros(3, 4, 8), rows, new, torch.randn(2, 4), torch.rand(2, 4), -torch.rand(4, 8),
                     torch.randn(2, 8), torch.randn(2, 8))
diagonal_step_rows_(torch.zeros(3, 4, 2, 8), rows, new, torch.randn(2, 4), (torch.rand(8), torch.rand(8)),
                    (torch.randn(4, 8), torch.randn(4, 8)))
modal_kv_step_rows_(torch.zeros(3, 2, 2, 3, 4, dtype=torch.complex64), rows, new,
                    tuple(torch.randn(2, 3, 2) for _ in range(3)), (torch.rand(3, 4), torch.rand(3, 4)),
                    (torch.randn(3, 4), torch.randn(3, 4)), torch.randn(3))
for window in (3, 2):  # the kernel written out for three inputs, and the general one
    window_step_rows_(torch.zeros(3, 4, window), rows, new, torch.randn(2, 4), torch.randn(4, 4))
hits = {{name: sum(getattr(row_kernels, name).stats.cache_hits.values()) for name in KERNELS}}
print(json.dumps({{**hits, "torch threads": torch.get_num_threads()}}))
"""


def _cache_hits(cache_dir) -> dict[str, int]:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir)}
    done = subprocess.run([sys.executable, "-c", _RUN_EACH_KERNEL], env=env, capture_output=True, text=True,
                          timeout=300, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_every_kernel_from_the_cache(tmp_path):
    first = _cache_hits(tmp_path)
    second = _cache_hits(tmp_path)
    assert first == {**dict.fromkeys(_KERNELS, 0), "torch threads": 1}
    assert second == {**dict.fromkeys(_KERNELS, 1), "torch threads": 1}
