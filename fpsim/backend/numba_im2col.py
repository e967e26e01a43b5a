"""The fused kernel ``unfold`` (``interface.FUSED_KERNELS``): one band of a convolution's
im2col columns, ``fpsim.autograd.im2col.unfold``, written by one compiled pass over the
band instead of one NumPy slice assignment per kernel tap over a zeroed array.

The reading rule is ``im2col.Unfolding``'s, per axis: output position p and kernel tap t
meet the virtual position v = p stride + t dilation - offset, which holds source element
v / spread where that is a whole number in [0, size), and a zero elsewhere. Per tap, the
positions that land on the source are one run of p (``_span``, the arithmetic of
``im2col._span``): every p in [first, last] (spread 1), or every spread-th p from the first
that lands (stride 1). Column f of the band's (c, i, j) order (f = c kh kw + i kw + j)
takes channel c and taps (i, j); columns whose c is beyond the source's channels are zeros.

Every output element is written, a source element or a zero, as an unsigned integer of
the float's width (views of both arrays; the output is allocated once, not zeroed), so the
bits move unchanged: -0, NaN payloads and signalling NaNs included, and the zeros are +0.
The output has the reference's layout: ``column_major`` the transpose of a C-ordered
(columns, rows) array, else C-ordered.

Speed (Numba vectorises only long loops over contiguous memory, with unsigned indices: a
signed index is checked for wraparound on every element): column-major, each (column,
sample) block of output rows is, where both axes read with stride and spread 1 and the
source's rows are as long as the output's (a "same" convolution), one run of the source
copied whole, then the columns that fell off the source's edges zeroed; elsewhere each
output row is a run of zeros, the elements that land, zeros. Row-major bands (the float64
reference mode, single columns aside): sample by sample, zeros, then each column's elements
that land.

Declined (None, the reference runs): arrays of another library or of another dtype than
native float32 / float64, other ranks, an axis with both stride and spread above 1 (the
reference's ``_span`` reads spread 1 or stride 1 only), sizes below 1, an empty or negative
column range, a negative width.
"""
from __future__ import annotations

import numba
import numpy as np
from numpy.lib.stride_tricks import as_strided

__all__ = ["unfold"]

_JIT = dict(nogil=True, cache=True, error_model="numpy")
_BITS = {np.dtype(np.float32): np.dtype(np.uint32), np.dtype(np.float64): np.dtype(np.uint64)}


def unfold(source, kernel, stride, dilation, offset, spread, batch_start, batch_stop,
           row_start, row_stop, width, first, stop, column_major):
    """``im2col.unfold(source, Unfolding(kernel, stride, dilation, offset, spread),
    slice(batch_start, batch_stop), range(row_start, row_stop), width, first, stop,
    column_major=column_major)``: the same array (shape, dtype, bits, layout), or None where
    this kernel declines the inputs (module doc)."""
    bits = _BITS.get(source.dtype) if type(source) is np.ndarray else None
    (kh, kw), (sh, sw), (dh, dw), (oh, ow), (ph, pw) = kernel, stride, dilation, offset, spread
    if (bits is None or source.ndim != 4 or min(kh, kw, sh, sw, dh, dw, ph, pw) < 1
            or (sh > 1 and ph > 1) or (sw > 1 and pw > 1) or first < 0 or stop <= first
            or width < 0):
        return None
    down, across = (kh, sh, dh, oh, ph), (kw, sw, dw, ow, pw)
    part = source[batch_start:batch_stop]
    shape = (part.shape[0], max(0, row_stop - row_start), width)
    count = stop - first
    flat, steps = _flat(part.view(bits))
    if column_major or count == 1:       # one column: the same memory either way
        stored = np.empty((count,) + shape, source.dtype)
        _fill_by_columns(flat, steps, part.shape, stored.view(bits), down, across,
                         row_start, first)
        if column_major:
            return stored.reshape(count, -1).T
        return stored.reshape(-1, count)
    stored = np.empty(shape + (count,), source.dtype)
    _fill_by_rows(flat, steps, part.shape, stored.view(bits), down, across, row_start, first)
    return stored.reshape(-1, count)


