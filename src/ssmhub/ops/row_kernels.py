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
slot's stretch that iteration walks; H3's modal kernel only where a head's stretch is long (at 16 modes, two lines a
head, the hints slowed it).
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
# H3's modal kernel asks for a head's state ahead only where a head's stretch is this long (64 modes): measured at
# 16 modes (two lines a head) the hints made twelve layers' step slower, at 128 (sixteen lines) faster
_MODAL_PREFETCH_SPAN = 8 * _LINE_FLOATS

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


@numba.njit(inline="always")
def _shift_input(table, at, window, flat_taps, oldest_tap, current, u, fresh):
    """One channel's short causal convolution step, its window of ``window`` past inputs (oldest first) at
    ``table[at:]`` shifted in place; returns the output. Window place s meets ``flat_taps[oldest_tap − s]`` (the tap
    ``window − s`` steps back) and moves one place as it is read; ``u``, weight ``current``, takes the last place.
    ``fresh``: an empty window (zeros), whatever the table holds. Unsigned indices (``at``, ``oldest_tap``)."""
    acc = current * u
    if window == 0:
        return acc
    if fresh:
        for s in range(window - 1):
            table[at + np.uint64(s)] = 0.0
    else:
        acc += flat_taps[oldest_tap] * table[at]
        for s in range(1, window):
            held = table[at + np.uint64(s)]
            acc += flat_taps[oldest_tap - np.uint64(s)] * held
            table[at + np.uint64(s - 1)] = held
    table[at + np.uint64(window - 1)] = u
    return acc


@numba.njit(inline="always", fastmath=True)
def _shift3_channels(table, at, taps, current, u, fresh, out):
    """:func:`_shift_input` for windows of three inputs (four taps: H3's shift, Mamba's ``d_conv`` = 4) over a
    stretch of channels, ``taps`` (C, ≥ 4), ``current``, ``u`` and ``out`` (C,) views, the windows three floats
    each from ``table[at:]`` on: the three places written out, so that LLVM vectorizes across channels where the
    general loop over a window of any length stays scalar."""
    for c in range(u.shape[0]):
        w = at + np.uint64(3 * c)  # window (c, 0), the oldest input
        acc = current[c] * u[c]
        if not fresh:
            held_1, held_2 = table[w + np.uint64(1)], table[w + np.uint64(2)]
            acc += taps[c, 3] * table[w] + taps[c, 2] * held_1 + taps[c, 1] * held_2
        else:
            held_1, held_2 = np.float32(0.0), np.float32(0.0)
        table[w] = held_1
        table[w + np.uint64(1)] = held_2
        table[w + np.uint64(2)] = u[c]
        out[c] = acc


@numba.njit(inline="always", fastmath=True)
def _modal_modes(x, h, u, lam_re, lam_im, c_re, c_im):
    """``x = λ x + u`` over head h's modes, ``x`` its state as one view of interleaved (Re, Im) floats, in place;
    returns ``Re Σ_n c_n x[n]``. A view of the stretch, not indices into the table: the loop's runtime alias checks
    and address arithmetic then cost less per head, which is most of a head's time at 16 modes."""
    z = np.float32(0.0)
    for n in range(lam_re.shape[1]):
        old_re, old_im = x[2 * n], x[2 * n + 1]
        re = lam_re[h, n] * old_re - lam_im[h, n] * old_im + u
        im = lam_re[h, n] * old_im + lam_im[h, n] * old_re
        x[2 * n] = re
        x[2 * n + 1] = im
        z += c_re[h, n] * re - c_im[h, n] * im
    return z


