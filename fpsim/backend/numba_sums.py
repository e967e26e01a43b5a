"""``certified_row_sums``: exact row sums rounded to odd at 53 bits, compiled, row by row;
``exact_dots``: exact dot products rounded once to fp32, each summed as such a row.

The fused kernel of ``fpsim.exact.sums`` (``FUSED_KERNELS``). The rounded-to-odd exact sum
rodd(S) is unique, so this loop need not repeat the NumPy certificate's steps, only be exact
where it says ``decided``. Per row of n finite terms, four tiers, each tried where the ones
before cannot settle the row (TwoSum: s = fl(a + b) and the exact error a + b - s, a float64
barring overflow, subnormals included):

    split (two levels of the AccSum extraction the NumPy certificate uses, summed as
        integers): L = ceil(log2 n), every |x| < 2**(F - 1022) for F the largest exponent
        field, so sum |x| < 2**(e - 1) with e = F - 1021 + L (clamped to >= -1000; rows with
        e > 1019 are left to the next tiers). big = 1.5 * 2**(e + 1): x + big stays inside
        big's binade, where floats are the multiples of q = 2**(e - 51), so y = fl(x + big) is
        a multiple of q, (y - big) / q is the difference of the two bit patterns (an
        integer, |.| < 2**50 + 1), h = y - big is exact (Sterbenz) and lo = x - h is exact,
        |lo| <= q / 2. The lo parts again with e2 = e - 50 + L (sum |lo| <= n q / 2 <
        2**(e2 - 1)), q2 = 2**(e2 - 51): lo = h2 + lo2, |lo2| <= q2 / 2. Integer sums K, K2
        give S = K q + K2 q2 + R exactly, both products exact floats, |R| <= n q2 / 2 <=
        2**(L - 1) q2 = B. (S1, t) = TwoSum(K q, K2 q2). Decided where every lo2 is zero
        (R = 0: residual t) or |t| > B: S - S1 has t's sign and |S - S1| < 2 |t|, at most the
        gap from S1 to its neighbour on that side (S1 is the float64 nearest S1 + t), so
        round_to_odd(S1, t) is rodd(S). No floating-point reduction: both passes vectorise.
    compensated (g = n 2**-52 >= gamma_{n-1} / (1 - gamma_{n-1}), with room for the rounding
        of err itself): s += x with error e, c += e, m += |e|, A += |x|. S = s + E exactly,
        E the sum of the e, |c - E| <= err = g m + 2**-1074. (S1, t) = TwoSum(s, c), so
        S = S1 + t + (E - c). Decided where m = 0 (S = s) or |t| > err (residual t, as above).
    cascade (sums that are floats, or nearly, after inexact steps): also c += e with error
        e2, c2 += e2, m2 += |e2|: S = S1 + t + E2, |c2 - E2| <= err2 = g m2 + 2**-1074.
        Decided where m2 = 0 (residual t, exact), where |t| > 2 (|c2| + err2) (residual t:
        |E2| < |t|, as above), or where t = 0, |c2| > 2 err2 and 2 |c2| < 2**-54 |S1|
        (residual c2: E2 has c2's sign and is below the gap on either side of S1).
    expansion (the rest): Shewchuk's GROW-EXPANSION with zero elimination (``math.fsum``'s
        partials: nonoverlapping, increasing magnitude), read from the top: S1 = the exact sum
        of the partials so far until TwoSum(S1, p) leaves an error t != 0. t is a multiple of
        p's lowest bit (so is every operand), and the partials below p sum to less than that
        bit, so S = S1 + t + (less than |t|): round_to_odd(S1, t).

Rules of ``fpsim.exact.sums`` kept: a row is taken only where no partial sum can overflow
(the split's e <= 1019; the other tiers' A = fl(sum |x|) < 2**1019; rows with inf or NaN
terms fail both), and its value only where it is an exact zero or |S1| >= 2**-960 (there the
limbs' value is rodd(S) too); the others are left undecided, with NaN values. A zero sum is
-0 where every term is -0 (and there is one), else +0 (``fpsim.exact.sums.zero_sum``).
Compiled without fast-math: IEEE semantics, no contraction. The later tiers run one lane a
row (Numba vectorises no floating-point reduction without fast-math; two to four interleaved
lanes measured at most 15 % faster) and take the rows the split leaves: those whose bits
below its two levels (B is about 2**(2L - 100) times the largest |x|) may outweigh t, and
those with e > 1019.

``exact_dots`` (``numba_dots``) is ``fpsim.exact.open_elements.exact_elements``' exact
step: for each element (i, j) of a @ b, the K products a_ik b_kj, exact in float64 for
float32 values (24 + 24 bits), fill one scratch row (and give their largest magnitude, the
split's first pass), which the tiers sum as above, so no (elements, K) array is made;
rodd(S) is then rounded once to fp32, the same as rounding S once (53 >= 24 + 2; beyond
fp32's range: inf). Its split has a third level: the lo2 parts split again at
e3 = e2 - 50 + L (sum |lo2| <= n q2 / 2 < 2**(e3 - 1)), q3 = 2**(e3 - 51), K3 their integer
sum, so S = K q + K2 q2 + K3 q3 + R3, |R3| <= 2**(L - 1) q3; decided where every lo3 is zero
and K3 = 0 (residual t) or where |t| > (|K3| + 2**(L - 1)) q3 (an integer below 2**53 times
q3: exact), the bound on S - S1 - t. Open elements are mostly sums that cancel far below
n max |x|, where two levels' B is near t: in a K = 65,536 weight gradient of the residual
CNN two levels decided 23 % of them, three all (the compensated tiers take three times as
long as the split). Rows keep two levels: their sums (squares) rarely need more, and a
third costs them 16 to 30 %. The compiled loop, ``dot_rows``, lives in this file because
Numba's cache tracks only the compiled function's own file: a loop elsewhere inlining these
tiers would keep running a stale copy of them after they change.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import types

from ..rounding.numba_bits import scalar_bitcast

__all__ = ["certified_row_sums", "row_sums_by", "dot_rows", "tier_switches", "TIERS"]

_JIT = dict(nogil=True, cache=True, error_model="numpy")
_TINY = 2.0 ** -960                  # smallest nonzero |S1| decided (module doc)
_HUGE = 2.0 ** 1019                  # sum |x| at or above it: left undecided (overflow)
_EXPONENT_LOW, _EXPONENT_HIGH = -1000, 1019     # the split's clamp on e and its bound
#: the module doc's tiers, in the order they are tried
TIERS = ("split", "compensated", "cascade", "expansion")
_MAGNITUDE = np.int64(0x7FFFFFFFFFFFFFFF)     # a float64 pattern without its sign bit


def certified_row_sums(terms):
    """(values, decided) for a 2-D float64 NumPy array of finite terms: where ``decided``,
    the row's exact sum rounded to odd at 53 bits; elsewhere NaN (sum |x| >= 2**1019, sums
    below 2**-960 in magnitude but not zero, terms that are not finite). None (declined) for
    arrays of another library: the caller's own code runs."""
    if not isinstance(terms, np.ndarray):
        return None
    return row_sums_by(terms, TIERS)