def _flat(part):
    """(a 1-D C-ordered array over ``part``'s memory from its first element, the element
    steps of its four axes): a view where every stride is a nonnegative multiple of the
    item size (a channel slice of a larger array), else over a C-ordered copy."""
    item = part.itemsize
    if part.flags.c_contiguous or part.size == 0 or any(
            step < 0 or step % item for step in part.strides):
        part = np.ascontiguousarray(part)
        _, c, h, w = part.shape
        return part.reshape(-1), (c * h * w, h * w, w, 1)
    steps = tuple(step // item for step in part.strides)
    extent = 1 + sum((size - 1) * step for size, step in zip(part.shape, steps))
    return as_strided(part, (extent,), (item,), writeable=False), steps


@numba.njit(inline="always")
def _span(lo, hi, tap, stride, spread, offset, size):
    """``im2col._span`` as numbers: (first output position, counted from lo; count; its
    step; first source element; its step) of the positions in [lo, hi) whose virtual
    position lands on the source; count 0 where none does. One of stride and spread is 1."""
    base = tap - offset
    if spread == 1:
        first = max(lo, -(base // stride))                  # ceil(-base / stride)
        last = min(hi - 1, (size - 1 - base) // stride)
        if last < first:
            return 0, 0, 1, 0, 1
        return first - lo, last - first + 1, 1, first * stride + base, stride
    first = max(lo, -base)
    first += -(first + base) % spread                       # the next multiple of spread
    last = min(hi - 1, spread * (size - 1) - base)
    if last < first:
        return 0, 0, 1, 0, 1
    return first - lo, (last - first) // spread + 1, spread, (first + base) // spread, 1


@numba.njit(inline="always")
def _spans(axis, lo, hi, size):
    """Each tap's ``_span`` along one axis, ``axis`` its (kernel, stride, dilation, offset,
    spread): a (kernel, 5) array."""
    kernel, stride, dilation, offset, spread = axis
    table = np.empty((kernel, 5), np.int64)
    for tap in range(kernel):
        span = _span(lo, hi, tap * dilation, stride, spread, offset, size)
        for k in range(5):
            table[tap, k] = span[k]
    return table


@numba.njit(inline="always")
def _zeros(out, lo, hi):
    """out[lo:hi] = 0 (unsigned indices: a loop Numba vectorises)."""
    for k in range(np.uint64(lo), np.uint64(hi)):
        out[k] = 0


@numba.njit(inline="always")
def _copy(out, at, out_step, source, read, read_step, count):
    """out[at + t out_step] = source[read + t read_step] for t < count."""
    at, out_step = np.uint64(at), np.uint64(out_step)
    read, read_step = np.uint64(read), np.uint64(read_step)
    if out_step == 1 and read_step == 1:
        for t in range(np.uint64(count)):
            out[at + t] = source[read + t]
    else:
        for t in range(np.uint64(count)):
            out[at + t * out_step] = source[read + t * read_step]


@numba.njit(**_JIT)
def _fill_by_columns(source, steps, shape, stored, down, across, row_start, first):
    """stored[f, n, r, w] (C-ordered, f counted from column ``first``) from ``source``, the
    flat memory of a ``shape`` (samples, channels, Hs, Ws) array with element ``steps``."""
    count, samples, rows, width = stored.shape
    channels = shape[1]
    step_n, step_c, step_h, step_w = steps
    by_row = _spans(down, row_start, row_start + rows, shape[2])
    by_column = _spans(across, 0, width, shape[3])
    # both axes stride and spread 1, source rows as long as the output's: blocks in one run
    whole = (down[1] == 1 and down[4] == 1 and across[1] == 1 and across[4] == 1
             and step_w == 1 and step_h == width)
    out = stored.reshape(-1)
    block = rows * width
    taps = down[0] * across[0]
    for f in range(count):
        c, tap = divmod(first + f, taps)
        i, j = divmod(tap, across[0])
        r0, height, row_step, v0, v_step = (by_row[i, 0], by_row[i, 1], by_row[i, 2],
                                            by_row[i, 3], by_row[i, 4])
        w0, length, w_step, u0, u_step = (by_column[j, 0], by_column[j, 1], by_column[j, 2],
                                          by_column[j, 3], by_column[j, 4])
        for n in range(samples):
            start = (f * samples + n) * block
            if c >= channels or height == 0 or length == 0:
                _zeros(out, start, start + block)
                continue
            read = n * step_n + c * step_c + v0 * step_h + u0 * step_w
            at = start + r0 * width
            _zeros(out, start, at)                               # rows off the source
            _zeros(out, at + ((height - 1) * row_step + 1) * width, start + block)
            if whole:
                _copy(out, at + w0, 1, source, read, 1, (height - 1) * width + length)
                for r in range(height):                          # columns off the source
                    _zeros(out, at + r * width, at + r * width + w0)
                    _zeros(out, at + r * width + w0 + length, at + (r + 1) * width)
                continue
            for k in range(height):
                row = at + k * row_step * width
                _zeros(out, row, row + width)
                _copy(out, row + w0, w_step, source, read + k * v_step * step_h,
                      u_step * step_w, length)
                if k + 1 < height:                               # rows between (spread)
                    _zeros(out, row + width, row + row_step * width)
    return stored


@numba.njit(**_JIT)
def _fill_by_rows(source, steps, shape, stored, down, across, row_start, first):
    """stored[n, r, w, f] (C-ordered): sample by sample, its block zeroed, then each column
    f's landing elements written ``count`` apart (the block stays in cache meanwhile)."""
    samples, rows, width, count = stored.shape
    channels = shape[1]
    step_n, step_c, step_h, step_w = steps
    by_row = _spans(down, row_start, row_start + rows, shape[2])
    by_column = _spans(across, 0, width, shape[3])
    out = stored.reshape(-1)
    block = rows * width * count
    taps = down[0] * across[0]
    for n in range(samples):
        _zeros(out, n * block, (n + 1) * block)
        for f in range(count):
            c, tap = divmod(first + f, taps)
            i, j = divmod(tap, across[0])
            if c >= channels:
                break                                   # and every column after it
            r0, height, row_step, v0, v_step = (by_row[i, 0], by_row[i, 1], by_row[i, 2],
                                                by_row[i, 3], by_row[i, 4])
            w0, length, w_step, u0, u_step = (by_column[j, 0], by_column[j, 1],
                                              by_column[j, 2], by_column[j, 3],
                                              by_column[j, 4])
            read = n * step_n + c * step_c + v0 * step_h + u0 * step_w
            for k in range(height):
                at = n * block + ((r0 + k * row_step) * width + w0) * count + f
                _copy(out, at, w_step * count, source, read + k * v_step * step_h,
                      u_step * step_w, length)
    return stored
