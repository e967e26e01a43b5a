"""The fused kernel ``certify_fp32_open``: ``fpsim.exact.certificate.certify_fp32_open`` as
one compiled loop over the product (and a second look at the rows with open elements only),
Numba (imported on first use, where Numba is installed: ``NumpyBackend.fused``).

Per element (i, j), in this order, each step one IEEE operation as the NumPy code does it::

    w    = fl64(width_rows[i] * width_cols[j])          (width_cols[row_blocks[i], j])
    up   = fl32(fl64(approx[i, j] + w))   -> high[i, j]
    down = fl32(fl64(approx[i, j] - w))
    open where the bit patterns of down and up differ: (i N + j, down, up) appended in C order

The NumPy function first tries one wide width W >= w per chunk and takes w only where W's
ends differ; its docstring proves that the same as w throughout, which holds where every
width is > 0: then W = fl(max rows * max cols) >= w >= 0 (rounded products are monotonic) and
fl32(fl64(x -+ W)) enclose fl32(fl64(x -+ w)). Its outer product may be an einsum, which
adds each product to a zeroed output: +0 + p = p for every p but -0, and products of positive
widths are never -0. For widths that are not all > 0 (NaN, zeros, negative values) its result
depends on how the chunks fall, so this kernel declines them: it returns None and the exact
layer runs its own code, as it does for what the kernel is not written for (arrays that are
not NumPy's, other dtypes, other shapes, empty products, block numbers outside the blocks, a
read-only ``high``). Everything else is taken as the NumPy code takes it: approx may hold
inf and NaN (x -+ w then give IEEE's inf and NaN, a NaN x the same NaN at both ends),
and ends beyond float32's range are inf (float64 -> float32 casts round to nearest even,
overflowing to inf, on both paths). Compiled without fast-math: no contraction, IEEE
semantics. ``tests/test_fused_certificate.py`` forces both paths and compares bits.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import types

from ..rounding.numba_bits import scalar_bitcast

__all__ = ["certify_fp32_open"]

_JIT = dict(nogil=True, cache=True, error_model="numpy")
_NO_BLOCKS = np.zeros(0, np.intp)    # the block numbers of an unbatched product (unread)


def certify_fp32_open(approx, width_rows, width_cols, high, row_blocks=None):
    """``fpsim.exact.certificate.certify_fp32_open``'s (open, low, high_open), the same bits,
    with ``high`` written the same way; None where this kernel declines the inputs (module
    docstring): the caller then runs the reference code."""
    arrays = (approx, width_rows, width_cols, high)
    if any(type(x) is not np.ndarray for x in arrays) or (
            row_blocks is not None and type(row_blocks) is not np.ndarray):
        return None
    if (approx.dtype != np.float64 or width_rows.dtype != np.float64
            or width_cols.dtype != np.float64 or high.dtype != np.float32
            or approx.ndim != 2 or approx.size == 0 or not high.flags.writeable):
        return None
    lines, n = approx.shape
    if width_rows.shape != (lines,) or high.shape != (lines, n):
        return None
    if row_blocks is None:
        if width_cols.shape != (n,):
            return None
        columns, blocks, batched = width_cols.reshape(1, n), _NO_BLOCKS, False
    else:
        if (width_cols.ndim != 2 or width_cols.shape[0] == 0 or width_cols.shape[1] != n
                or row_blocks.shape != (lines,) or row_blocks.dtype.kind not in "iu"):
            return None
        columns, blocks, batched = width_cols, row_blocks.astype(np.intp, copy=False), True
    # the kernel's arrays are C-ordered (one compiled version); high is written in place
    # where it is (the callers' own arrays are), else through a C-ordered copy
    target = high if high.flags.c_contiguous else np.empty((lines, n), np.float32)
    width_rows, columns = np.ascontiguousarray(width_rows), np.ascontiguousarray(columns)
    blocks = np.ascontiguousarray(blocks)
    if not _proven_for(width_rows, columns, blocks, batched):
        return None
    found = _open_elements(np.ascontiguousarray(approx), width_rows, columns, blocks, batched,
                           target)
    if target is not high:
        np.copyto(high, target)
    return found


@numba.njit(**_JIT)
def _proven_for(width_rows, width_cols, row_blocks, batched):
    """Whether every width is > 0 (not NaN) and, where ``batched``, every block number names
    a row of ``width_cols``: the inputs this kernel gives the NumPy code's bits for."""
    for i in range(width_rows.shape[0]):
        if not width_rows[i] > 0:
            return False
        if batched and not 0 <= row_blocks[i] < width_cols.shape[0]:
            return False
    for b in range(width_cols.shape[0]):
        for j in range(width_cols.shape[1]):
            if not width_cols[b, j] > 0:
                return False
    return True


@numba.njit(**_JIT)
def _open_elements(approx, width_rows, width_cols, row_blocks, batched, high):
    """The loop of ``certify_fp32_open`` on C-ordered arrays whose widths ``_proven_for``
    accepts: width_cols is (blocks, N), row i takes its row ``row_blocks[i]`` where
    ``batched``, else row 0.

    Row by row: a pass writes the row of ``high`` and a byte per element, 1 where the ends
    differ, and counts them; it has no branch, so the compiler vectorises it. Where the row
    has open elements, its flags are read eight at a time (a zero word skips eight elements)
    and each open element's ends are computed again (the same operations, the same bits) into
    the results. These have room for every element (left uninitialised: only the open ones
    are written, then copied out): measured faster than counting first and filling in a
    second pass, and than buffers that grow (ten times slower inside the hot loop)."""
    lines, n = approx.shape
    where = np.empty(lines * n, np.intp)
    low_open = np.empty(lines * n, np.float32)
    high_open = np.empty(lines * n, np.float32)
    words = (n + 7) // 8
    differ = np.zeros(words * 8, np.uint8)   # padded to whole uint64 words, the padding 0
    differ_words = differ.view(np.uint64)
    found = 0
    for i in range(lines):
        width_cols_row = width_cols[row_blocks[i] if batched else 0]
        width_row = width_rows[i]
        opened = 0
        for j in range(n):
            down, up = _ends(approx[i, j], width_row * width_cols_row[j])
            high[i, j] = up
            flag = _bits32(down) != _bits32(up)
            differ[j] = flag
            opened += flag
        if opened == 0:
            continue
        for word in range(words):
            if differ_words[word] == 0:
                continue
            for j in range(word * 8, min(n, word * 8 + 8)):
                if differ[j]:
                    down, up = _ends(approx[i, j], width_row * width_cols_row[j])
                    where[found] = i * n + j
                    low_open[found] = down
                    high_open[found] = up
                    found += 1
    return where[:found].copy(), low_open[:found].copy(), high_open[:found].copy()


@numba.njit(inline="always")
def _ends(x, w):
    """fl32(fl64(x - w)), fl32(fl64(x + w)): float64 arithmetic, each result cast once."""
    return np.float32(x - w), np.float32(x + w)


#: a float32 scalar's bit pattern as a uint32: the ends are compared by their bits, signed
#: zeros and NaN payloads included
_bits32 = scalar_bitcast(types.float32, types.uint32)