def row_sums_by(terms, tiers):
    """``certified_row_sums`` by the ``tiers`` named (some of ``TIERS``) only, so that tests
    can check each tier on every kind of row: rows none of them settles are undecided."""
    terms = np.ascontiguousarray(terms, dtype=np.float64)
    if terms.ndim != 2:
        raise ValueError(f"certified_row_sums expects a 2-D array of rows, got {terms.shape}")
    values = np.empty(terms.shape[0], np.float64)
    decided = np.empty(terms.shape[0], np.bool_)
    _sum_rows(terms, values, decided, *tier_switches(tiers))
    return values, decided


def tier_switches(tiers) -> tuple:
    """For each of ``TIERS``, whether it is among ``tiers`` (the kernels' switches)."""
    unknown = set(tiers) - set(TIERS)
    if unknown:
        raise ValueError(f"tiers {sorted(unknown)} are not among {TIERS}")
    return tuple(tier in tiers for tier in TIERS)


@numba.njit(**_JIT)
def dot_rows(a_lines, b_lines, a_index, b_index, values, decided, split, compensated,
             cascade, expansion):
    """``fpsim.backend.numba_dots.exact_dots``' loop (module doc): element e is the dot
    product of a_lines[a_index[e]] and b_lines[b_index[e]] (C-ordered lines along K, b's
    columns as rows); its fp32 value (NaN where undecided) goes to ``values[e]``, whether it
    is decided to ``decided[e]``. Here, beside the tiers it calls, so that Numba's cache
    (which tracks this file) stays coherent."""
    width = a_lines.shape[1]
    products = np.empty(width, np.float64)
    partials = np.empty(width + 1, np.float64)
    g, levels = _factors(width)
    for e in range(a_index.shape[0]):
        x, y = a_lines[a_index[e]], b_lines[b_index[e]]
        top = np.int64(0)
        for k in range(width):
            p = np.float64(x[k]) * np.float64(y[k])
            products[k] = p
            top = max(top, _bits(p) & _MAGNITUDE)
        value, decided[e] = _row_sum(products, top, g, levels, partials, True, split,
                                     compensated, cascade, expansion)
        values[e] = np.float32(value)      # rodd(S) to fp32: S rounded once (NaN: undecided)


