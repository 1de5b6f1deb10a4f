"""The compiled bodies of the one-pass row kernels (:mod:`~ssmhub.ops.diagonal_rows`,
:mod:`~ssmhub.ops.selective_rows`, :mod:`~ssmhub.ops.window_rows`): importing this module imports numba, so the
wrappers import it at a kernel's first call, never at ``import ssmhub``.

The kernels and their helpers are module globals, not closures: numba keys its on-disk cache of a closure by the
pickled bytes of the variables it closes over, which differ between processes (a dispatcher, an intrinsic), so a
closure's cache never hit and every process (every serving engine, every ``generate``) compiled it again. A global
function's cache is keyed by its source file and signature, and a second process loads it from disk.

Each kernel takes its state table as :func:`~ssmhub.ops.row_tables.flat_rows` gives it (one flat C-contiguous array
and the slot stride) and forms indices as unsigned integers: :mod:`ssmhub.ops.row_tables` says why both keep the
loop over modes vectorized. The formulas and their papers are in the wrappers' docstrings.

A step is a stream through the rows' states, read and written once, with little arithmetic per byte; each parallel
iteration walks a short contiguous stretch (a channel's modes, under 1 KB at 128 modes) and then reduces, and the
hardware prefetcher, which ramps up anew on each stretch, left the loads waiting on memory: DLR's kernel ran at half
the speed of a copy of its bytes. So each kernel asks for the state :data:`PREFETCH_AHEAD` floats ahead of where it
reads (:func:`_prefetch_lines`, LLVM's ``llvm.prefetch`` hint, a no-op for the program's values), within the same
slot's stretch that iteration walks.
"""

from __future__ import annotations

import numpy as np
import torch
from llvmlite import ir

from .row_tables import import_numba
from .selective_scan import decay_exponent_floor

numba = import_numba()
from numba.core import cgutils  # noqa: E402  (after import_numba, which mends llvmlite for vLLM)
from numba.extending import intrinsic  # noqa: E402

__all__ = [
    "PREFETCH_AHEAD",
    "diagonal_step_rows",
    "modal_step_rows",
    "selective_step_rows",
    "use_torch_threads",
    "window3_step_rows",
    "window_step_rows",
]

PREFETCH_AHEAD = 2048  # floats (8 KB): how far ahead of its reads a kernel asks for the state; 1-8 KB measured
_LINE_FLOATS = 16  # floats per 64-byte cache line

_LOWEST_DECAY_EXPONENT = np.float32(decay_exponent_floor(torch.float32))  # a constant of the compiled code


