"""Fused kernels ``softmax_row_terms`` (``fpsim.exact.softmax.row_terms``) and ``softmax_proxy``
(``cr_softmax``'s value and bound), compiled loops over the rows.

The kernels of ``FUSED_KERNELS`` run the same operations as the exact layer's array code, in
the same order, so they give the same bits. Per row x of n float64 values:

- m = max x and ``first``, the index of its first occurrence (NumPy's argmax);
- s = x - m, err = (x - (s - bp)) + (-m - bp) with bp = s - x (TwoSum), 0 where s is not
  finite; e = ``elementary.exp(s)`` (``numba_elementary.exp_scalar``);
- eps_e = EXP_BOUND + 1.01 |err|, eps_t = max eps_e + 3 * 2**-53; top = e[first];
- t = sum(hi) + sum(lo) over rest = e with e[first] = 0 (``_sum_rows``' exact split):
  big = 1.5 * 2**(E + 12), E the exponent of max rest (frexp: max rest < 2**E),
  hi = (rest + big) - big, lo = rest - hi. The hi add exactly in any order; the lo do not,
  so they are added in NumPy's order for a row of a C-ordered array (``numpy_pairwise_sum``);
- ``softmax_proxy``: v = e / (top + t), bound = (eps_e + eps_t) + 2 * 2**-53.

Declined (None: the exact layer's code runs) where that code takes another path or where
NumPy's choice cannot be read from the values: rows wider than ``WIDEST`` (NumPy's sum) or
of no elements; inputs where some term of ``rest`` is not finite (a NaN, a second +inf, a
row of -inf: NumPy's sum again); rows whose maximum is a zero present with both signs
(which zero NumPy's max returns depends on its vector loop, and s = x - m keeps it); arrays
that are not 2-D NumPy arrays; and, in theory, an eps_e that is not finite (an err of
inf - inf, only for float64 x near 2**1024). Rows with -inf entries (attention masks) and a
finite maximum, a single +inf, and one-element rows (any value) are computed here.

Compiled without fast-math (IEEE semantics, no contraction) and releasing the GIL, as
``numba_elementary``. Numba's cache tracks this file only: after a change to
``numba_elementary.exp_scalar``, clear ``__pycache__`` (the parity tests would show it).
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import types

from ..rounding.numba_bits import scalar_bitcast

from .numba_elementary import exp_scalar

__all__ = ["softmax_row_terms", "softmax_proxy", "numpy_pairwise_sum", "EXP_BOUND", "WIDEST"]

_JIT = dict(nogil=True, cache=True, error_model="numpy")

EXP_BOUND = 2.0 ** -50            # ``elementary.EXP_BOUND`` (the tests check they are equal)
_U = 2.0 ** -53
WIDEST = 4096                     # ``_sum_rows``' exact split takes rows up to this width
_UNROLL = 8                       # NumPy's pairwise summation: 8 accumulators ...
_BLOCK = 128                      # ... on blocks of up to 128 terms (PW_BLOCKSIZE)
_MAGNITUDE = np.int64(0x7FFFFFFFFFFFFFFF)     # a float64 pattern without its sign bit
_INF_BITS = np.int64(0x7FF0000000000000)      # magnitudes from here up: inf and NaN


_bits = scalar_bitcast(types.float64, types.int64)
_from_bits = scalar_bitcast(types.int64, types.float64)


def softmax_row_terms(x):
    """(s, err, e, t, eps_e, eps_t, top) of ``fpsim.exact.softmax.row_terms`` for a 2-D float64
    NumPy array ``x`` (R, n), bit for bit, as new C-ordered float64 arrays: s, err, e, eps_e
    of shape (R, n), t, eps_t, top of shape (R, 1). None for the inputs the module doc
    lists as declined."""
    if not isinstance(x, np.ndarray) or x.ndim != 2 or not 0 < x.shape[1] <= WIDEST:
        return None
    x = np.ascontiguousarray(x, dtype=np.float64)
    s, err, e, eps_e = (np.empty_like(x) for _ in range(4))
    t, eps_t, top = (np.empty((x.shape[0], 1)) for _ in range(3))
    if not _row_terms_loop(x, s, err, e, eps_e, e.view(np.int64), t, eps_t, top):
        return None
    return s, err, e, t, eps_e, eps_t, top


@numba.njit(**_JIT)
def _row_terms_loop(x, s, err, e, eps_e, e_bits, t, eps_t, top):
    """Fills the outputs ((R, n) arrays, C order; ``e_bits`` is an int64 view of e); False
    as soon as the input is known to be declined. Row by row the maximum, then s, err and
    eps_e; exp (most of the work) in one loop over the whole array, which the compiler
    vectorises (in a row of a few elements it would run in the vector loop's scalar
    remainder: 8 ns an element instead of 1.4); then row by row the split sum. The maxima
    of nonnegative floats and the finiteness tests are integer operations on bit patterns,
    so that those loops have no branches and vectorise too."""
    rows, width = x.shape
    firsts = np.empty(rows, np.int64)
    for r in range(rows):
        m = x[r, 0]
        first = 0
        for i in range(1, width):
            if x[r, i] > m:     # a NaN never wins: declined below, unless alone in its row
                m = x[r, i]
                first = i
        if m == 0.0 and _both_zero_signs(x[r]):
            return False
        firsts[r] = first
        widest_eps = 0                  # bit patterns: eps_e > 0 where finite
        not_finite = 0
        for i in range(width):
            value = x[r, i]
            shifted = value - m
            back = shifted - value
            error = (value - (shifted - back)) + (-m - back)
            error = error if np.isfinite(shifted) else 0.0
            eps = EXP_BOUND + 1.01 * abs(error)
            s[r, i], err[r, i], eps_e[r, i] = shifted, error, eps
            widest_eps = max(widest_eps, _bits(eps))
            not_finite += (_bits(eps) & _MAGNITUDE) >= _INF_BITS
        if not_finite:                  # an err of inf - inf: only near 2**1024
            return False
        eps_t[r, 0] = _from_bits(widest_eps) + 3 * _U
    _exp_rows(s.reshape(-1), e.reshape(-1))
    lo = np.empty(width)
    plan, sums, sum_depths = _pairwise_plan(width), np.empty(64), np.empty(64, np.int64)
    for r in range(rows):
        first = firsts[r]
        largest_rest = 0                # bit patterns: e >= 0 where finite
        not_finite = 0
        for i in range(width):
            term = e_bits[r, i] & _MAGNITUDE if i != first else 0
            largest_rest = max(largest_rest, term)
            not_finite += term >= _INF_BITS
        if not_finite:
            return False
        # frexp's exponent E (max rest < 2**E; 0 for 0): rest is 0 or >= exp(-400), normal
        exponent = (largest_rest >> 52) - 1022 if largest_rest else 0
        big_bits = ((exponent + 12 + 1023) << 52) | (1 << 51)    # 1.5 * 2**(E + 12)
        big = _from_bits(big_bits)
        units = 0                       # the hi parts in units 2**(E - 40) (exact)
        for i in range(width):
            rest = e[r, i] if i != first else 0.0
            shifted_bits = _bits(rest + big)
            units += shifted_bits - big_bits
            lo[i] = rest - (_from_bits(shifted_bits) - big)
        high = units * _from_bits((exponent - 40 + 1023) << 52)
        t[r, 0] = high + _planned_sum(lo, plan, sums, sum_depths)
        top[r, 0] = e[r, first]
    return True


@numba.njit(inline="always")
def _exp_rows(flat_s, flat_e):
    """flat_e = ``elementary.exp(flat_s)``, 1-D arrays (the loop of ``numba_elementary``)."""
    for i in range(flat_s.size):
        flat_e[i] = exp_scalar(flat_s[i])


@numba.njit(inline="always")
def _both_zero_signs(row):
    """Whether ``row`` holds both +0 and -0."""
    plus = minus = False
    for value in row:
        if value == 0.0:
            if math.copysign(1.0, value) < 0:
                minus = True
            else:
                plus = True
    return plus and minus


@numba.njit(**_JIT)
def _pairwise_plan(n):
    """NumPy's pairwise summation (``@TYPE@_pairwise_sum`` in
    numpy/_core/src/umath/loops_utils.h.src), which ``numpy.sum(axis=-1)`` runs on each row
    of a C-ordered array, as a plan for ``_planned_sum``: n <= 128 terms are one block
    (``_block``); a longer run splits in two, the first part a multiple of 8 terms, each part
    summed so and the two sums added. Returns the blocks left to right, (starts, counts,
    depths) in the tree of splits (the same for every row of one width: made once)."""
    # a stack of runs still to split, the right part below the left: one entry more per
    # level of splits, each leaving parts of at most n/2 + 8 terms (64 covers any n)
    starts, counts, depths = np.empty(64, np.int64), np.empty(64, np.int64), np.empty(64, np.int64)
    starts[0], counts[0], depths[0] = 0, n, 0
    pending = 1
    blocks = []
    while pending:
        pending -= 1
        first, count, depth = starts[pending], counts[pending], depths[pending]
        if count <= _BLOCK:
            blocks.append((first, count, depth))
            continue
        half = count // 2
        half -= half % _UNROLL
        depth += 1
        starts[pending], counts[pending], depths[pending] = first + half, count - half, depth
        starts[pending + 1], counts[pending + 1], depths[pending + 1] = first, half, depth
        pending += 2
    plan = np.empty((3, len(blocks)), np.int64)
    for j, (first, count, depth) in enumerate(blocks):
        plan[0, j], plan[1, j], plan[2, j] = first, count, depth
    return plan


@numba.njit(inline="always")
def _planned_sum(a, plan, sums, sum_depths):
    """a's terms summed as ``numpy.sum`` sums a row of a C-ordered array: its identity +0
    plus the pairwise sum of ``plan`` (``_pairwise_plan(a.size)``); ``sums`` and
    ``sum_depths`` are work arrays of 64 elements."""
    if plan.shape[1] == 1:
        return 0.0 + _block(a, 0, a.size)
    done = 0                     # the sums of left parts waiting for their right sibling
    for j in range(plan.shape[1]):
        value = _block(a, plan[0, j], plan[1, j])
        depth = plan[2, j]
        # a right part completes its parent: left sibling + it, as far up as that goes
        while done and sum_depths[done - 1] == depth:
            done -= 1
            value = sums[done] + value
            depth -= 1
        sums[done], sum_depths[done] = value, depth
        done += 1
    return 0.0 + sums[0]


@numba.njit(inline="always")
def _block(a, start, n):
    """NumPy's pairwise sum of up to 128 terms: under 8 one after the other from -0; else
    eight interleaved sums combined as a tree, then the last n % 8 one by one."""
    if n < _UNROLL:
        total = -0.0
        for i in range(start, start + n):
            total += a[i]
        return total
    r0, r1, r2, r3 = a[start], a[start + 1], a[start + 2], a[start + 3]
    r4, r5, r6, r7 = a[start + 4], a[start + 5], a[start + 6], a[start + 7]
    i = start + _UNROLL
    stop = start + n - n % _UNROLL
    while i < stop:
        r0, r1, r2, r3 = r0 + a[i], r1 + a[i + 1], r2 + a[i + 2], r3 + a[i + 3]
        r4, r5, r6, r7 = r4 + a[i + 4], r5 + a[i + 5], r6 + a[i + 6], r7 + a[i + 7]
        i += _UNROLL
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < start + n:
        total += a[i]
        i += 1
    return total


def numpy_pairwise_sum(values) -> float:
    """The sum of a 1-D float64 array as ``numpy.sum`` adds a contiguous row
    (``_planned_sum``; the tests compare the two on random data)."""
    values = np.ascontiguousarray(values, dtype=np.float64)
    return float(_planned_sum(values, _pairwise_plan(values.size), np.empty(64),
                              np.empty(64, np.int64)))


def softmax_proxy(x):
    """(v, bound) of ``fpsim.exact.softmax.cr_softmax`` for a 2-D float64 NumPy array ``x``:
    v = e / (top + t) and bound = eps_e + eps_t + 2 * 2**-53 from ``softmax_row_terms(x)``,
    bit for bit, as new float64 arrays of x's shape; None where ``softmax_row_terms``
    declines x (where it takes x, every row's t is finite)."""
    terms = softmax_row_terms(x)
    if terms is None:
        return None
    _, _, e, t, eps_e, eps_t, top = terms
    _proxy_loop(e, t, eps_e, eps_t, top)
    return e, eps_e


@numba.njit(**_JIT)
def _proxy_loop(e, t, eps_e, eps_t, top):
    """e /= top + t and eps_e = (eps_e + eps_t) + 2u in place, row by row."""
    rows, width = e.shape
    for r in range(rows):
        total = top[r, 0] + t[r, 0]
        widest = eps_t[r, 0]
        for i in range(width):
            e[r, i] = e[r, i] / total
        for i in range(width):
            eps_e[r, i] = (eps_e[r, i] + widest) + 2 * _U