@numba.njit(**_JIT)
def _sum_rows(terms, values, decided, split, compensated, cascade, expansion):
    width = terms.shape[1]
    partials = np.empty(width + 1, np.float64)    # the expansion's, at most one per term
    g, levels = _factors(width)
    for i in range(terms.shape[0]):
        row = terms[i]
        top = np.int64(0)
        for j in range(width):
            top = max(top, _bits(row[j]) & _MAGNITUDE)
        values[i], decided[i] = _row_sum(row, top, g, levels, partials, False, split,
                                         compensated, cascade, expansion)


@numba.njit(**_JIT)
def _factors(width):
    """(g, L): the compensated tiers' error factor n 2**-52 and L = ceil(log2 n)."""
    levels = 0
    while (1 << levels) < width:
        levels += 1
    return width * 2.0 ** -52, levels


@numba.njit(inline="always")
def _row_sum(row, top, g, levels, partials, deep, split, compensated, cascade, expansion):
    """(rodd(S) or NaN, decided) of one row by the tiers switched on; ``top`` is the largest
    magnitude pattern of its terms, ``partials`` the expansion's buffer (a float64 more than
    the row's terms), ``deep``: the split with its third level."""
    near, residual, settled, nonzero = 0.0, 0.0, False, True
    if split:
        near, residual, settled, nonzero = _split(row, top, levels, deep)
    if not settled:
        mass, near, residual, settled = _compensated(row, g)
        nonzero = mass != 0
        fits = mass < _HUGE                     # no overflow (False for inf, NaN terms)
        settled = settled and compensated and fits
        if fits and not settled and cascade:
            near, residual, settled = _cascade(row, g)
        if fits and not settled and expansion:
            near, residual = _expansion(row, partials)
            settled = True
    zero = near == 0 and residual == 0          # an exact zero sum
    if not (settled and (zero or abs(near) >= _TINY)):
        return np.nan, False
    if zero:
        return _zero_sum(row, nonzero), True
    return _round_to_odd(near, residual), True


@numba.njit(inline="always")
def _two_sum(a, b):
    s = a + b
    b_virtual = s - a
    return s, (a - (s - b_virtual)) + (b - b_virtual)


@numba.njit(**_JIT)
def _split(row, top, levels, deep):
    """(S1, residual, settled, any nonzero term): the module doc's first tier, given the
    largest magnitude pattern ``top`` (the caller's pass: an integer maximum); with ``deep``,
    its third level. One pass without floating-point reductions (integer sums), which
    vectorises."""
    if top == 0:                                    # every term +-0 (or none): S = 0
        return 0.0, 0.0, True, False
    e = max((top >> np.int64(52)) - 1021 + levels, _EXPONENT_LOW)
    e2 = max(e - 50 + levels, _EXPONENT_LOW)
    e3 = max(e2 - 50 + levels, _EXPONENT_LOW)
    if e > _EXPONENT_HIGH:                          # (inf and NaN terms too)
        return 0.0, 0.0, False, True
    big, big2, big3 = (1.5 * _power_of_two(e + 1), 1.5 * _power_of_two(e2 + 1),
                       1.5 * _power_of_two(e3 + 1))
    k = k2 = k3 = rest = np.int64(0)
    if deep:
        for j in range(row.shape[0]):
            units, lo = _extract(row[j], big)
            k += units
            units, lo = _extract(lo, big2)
            k2 += units
            units, lo = _extract(lo, big3)
            k3 += units
            rest |= _bits(lo) << np.int64(1)        # nonzero where some lo3 is
    else:
        for j in range(row.shape[0]):
            units, lo = _extract(row[j], big)
            k += units
            units, lo = _extract(lo, big2)
            k2 += units
            rest |= _bits(lo) << np.int64(1)        # nonzero where some lo2 is
    # K q and K2 q2 are exact: |K|, |K2| < 2**50 + n / 2, q and q2 powers of two >= 2**-1051
    q, q2 = _power_of_two(e + 1) * 2.0 ** -52, _power_of_two(e2 + 1) * 2.0 ** -52
    near, t = _two_sum(np.float64(k) * q, np.float64(k2) * q2)
    if rest == 0 and k3 == 0:
        return near, t, True, True
    if deep:            # |t| > (|K3| + 2**L / 2) q3: an integer below 2**53 times a power of 2
        bound = (abs(np.float64(k3)) + _power_of_two(levels - 1)) * _power_of_two(e3 - 51)
    else:               # |t| > 2**L q2 / 2
        bound = _power_of_two(levels - 1) * q2
    return near, t, abs(t) > bound, True