def use_torch_threads() -> None:
    """Run the next kernel on as many threads as torch uses (at most numba's pool), and leave torch's count as it
    was: the first call starts numba's OpenMP pool, which sets the OpenMP runtime's thread count, the one torch
    reads, to the pool's size (a user's ``torch.set_num_threads(1)`` read 2 afterwards on a 2-core machine)."""
    threads = torch.get_num_threads()
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@intrinsic
def _prefetch(typingctx, array, index):
    """A hint that ``array[index]`` (a 1-d array, an unsigned index) will be written soon: LLVM's ``llvm.prefetch``
    (write, high locality, data), which brings its cache line in without waiting for it and changes no value."""

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        byte_pointer = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        hint = ir.FunctionType(ir.VoidType(), [byte_pointer, i32, i32, i32])
        prefetch = cgutils.get_or_insert_function(builder.module, hint, "llvm.prefetch.p0")
        address = builder.bitcast(builder.gep(data, [args[1]]), byte_pointer)
        builder.call(prefetch, [address, ir.Constant(i32, 1), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return numba.types.void(array, index), codegen


@numba.njit(inline="always")
def _prefetch_lines(table, start, count):
    """Prefetch the cache lines of ``table[start : start + count]`` (``start`` unsigned)."""
    for c in range(0, count, _LINE_FLOATS):
        _prefetch(table, start + np.uint64(c))


@numba.njit(parallel=True, fastmath=True, cache=True, boundscheck=False)
def diagonal_step_rows(table, slot_stride, rows, new, u, lam_re, lam_im, w_re, w_im, z_re, z_im, tile):
    """DLR's ``x = λ x + u``, ``z = Σ_n w_n x[n]`` over table rows
    (:func:`~ssmhub.ops.diagonal_rows.diagonal_step_rows_`)."""
    num_rows, channels = u.shape
    modes = w_re.shape[1]
    shared = lam_re.shape[0] == 1  # one λ for every channel (DLR), or a row of λ per channel
    tiles = (channels + tile - 1) // tile
    for flat in numba.prange(tiles * num_rows):  # a tile of channels of one row per iteration, rows inner
        t = flat // num_rows
        r = flat - t * num_rows
        end = min(channels, (t + 1) * tile)
        ahead = max(1, PREFETCH_AHEAD // (2 * modes))  # channels
        for h in range(t * tile, end):  # its N modes inside
            re_at = np.uint64(rows[r] * slot_stride + h * 2 * modes)  # Re x[slot, h, 0]
            im_at = re_at + np.uint64(modes)
            if h + ahead < end:
                _prefetch_lines(table, re_at + np.uint64(ahead * 2 * modes), 2 * modes)
            k = 0 if shared else h
            if new[r]:  # the zero state before a first token
                for n in range(2 * modes):
                    table[re_at + np.uint64(n)] = 0.0
            u_rh = u[r, h]
            acc_re = np.float32(0.0)
            acc_im = np.float32(0.0)
            for n in range(modes):
                i_re, i_im = re_at + np.uint64(n), im_at + np.uint64(n)
                old_re = table[i_re]
                old_im = table[i_im]
                re = lam_re[k, n] * old_re - lam_im[k, n] * old_im + u_rh
                im = lam_re[k, n] * old_im + lam_im[k, n] * old_re
                table[i_re] = re
                table[i_im] = im
                acc_re += re * w_re[h, n] - im * w_im[h, n]
                acc_im += re * w_im[h, n] + im * w_re[h, n]
            z_re[r, h] = acc_re
            z_im[r, h] = acc_im


@numba.njit(parallel=True, fastmath=True, cache=True, boundscheck=False)
def modal_step_rows(table, slot_stride, rows, new, q, k, v, lam_re, lam_im, c_re, c_im, direct, out, tile):
    """H3's modal state-passing step over table rows (:func:`~ssmhub.ops.diagonal_rows.modal_kv_step_rows_`): a tile
    of heads of one row per parallel iteration, rows inner (the tile's λ and residues read from cache by every
    row), each pair (i, j) of head channels a contiguous stretch of the tile's heads and modes."""
    num_rows, heads, width = q.shape
    modes = lam_re.shape[1]
    tiles = (heads + tile - 1) // tile
    ahead = max(1, PREFETCH_AHEAD // (2 * modes))  # heads
    for flat in numba.prange(tiles * num_rows):
        t = flat // num_rows
        r = flat - t * num_rows
        first, end = t * tile, min(heads, (t + 1) * tile)
        for h in range(first, end):
            for j in range(width):
                out[r, h, j] = 0.0
        for i in range(width):  # o_j = Σ_i q_i s_ij, summed in the order of i
            for j in range(width):
                pair = np.uint64(rows[r] * slot_stride + (i * width + j) * heads * modes * 2)  # Re x[i, j, 0, 0]
                for h in range(first, end):
                    at = pair + np.uint64(h * modes * 2)  # Re x[i, j, h, 0]
                    if h + ahead < end:
                        _prefetch_lines(table, at + np.uint64(ahead * 2 * modes), 2 * modes)
                    if new[r]:  # the zero state before a first token
                        for n in range(2 * modes):
                            table[at + np.uint64(n)] = 0.0
                    u = k[r, h, i] * v[r, h, j]
                    z = np.float32(0.0)
                    for n in range(modes):
                        i_re = at + np.uint64(2 * n)  # Im follows Re
                        old_re = table[i_re]
                        old_im = table[i_re + np.uint64(1)]
                        re = lam_re[h, n] * old_re - lam_im[h, n] * old_im + u
                        im = lam_re[h, n] * old_im + lam_im[h, n] * old_re
                        table[i_re] = re
                        table[i_re + np.uint64(1)] = im
                        z += c_re[h, n] * re - c_im[h, n] * im
                    out[r, h, j] += q[r, h, i] * (z + direct[h] * u)


@intrinsic
def _float_of_bits(typingctx, bits):
    """int32 -> the float32 with those bits (LLVM's bitcast, which vectorizes)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return numba.types.float32(numba.types.int32), codegen


@numba.njit(inline="always", fastmath=True)
def _exp32(x):
    """Cephes' expf: x = n ln 2 + r, |r| ≤ ln 2 / 2; exp(r) by its minimax polynomial; 2^n from its bits.

    Every value is a float32 (n too, an integer held as one): numba types ``math.floor`` as an int64 and an int64
    times a float32 as a float64, which made the polynomial float64, four lanes to a vector with conversions around
    them, where float32 fills eight."""
    x = min(max(x, _LOWEST_DECAY_EXPONENT), np.float32(88.7))
    n = np.floor(x * np.float32(1.44269504088896341) + np.float32(0.5))
    r = x - n * np.float32(0.693359375) + n * np.float32(2.12194440e-4)  # ln 2 = 0.693359375 − 2.12194440e-4
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1.0)
    return p * _float_of_bits((np.int32(n) + np.int32(127)) << np.int32(23))


@numba.njit(parallel=True, fastmath=True, cache=True, boundscheck=False)
def selective_step_rows(table, slot_stride, rows, new, x, delta, A, B, C, D, gate, y):
    """The selective SSM's step over table rows (:func:`~ssmhub.ops.selective_rows.selective_step_rows_`)."""
    num_rows, channels = x.shape
    modes = A.shape[1]
    ahead = max(1, PREFETCH_AHEAD // modes)  # channels
    for flat in numba.prange(num_rows * channels):  # one (row, channel) per iteration, its N modes inside
        r = flat // channels
        e = flat - r * channels
        at = np.uint64(rows[r] * slot_stride + e * modes)  # state (slot, e, 0)
        if e + ahead < channels:
            _prefetch_lines(table, at + np.uint64(ahead * modes), modes)
        d = delta[r, e]
        dx = d * x[r, e]
        if new[r]:  # the zero state before a first token (whatever the reused slot holds, NaN included)
            for n in range(modes):
                table[at + np.uint64(n)] = 0.0
        acc = np.float32(0.0)
        for n in range(modes):
            i = at + np.uint64(n)
            h = _exp32(d * A[e, n]) * table[i] + dx * B[r, n]
            table[i] = h
            acc += h * C[r, n]
        y[r, e] = (acc + D[e] * x[r, e]) * gate[r, e]


@numba.njit(parallel=True, fastmath=True, cache=True, boundscheck=False)
def window_step_rows(table, slot_stride, window, rows, new, u, taps, current, bias, y):
    """A short causal convolution's step over table rows, its window shifted in place
    (:func:`~ssmhub.ops.window_rows.window_step_rows_`); channel c takes the taps, current-input weight and bias of
    row c mod T. One sweep per window: each input is met by its tap and moved one place as it is read. Channels
    outside, rows inside: a channel's taps are read from cache by every row (H3's long filters are 8 KB a channel,
    6 MB a layer)."""
    num_rows, channels = u.shape
    tap_rows, tap_count = taps.shape
    flat_taps = taps.reshape(-1)
    for c in numba.prange(channels):  # one channel per iteration, each row's window inside
        t = c % tap_rows
        oldest_tap = np.uint64(t * tap_count + window)  # taps[t, window − s] meets window place s
        weight, offset = current[t], bias[t]
        for r in range(num_rows):
            at = np.uint64(rows[r] * slot_stride + c * window)  # window (slot, c, 0), the oldest input
            u_rc = u[r, c]
            acc = weight * u_rc + offset
            if new[r]:  # a new request: an empty window (zeros), whatever the reused slot holds
                for s in range(window - 1):
                    table[at + np.uint64(s)] = 0.0
            else:
                acc += flat_taps[oldest_tap] * table[at]
                for s in range(1, window):
                    held = table[at + np.uint64(s)]
                    acc += flat_taps[oldest_tap - np.uint64(s)] * held
                    table[at + np.uint64(s - 1)] = held
            table[at + np.uint64(window - 1)] = u_rc
            y[r, c] = acc


@numba.njit(parallel=True, fastmath=True, cache=True, boundscheck=False)
def window3_step_rows(table, slot_stride, rows, new, u, taps, current, bias, y):
    """:func:`window_step_rows` for windows of three inputs, a four-tap convolution's (Mamba's ``d_conv`` = 4, H3's
    shift of four taps). Rows outside, channels inside, the three places written out: a row's windows are one
    contiguous stretch, and LLVM vectorizes across its channels, where the general kernel's loop over a window of
    any length stays scalar. Channel c = k·T + t is walked as (k, t), which spares an integer division (c mod T)
    per window."""
    num_rows, channels = u.shape
    tap_rows = taps.shape[0]
    for r in numba.prange(num_rows):  # one row per iteration, its channels inside
        base = np.uint64(rows[r] * slot_stride)  # window (slot, 0, 0)
        fresh = new[r]  # a new request: an empty window (zeros), whatever the reused slot holds
        for k in range(channels // tap_rows):
            for t in range(tap_rows):
                c = k * tap_rows + t
                at = base + np.uint64(3 * c)  # window (slot, c, 0), the oldest input
                u_rc = u[r, c]
                acc = current[t] * u_rc + bias[t]
                if not fresh:
                    held_1, held_2 = table[at + np.uint64(1)], table[at + np.uint64(2)]
                    acc += taps[t, 3] * table[at] + taps[t, 2] * held_1 + taps[t, 1] * held_2
                else:
                    held_1, held_2 = np.float32(0.0), np.float32(0.0)
                table[at] = held_1
                table[at + np.uint64(1)] = held_2
                table[at + np.uint64(2)] = u_rc
                y[r, c] = acc