@numba.njit(parallel=True, fastmath=True, cache=True, boundscheck=False)
def modal_step_rows(table, slot_stride, shift_table, shift_stride, window, rows, new, qkv, shift_taps, shift_current,
                    lam_re, lam_im, c_re, c_im, direct, k_shift, out, tile):  # fmt: skip
    """H3's step over table rows, its shift and its modal state-passing in one call
    (:func:`~ssmhub.ops.diagonal_rows.modal_kv_step_rows_`): a tile of heads of one row per parallel iteration, rows
    inner (the tile's λ and residues read from cache by every row). Each k channel goes through the shift window
    (:func:`_shift3_channels` for a window of three, :func:`_shift_input` else; ``window`` 0 with unit taps: k as it
    is), then each head is stepped and read out: with one channel a head (d_h = 1, H3's diagonal SSM) head after
    head, with more each pair (i, j) of head channels a contiguous stretch of the tile's heads and modes. ``qkv``
    (R, 3, H, d_h): q, k and v side by side, as the input projection writes them."""
    num_rows, _, heads, width = qkv.shape
    modes = lam_re.shape[1]
    span = 2 * modes  # floats of one head's state for one pair (i, j)
    tiles = (heads + tile - 1) // tile
    flat_taps = shift_taps.reshape(-1)  # (d·K,): channel c's tap s at c·K + s
    tap_count = shift_taps.shape[1]
    ahead = max(1, PREFETCH_AHEAD // span)  # heads
    prefetching = span >= _MODAL_PREFETCH_SPAN
    for flat in numba.prange(tiles * num_rows):
        t = flat // num_rows
        r = flat - t * num_rows
        first, end = t * tile, min(heads, (t + 1) * tile)
        fresh = new[r]  # the zero state and an empty window before a first token
        shift_at = np.uint64(rows[r] * shift_stride)  # window (slot, 0, 0)
        lo, hi = first * width, end * width  # the tile's k channels, c = h·d_h + i
        q, k, v = qkv[r, 0], qkv[r, 1], qkv[r, 2]  # (H, d_h) each, C-contiguous views
        k_row, shifted = k.reshape(-1), k_shift[r].reshape(-1)  # (d,) views
        if window == 3:
            _shift3_channels(shift_table, shift_at + np.uint64(3 * lo), shift_taps[lo:hi], shift_current[lo:hi],
                             k_row[lo:hi], fresh, shifted[lo:hi])  # fmt: skip
        else:
            for c in range(lo, hi):
                at, oldest = shift_at + np.uint64(c * window), np.uint64(c * tap_count + window)
                shifted[c] = _shift_input(shift_table, at, window, flat_taps, oldest, shift_current[c], k_row[c], fresh)
        for h in range(first, end):
            if width == 1:  # one pair a head: step it now, while its k is at hand
                at = np.uint64(rows[r] * slot_stride + h * span)  # Re x[0, 0, h, 0]
                if prefetching and h + ahead < end:
                    _prefetch_lines(table, at + np.uint64(ahead * span), span)
                x = table[at : at + np.uint64(span)]
                if fresh:
                    x[:] = 0.0
                u = k_shift[r, h, 0] * v[h, 0]
                out[r, h, 0] = q[h, 0] * (_modal_modes(x, h, u, lam_re, lam_im, c_re, c_im) + direct[h] * u)
            else:
                for j in range(width):
                    out[r, h, j] = 0.0
        if width == 1:
            continue
        for i in range(width):  # o_j = Σ_i q_i s_ij, summed in the order of i
            for j in range(width):
                pair = np.uint64(rows[r] * slot_stride + (i * width + j) * heads * span)  # Re x[i, j, 0, 0]
                for h in range(first, end):
                    at = pair + np.uint64(h * span)  # Re x[i, j, h, 0]
                    if prefetching and h + ahead < end:
                        _prefetch_lines(table, at + np.uint64(ahead * span), span)
                    x = table[at : at + np.uint64(span)]
                    if fresh:
                        x[:] = 0.0
                    u = k_shift[r, h, i] * v[h, j]
                    z = _modal_modes(x, h, u, lam_re, lam_im, c_re, c_im)
                    out[r, h, j] += q[h, i] * (z + direct[h] * u)


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
            y[r, c] = _shift_input(table, at, window, flat_taps, oldest_tap, weight, u[r, c], new[r]) + offset


@numba.njit(parallel=True, fastmath=True, cache=True, boundscheck=False)
def window3_step_rows(table, slot_stride, rows, new, u, taps, current, bias, y):
    """:func:`window_step_rows` for windows of three inputs (:func:`_shift3_channels`): rows outside, channels
    inside, a row's windows one contiguous stretch. Channel c = k·T + t is walked as blocks of T channels (k), each
    with the T tap rows, which spares an integer division (c mod T) per window."""
    num_rows, channels = u.shape
    tap_rows = taps.shape[0]
    for r in numba.prange(num_rows):  # one row per iteration, its channels inside
        base = np.uint64(rows[r] * slot_stride)  # window (slot, 0, 0)
        for k in range(channels // tap_rows):
            block = slice(k * tap_rows, (k + 1) * tap_rows)
            _shift3_channels(table, base + np.uint64(3 * k * tap_rows), taps, current, u[r, block], new[r],
                             y[r, block])  # fmt: skip
            for t in range(tap_rows):
                y[r, k * tap_rows + t] += bias[t]