@numba.njit(inline="always")
def _extract(x, big):
    """(units, lo): x = units q + lo exactly, q the quantum of big's binade, |lo| <= q / 2,
    where |x| < big / 6 (module doc: y = fl(x + big) stays in that binade)."""
    y = x + big                                     # a multiple of q
    return _bits(y) - _bits(big), x - (y - big)     # (y - big) / q; y - big exact (Sterbenz)


@numba.njit(**_JIT)
def _compensated(row, g):
    """(sum |x|, S1, residual, settled): the module doc's second tier."""
    s = c = m = mass = 0.0
    for j in range(row.shape[0]):
        x = row[j]
        mass += abs(x)
        s, e = _two_sum(s, x)
        c += e
        m += abs(e)
    near, t = _two_sum(s, c)
    if m == 0:
        return mass, s, 0.0, True
    return mass, near, t, abs(t) > m * g + 2.0 ** -1074


@numba.njit(**_JIT)
def _cascade(row, g):
    """(S1, residual, settled): the module doc's third tier."""
    s = c = c2 = m2 = 0.0
    for j in range(row.shape[0]):
        s, e = _two_sum(s, row[j])
        c, e2 = _two_sum(c, e)
        c2 += e2
        m2 += abs(e2)
    near, t = _two_sum(s, c)
    if m2 == 0:
        return near, t, True
    err = m2 * g + 2.0 ** -1074
    if abs(t) > 2 * (abs(c2) + err):
        return near, t, True
    if t == 0 and abs(c2) > 2 * err and 2 * abs(c2) < abs(near) * 2.0 ** -54:
        return near, c2, True
    return near, t, False


@numba.njit(**_JIT)
def _expansion(row, partials):
    """(S1, residual) of the row's exact sum S from its nonoverlapping expansion (module
    doc): S1 the float64 sum of the partials down to the first inexact addition, residual
    the sign-bearing rest (0 exactly when S1 = S)."""
    count = 0
    for j in range(row.shape[0]):
        x = row[j]
        kept = 0
        for k in range(count):
            y = partials[k]
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)                # exact: |x| >= |y| (Fast2Sum)
            if lo != 0:
                partials[kept] = lo
                kept += 1
            x = hi
        partials[kept] = x
        count = kept + 1
    if count == 0:
        return 0.0, 0.0
    near = partials[count - 1]
    for k in range(count - 2, -1, -1):
        near, t = _two_sum(near, partials[k])
        if t != 0:
            return near, t
    return near, 0.0


@numba.njit(inline="always")
def _zero_sum(row, nonzero):
    """-0 where every term is -0 (none nonzero, every sign bit set, width > 0), else +0."""
    if nonzero or row.shape[0] == 0:
        return 0.0
    for j in range(row.shape[0]):
        if not np.signbit(row[j]):
            return 0.0
    return -0.0


@numba.njit(inline="always")
def _round_to_odd(near, residual):
    """``fpsim.exact.odd_rounding.round_to_odd`` for one finite value: near's neighbour
    toward zero (one pattern down where the residual points toward zero), last bit set."""
    if residual == 0:
        return near
    pattern = _bits(near)
    if np.signbit(residual) != np.signbit(near):
        pattern -= np.int64(1)
    return _from_bits(pattern | np.int64(1))


_bits = scalar_bitcast(types.float64, types.int64)
_from_bits = scalar_bitcast(types.int64, types.float64)


@numba.njit(inline="always")
def _power_of_two(e):
    """2.0**e for a normal power, -1022 <= e <= 1023, from its exponent field."""
    return _from_bits(np.int64(e + 1023) << np.int64(52))
