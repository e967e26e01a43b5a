"""``exact_dots``: exact dot products of chosen elements of a @ b rounded once to fp32, compiled.

The fused kernel of ``fpsim.exact.open_elements.exact_elements`` (``FUSED_KERNELS``): each
element's products summed exactly by ``certified_row_sums``' tiers, whose loop for dot
products, ``numba_sums.dot_rows``, lives beside them (its module doc: the products, the
split's third level, why that file). Here: the checks of the inputs, and the operand lines
the loop reads, C-ordered along K: a's rows and b's columns as they are where they are
contiguous (a C-ordered, b F-ordered), else copies of the distinct lines the elements read,
gathered in one blocked pass (reading a strided line for every element would fetch a cache
line per product, K = 65,536 of them, from a line no cache holds).
"""
from __future__ import annotations

import numba
import numpy as np

from .numba_sums import TIERS, dot_rows, tier_switches

__all__ = ["exact_dots", "dots_by"]

_JIT = dict(nogil=True, cache=True, error_model="numpy")


def exact_dots(a, b, rows, cols):
    """(values, decided) for the elements (rows[e], cols[e]) of a @ b, a (R, K) and b (K, C)
    float32 or float64 NumPy arrays (any layout), rows and cols integer arrays of one length
    E: where ``decided``, the element's exact dot product (its products taken in float64:
    exact for float32 values) rounded once to fp32, nearest even (inf beyond fp32's range,
    -0 where every product is -0); elsewhere NaN (the tiers' rules: sum |a_ik b_kj| of
    2**1019 or more, or not finite, sums below 2**-960 but not zero: never for finite float32
    values). None (declined) for arrays of another library, other dtypes or shapes, K = 0,
    indices out of range."""
    arrays = (a, b, rows, cols)
    if not (all(isinstance(x, np.ndarray) for x in arrays) and a.ndim == b.ndim == 2
            and rows.ndim == cols.ndim == 1 and rows.shape == cols.shape
            and a.dtype in _OPERANDS and b.dtype in _OPERANDS and rows.dtype.kind in "iu"
            and cols.dtype.kind in "iu" and 0 < a.shape[1] == b.shape[0] < 1 << 40
            and _within(rows, a.shape[0]) and _within(cols, b.shape[1])):
        return None
    return dots_by(a, b, rows, cols, TIERS)


def dots_by(a, b, rows, cols, tiers):
    """``exact_dots`` (inputs unchecked) by the ``tiers`` named (some of
    ``numba_sums.TIERS``) only, as ``row_sums_by``, so that tests can check each tier on dot
    products: elements none of them settles are undecided."""
    a_lines, a_index = _lines(a, rows)
    b_lines, b_index = _lines(b.T, cols)
    values = np.empty(rows.shape[0], np.float32)
    decided = np.empty(rows.shape[0], np.bool_)
    dot_rows(a_lines, b_lines, a_index, b_index, values, decided, *tier_switches(tiers))
    return values, decided


_OPERANDS = (np.dtype(np.float32), np.dtype(np.float64))


def _within(index, count: int) -> bool:
    return _in_range(np.asarray(index, np.int64), count)


@numba.njit(**_JIT)
def _in_range(index, count):
    for i in range(index.shape[0]):
        if not 0 <= index[i] < count:
            return False
    return True


def _lines(x, index):
    """(C-ordered lines of x, each element's line among them): x itself, or the distinct
    lines the elements read (module doc)."""
    if x.flags.c_contiguous:
        return x, np.asarray(index, np.int64)
    distinct, inverse = _distinct(np.asarray(index, np.int64), x.shape[0])
    lines = np.empty((distinct.shape[0], x.shape[1]), x.dtype)
    _gather(x, distinct, lines)
    return lines, inverse


@numba.njit(**_JIT)
def _distinct(index, count):
    """(the distinct values of ``index`` in [0, count), ascending; each one's place among
    them), without a sort."""
    place = np.zeros(count, np.int64)
    for i in range(index.shape[0]):
        place[index[i]] = 1
    distinct = np.flatnonzero(place)
    for i in range(distinct.shape[0]):
        place[distinct[i]] = i
    inverse = np.empty(index.shape[0], np.int64)
    for i in range(index.shape[0]):
        inverse[i] = place[index[i]]
    return distinct, inverse


@numba.njit(**_JIT)
def _gather(x, distinct, lines):
    """lines[i] = x[distinct[i]], 64 columns at a time: the cache lines a block reads (x
    F-ordered: neighbouring rows share them) serve every distinct row before they leave."""
    width = x.shape[1]
    for start in range(0, width, 64):
        stop = min(width, start + 64)
        for i in range(distinct.shape[0]):
            line = distinct[i]
            for k in range(start, stop):
                lines[i, k] = x[line, k]
