"""The fused kernel ``widen_with_norms``: ``fpsim.exact.widening.widen_with_norms``'s copy of a
float32 operand into its float64 work buffer, its lines' sums of squares and, on request, their
``lowest_bit_patterns`` (``fpsim.exact.certificate``), in compiled loops (Numba, imported on
first use where Numba is installed: ``NumpyBackend.fused``): the copy and the sums in one pass,
the patterns in a second over the float32 operand (still in cache).

The copy is exact (every float32 is a float64), and so is each square of a float32 value in
float64 (48 significant bits at most, exponents far inside float64's range); only the sums
round, and they may run in any order: the certificate's bound on the norms holds for every
order (``fpsim.exact.fast_matmul``'s docstring, (1)). A column's sum runs in row order; a
row's in the order the compiler picks: its loop alone carries fast-math's ``reassoc`` flag
(Numba vectorises no floating-point reduction without it; measured three times faster on
rows of 64), which may reorder the additions and nothing else here (no contraction, and a
fused multiply-add would give the same bits anyway, the squares being exact). Every other
loop is compiled without fast-math: IEEE semantics. The patterns are the NumPy code's
operations on each element, the same bits for every input, inf and NaN included (one float32
subtraction, an IEEE operation; an integer minimum is the same in any order)::

    mag = bits(x) & 0x7FFFFFFF;  low = (mag - 1) & mag;  pattern = bits(f32(low) - f32(mag))

``tests/test_fused_widening.py`` forces both paths and compares bits.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import types

from ..rounding.numba_bits import scalar_bitcast

__all__ = ["widen_with_norms"]

_JIT = dict(nogil=True, cache=True, error_model="numpy")
_ABOVE_ALL = np.int32(0x7FFFFFFF)    # the minimums' start: no pattern is above it


def widen_with_norms(x, out, axis, quanta):
    """(squares, patterns): each line's (along ``axis``: 1 rows, 0 columns) sum of squares of
    the 2-D float32 ``x``'s values in float64, summed in some order (module docstring), and
    with ``quanta`` its ``lowest_bit_patterns``, else None; ``out`` (float64, x's shape, C- or
    F-ordered) receives x's values. None (declined: the caller's own code runs) for arrays
    that are not NumPy's, other dtypes or shapes, empty arrays, an ``out`` that is neither
    C- nor F-contiguous or is read-only."""
    if type(x) is not np.ndarray or type(out) is not np.ndarray or axis not in (0, 1):
        return None
    if (x.dtype != np.float32 or out.dtype != np.float64 or x.ndim != 2
            or out.shape != x.shape or x.size == 0 or not out.flags.writeable):
        return None
    # the loops run along out's memory order: in x's orientation where out is C-ordered,
    # on the transposes where it is F-ordered (both then C-ordered)
    if out.flags.c_contiguous:
        src, dst, along_rows = x, out, axis == 1
    elif out.flags.f_contiguous:
        src, dst, along_rows = x.T, out.T, axis == 0
    else:
        return None
    src = np.ascontiguousarray(src)   # a copy only for x laid out unlike out (strided)
    lines = src.shape[0] if along_rows else src.shape[1]
    squares = np.empty(lines, np.float64)
    (_widen_rows if along_rows else _widen_columns)(src, dst, squares)
    if not quanta:
        return squares, None
    patterns = np.empty(lines, np.int32)
    (_row_patterns if along_rows else _column_patterns)(src.view(np.int32), patterns)
    return squares, patterns


@numba.njit(fastmath={"reassoc"}, **_JIT)
def _widen_rows(src, dst, squares):
    """Row by row of the C-ordered src: the copy into dst and the row's sum of squares, a
    reduction the compiler may reorder (``reassoc``, the one fast-math flag, on this loop
    alone: it vectorises the sum; the squares are exact, so no other value can change)."""
    lines, width = src.shape
    for i in range(lines):
        row, wide = src[i], dst[i]
        total = 0.0
        for j in range(width):
            value = np.float64(row[j])
            wide[j] = value
            total += value * value
        squares[i] = total


@numba.njit(**_JIT)
def _row_patterns(src_bits, patterns):
    """Each row's smallest ``_pattern`` (an integer minimum: vectorised, any order the same;
    from ``_ABOVE_ALL``, above which no line of one element or more leaves it)."""
    lines, width = src_bits.shape
    for i in range(lines):
        row_bits = src_bits[i]
        smallest = _ABOVE_ALL
        for j in range(width):
            smallest = min(smallest, _pattern(row_bits[j]))
        patterns[i] = smallest


@numba.njit(**_JIT)
def _widen_columns(src, dst, squares):
    """Row by row of the C-ordered src, each element copied and its square added to its
    column's sum (elementwise across the row: vectorised, the sums in row order)."""
    lines, width = src.shape
    squares[:] = 0.0
    for i in range(lines):
        row, wide = src[i], dst[i]
        for j in range(width):
            value = np.float64(row[j])
            wide[j] = value
            squares[j] += value * value


@numba.njit(**_JIT)
def _column_patterns(src_bits, patterns):
    """Each column's smallest ``_pattern``, row by row (elementwise across the row)."""
    lines, width = src_bits.shape
    patterns[:] = _ABOVE_ALL
    for i in range(lines):
        row_bits = src_bits[i]
        for j in range(width):
            patterns[j] = min(patterns[j], _pattern(row_bits[j]))


@numba.njit(inline="always")
def _pattern(bits):
    """``lowest_bit_patterns``' value for one element's int32 pattern: the int32 pattern of
    f32(|x| less its lowest set bit) - f32(|x|) (-d, or +0 for x = +-0)."""
    mag = bits & np.int32(0x7FFFFFFF)
    low = (mag - np.int32(1)) & mag
    return _bits32(_from_bits32(low) - _from_bits32(mag))


_bits32 = scalar_bitcast(types.float32, types.int32)
_from_bits32 = scalar_bitcast(types.int32, types.float32)
