"""Exact sums of float64 terms, returned as the round-to-odd float64 of the exact value.

Why round-to-odd: a value rounded to odd at 53 bits and then rounded once more, in any
mode, to a format of at most 51 significand bits gives the same result as rounding the exact
value directly (Boldo & Melquiond, "Emulation of FMA and correctly rounded sums: proved
algorithms using rounding to odd", IEEE TC 2008). Every fpsim format has at most 24 bits, so
``round_to(round_to_odd_sum(terms), fmt, mode)`` is the one correct rounding of the exact sum.

Algorithm (no big-number library; NumPy integers only)::

    each finite float64 term is m * 2**(E - 1075), |m| < 2**53, E = max(exponent field, 1)
    split m * 2**(E mod 32) over three 32-bit limbs at limb index E // 32 (two's complement,
        so the low limbs are in [0, 2**32) and the top one carries the sign)
    add the limbs of all terms of a row with bincount in float64 -- exact, because every
        weight is an integer below 2**32 and a pass adds at most 2**20 of them (< 2**53)
    propagate carries (int64) until every limb but the top one is in [0, 2**32);
        a negative top limb means a negative sum: negate and propagate again
    from the highest nonzero limb take 53 bits, OR the rest into the last bit (round to odd)

Zero: an exact sum of zero is +0, except that a row whose terms are all -0 sums to -0
(IEEE 754-2019 section 6.3: x + (-x) is +0 under round-to-nearest; -0 + -0 is -0).

Precondition: terms are finite and every nonzero partial result is above 2**-1022 in
magnitude (true for float32 values and for products of two float32 values, which are
multiples of 2**-298), so the result is never a float64 subnormal.

Certificate first (``_certified_rows``), limbs only for the rows it cannot decide. Two
error-free splits (the extraction step of Rump, Ogita and Oishi's AccSum, "Accurate
floating-point summation part I", SIAM J. Sci. Comput. 31(1), 2008) and float64 sums:

    split: per row of n terms, A = fl(sum |x|) in any order, A < 2**e (frexp). A >= max |x|
        (adding nonnegative values never rounds below a summand) and sum |x| <= A / (1 -
        gamma_{n-1}). With big = 1.5 * 2**(e + 1), fl(big + x) lies in [2**(e + 1),
        2**(e + 2)], so hi = fl(big + x) - big is exact (Sterbenz), a multiple of
        q = 2**(e - 51) within q/2 of x, and lo = x - hi is exact (|lo| <= |x|, a multiple of
        x's quantum), |lo| <= 2**(e - 52). Every partial sum of the hi parts is a multiple of
        q of magnitude <= sum |x| + n q/2 <= 2**(e + 2) = 2**53 q, a float64: T = fl(sum hi)
        is exact in any order.
    level 1: S = T + L, L = sum lo; r = fl(sum lo) in any order errs by at most
        err = g fl(sum |lo|) (+ 2**-1074, for a product in the subnormal range), g = n 2**-52
        (``certificate.error_factor``: gamma_{n-1} / (1 - gamma_{n-1}) with room for the
        product's rounding; additions in the subnormal range are exact). (s, t) =
        TwoSum(T, r) is exact, so S - s = t + (L - r). Where every lo is zero, t is S - s;
        where |t| > err, S - s has t's sign and |S - s| < 2 |t|, at most the gap from s to
        its neighbour on that side (s is the float64 nearest to s + t). Either way S is s or
        lies strictly between s and that neighbour: round_to_odd(s, t) is rodd(S).
    cancelled hi parts (T = 0, a row level 1 leaves): S is the sum of the lo parts, each
        below 2**(e - 52): the certificate again on them (while e is not clamped).
    level 2, for the other rows level 1 leaves (mostly exact sums with nonzero lo parts): the lo
        parts split again (T2, lo2), S = T + T2 + L2, (s, t) = TwoSum(T, T2): decided where
        every lo2 is zero (residual t), where |t| > fl(A2 (1 + 2g)) + 2**-1074 >= sum |lo2|
        (residual t), or where t = 0, s != 0 and r2 = fl(sum lo2) has |r2| > err2 and
        2 |r2| < 2**-54 |s| (residual r2: |L2| < 2 |r2|, below the gap on either side of s);
        otherwise, where t = 0, S = s + L2 exactly: the certificate again on the row
        (s, lo2) (a sum that cancelled far below its terms; at most ``_RETRIES`` times).

The certificate takes only rows with A < 2**1019 (nothing overflows; e is clamped at -1000
from below, so big stays normal) and 2**-960 <= |s| or an exact zero sum (the zero-sign
rule), where the limbs' value is rodd(S) too; the others, and every row where the bound cannot
settle the sign of S - s, go to the limbs. ``SUM_ROWS`` counts the rows each path took;
``forced_limbs()`` sends every row to the limbs.

Where the backend offers the fused kernel ``certified_row_sums`` (``FUSED_KERNELS``; the NumPy
backend's Numba loop, ``fpsim.backend.numba_sums``), it replaces the certificate above, which
stays the reference: any exact method gives the one rodd(S), so the kernel decides rows by its
own exact steps (two error-free splits summed as integers, compensated sums with error
bounds, an error-free expansion), under equivalent rules (no overflow: sum |x| below 2**1019;
|s| >= 2**-960 unless S is zero), and may decide rows this certificate leaves to the limbs.
``SUM_ROWS["certified"]`` counts the rows either one decided. Only the rows left to the limbs
are checked for inf and NaN (neither certificate decides a row holding one).
"""
from __future__ import annotations

from contextlib import contextmanager

from ..backend import astype, bitcast, fused, scratch, tuning, xp

from .odd_rounding import round_to_odd

__all__ = ["round_to_odd_sum", "zero_sum", "SUM_ROWS", "forced_limbs"]

#: rows of ``round_to_odd_sum`` decided by the float64 certificate and summed in limbs (the
#: benchmarks and tests read it; counts only, never a value)
SUM_ROWS = {"certified": 0, "limbs": 0}
_FORCED = {"limbs": False}             # the test switch of ``forced_limbs``

_LIMB = 32
_HEADROOM = 4                         # limbs above the top term's: 2**40 terms' carries, sign
_TERMS_PER_PASS = 1 << 20             # bincount weights < 2**32: 2**20 of them sum below 2**52
# A Python int: it takes the int64 limbs' dtype (a weak scalar in every array library)
_MASK32 = 0xFFFFFFFF
_TINY = 2.0 ** -960                    # smallest |s| the certificate takes (module doc)
_RETRIES = 3                           # level 2's new rows (s, lo2) per row, at most
_EXPONENT_LOW, _EXPONENT_HIGH = -1000, 1019     # e's clamp, A's bound (module doc)


@contextmanager
def forced_limbs():
    """Test switch: inside ``with forced_limbs():`` every row of ``round_to_odd_sum`` is
    summed in limbs, the reference the certificate must reproduce bit for bit."""
    before = _FORCED["limbs"]
    _FORCED["limbs"] = True
    try:
        yield
    finally:
        _FORCED["limbs"] = before


def round_to_odd_sum(terms: xp.ndarray) -> xp.ndarray:
    """Exact sum along the last axis of a 2-D float64 array, rounded to odd at 53 bits.

    >>> import numpy as np
    >>> t = np.array([[1.0, 2.0 ** -60, -1.0], [2.0 ** 53, 1.0, 0.0], [-0.0, -0.0, -0.0]])
    >>> round_to_odd_sum(t).tolist() == [2.0 ** -60, 2.0 ** 53 + 2.0, -0.0]
    True
    """
    terms = xp.asarray(terms, dtype=xp.float64)
    if terms.ndim != 2:
        raise ValueError(f"round_to_odd_sum expects a 2-D array of rows, got shape {terms.shape}")
    rows, width = terms.shape
    out = xp.empty(rows, xp.float64)
    # rows * terms per chunk (tuning().sums_chunk) bounds the scratch memory
    rows_per_chunk = max(1, tuning().sums_chunk // max(1, min(width, _TERMS_PER_PASS)))
    for lo in range(0, rows, rows_per_chunk):
        hi = min(rows, lo + rows_per_chunk)
        out[lo:hi] = _rows_certified_or_limbs(terms[lo:hi])
    return out


def _rows_certified_or_limbs(terms: xp.ndarray) -> xp.ndarray:
    """Each row's rodd sum: by the certificate where it decides, in limbs elsewhere. Only the
    rows bound for the limbs are checked for inf and NaN: a row with one is never decided
    (its sum |x| is not below 2**1019), so every such row is caught, without a pass over the
    rows the certificate decided."""
    rows, width = terms.shape
    if _FORCED["limbs"] or width > _TERMS_PER_PASS:      # (its temporaries: 3 rows wide)
        _check_finite(terms)
        SUM_ROWS["limbs"] += rows
        return _rows_round_to_odd(terms)
    kernel = fused("certified_row_sums")    # a backend's one compiled pass a row, where offered
    found = kernel(terms) if kernel is not None else None      # (None: it declined the input)
    value, decided = found if found is not None else _certified_rows(terms)
    undecided = ~decided
    count = int(xp.count_nonzero(undecided))
    if count:
        left = terms[undecided]
        _check_finite(left)
        value[undecided] = _rows_round_to_odd(left)
    SUM_ROWS["certified"] += rows - count
    SUM_ROWS["limbs"] += count
    return value


def _check_finite(terms: xp.ndarray) -> None:
    if not xp.all(xp.isfinite(terms)):
        raise ValueError("round_to_odd_sum takes finite terms; handle inf/NaN before calling")


def _certified_rows(terms: xp.ndarray, depth: int = 0) -> tuple[xp.ndarray, xp.ndarray]:
    """(rodd sums where decided, garbage elsewhere; decided): the module doc's certificate.
    Row sums are products with a vector of ones (BLAS: any order, which the bounds allow;
    several times faster than NumPy's sum along short rows); two reused work arrays."""
    rows, width = terms.shape
    g = width * 2.0 ** -52                     # fpsim.exact.certificate.error_factor(width)
    ones = xp.ones(width, xp.float64)
    work = [xp.reshape(scratch(f"sums.certified{i}", xp.float64, rows * width), terms.shape)
            for i in range(2)]
    with xp.errstate(over="ignore", invalid="ignore"):
        whole = xp.matmul(xp.abs(terms, out=work[0]), ones)
        fits = whole < 2.0 ** _EXPONENT_HIGH
        total, lo = _split(terms, whole, ones, work[1])
        s, t = _two_sum(total, xp.matmul(lo, ones))
        mass = xp.matmul(xp.abs(lo, out=work[0]), ones)
        exact = mass == 0                      # every lo part zero: t is S - s
        decided = fits & (exact | (xp.abs(t) > _sum_error(mass, g)))
        decided &= (xp.abs(s) >= _TINY) | (exact & (s == 0))
        value = round_to_odd(s, t)
        zero = decided & (s == 0)
        if xp.count_nonzero(zero):
            value[zero] = zero_sum(terms[zero])
        open_rows = fits & ~decided
        # hi parts that cancel exactly: S is the sum of the lo parts, a smaller row sum (the
        # lo parts are below 2**(e - 51) where e was not clamped: each call gains >= 50 bits)
        cancelled = xp.nonzero(open_rows & (total == 0) & (whole >= 2.0 ** _EXPONENT_LOW))[0]
        again = xp.nonzero(open_rows & (total != 0))[0]
        lo_cancelled, lo_again = lo[cancelled], lo[again]        # copies: work is reused
        if again.shape[0]:
            value[again], decided[again] = _second_split(terms[again], lo_again, mass[again],
                                                         total[again], g, ones, depth)
        if cancelled.shape[0]:
            inner, decided[cancelled] = _certified_rows(lo_cancelled, depth)
            # an exact zero: +0, as the row's terms are not all -0 (their sum |x| is not 0)
            value[cancelled] = xp.where(inner == 0, 0.0, inner)
    return value, decided


def _second_split(terms, lo, lo_mass, total, g, ones, depth):
    """(values, decided) for the rows level 1 leaves: level 2 of the module doc."""
    total2, lo2 = _split(lo, lo_mass, ones, xp.empty(lo.shape, xp.float64))
    s, t = _two_sum(total, total2)
    r2 = xp.matmul(lo2, ones)
    mass = xp.matmul(xp.abs(lo2), ones)
    exact = mass == 0
    beyond = (t != 0) & (xp.abs(t) > mass * (1 + 2 * g) + 2.0 ** -1074)
    small = ((t == 0) & (xp.abs(r2) > _sum_error(mass, g))
             & (2 * xp.abs(r2) < xp.abs(s) * 2.0 ** -54))
    decided = exact | beyond | small
    decided &= (xp.abs(s) >= _TINY) | (exact & (s == 0))
    value = round_to_odd(s, xp.where(small & ~exact, r2, t))
    zero = decided & (s == 0)
    if xp.count_nonzero(zero):
        value[zero] = zero_sum(terms[zero])
    again = xp.nonzero(~decided & (t == 0) & ~exact)[0]      # S = s + L2 exactly
    if again.shape[0] and depth < _RETRIES:
        row = xp.concatenate([xp.expand_dims(s[again], 1), lo2[again]], axis=1)
        inner, decided[again] = _certified_rows(row, depth + 1)
        value[again] = xp.where(inner == 0, 0.0, inner)      # +0: mass > 0, as above
    return value, decided


def _split(terms, mass, ones, parts):
    """(T, lo): each row's exact sum of its hi parts and the lo parts (written into
    ``parts``), from ``mass`` = fl(sum |x|) of each row (module doc)."""
    exponent = xp.frexp(mass)[1]                               # mass < 2**exponent
    exponent = xp.minimum(xp.maximum(exponent, _EXPONENT_LOW), _EXPONENT_HIGH)
    big = xp.expand_dims(xp.ldexp(1.5, exponent + 1), 1)
    xp.add(terms, big, out=parts)
    parts -= big                                               # the hi parts, exact
    total = xp.matmul(parts, ones)                             # exact, in any order
    return total, xp.subtract(terms, parts, out=parts)


def _two_sum(a, b):
    """(s, t) with s = fl(a + b) and s + t = a + b exactly (Knuth's TwoSum)."""
    s = a + b
    b_virtual = s - a
    return s, (a - (s - b_virtual)) + (b - b_virtual)


def _sum_error(mass, g):
    """A bound on |fl(sum lo) - sum lo| from mass = fl(sum |lo|): g mass, plus the smallest
    subnormal for a product rounded in the subnormal range."""
    return mass * g + 2.0 ** -1074


def _rows_round_to_odd(terms: xp.ndarray) -> xp.ndarray:
    rows, width = terms.shape
    value = xp.zeros(rows, xp.float64)
    fields = (bitcast(terms, xp.int64) >> 52) & 0x7FF
    nonzero = terms != 0
    if xp.any(nonzero):
        # Only the limbs this chunk's exponents reach: first .. last + 2, plus headroom.
        index = xp.maximum(fields, 1) >> 5
        first = int(xp.min(index[nonzero]))
        count = int(xp.max(index[nonzero])) - first + 3 + _HEADROOM
        limbs = xp.zeros((rows, count), xp.int64)
        for start in range(0, width, _TERMS_PER_PASS):
            stop = start + _TERMS_PER_PASS
            limbs += _limb_sums(xp.ascontiguousarray(terms[:, start:stop]),
                                xp.ascontiguousarray(fields[:, start:stop]), first, count)
            _propagate_carries(limbs)
        negative = limbs[:, -1] < 0
        if xp.any(negative):
            limbs[negative] = -limbs[negative]
            _propagate_carries(limbs)
        value = _limbs_to_float_round_to_odd(limbs, first)
        value = xp.where(negative, -value, value)
    zero = value == 0
    if xp.any(zero):
        value[zero] = zero_sum(terms[zero])
    return value


def zero_sum(terms: xp.ndarray) -> xp.ndarray:
    """The IEEE value of each row's sum where it is exactly zero: -0 when every term is -0
    (and there is one), else +0 (IEEE 754-2019 section 6.3, round to nearest)."""
    negative = xp.all(xp.signbit(terms), axis=-1) & (terms.shape[-1] > 0)
    return xp.where(negative, -0.0, 0.0)


def _limb_sums(part: xp.ndarray, field: xp.ndarray, first: int, count: int) -> xp.ndarray:
    """Per row, the sum of every term's three limbs (limb j holds bits 32j.. of the
    integer m * 2**(E - 1), offset by ``first`` limbs), as exact integers (int64)."""
    rows, width = part.shape
    pattern = bitcast(part, xp.int64)
    mantissa = pattern & ((1 << 52) - 1)
    mantissa |= astype(field > 0, xp.int64) << 52
    sign = pattern >> 63                       # 0 or -1
    mantissa ^= sign
    mantissa -= sign                           # signed significand, |m| < 2**53
    exponent = xp.maximum(field, 1)
    shift = exponent & (_LIMB - 1)
    rest = _LIMB - shift                       # 1..32
    index = exponent >> 5
    index += (xp.arange(rows, dtype=xp.int64) * count - first)[:, None]
    index[mantissa == 0] = rows * count        # zeros go to a spare bin (no valid index)
    total = rows * count + 3

    low = (mantissa & ((1 << rest) - 1)) << shift
    sums = _binned(index, low, total)
    mid = (mantissa >> rest) & _MASK32
    index += 1
    sums += _binned(index, mid, total)
    high = (mantissa >> _LIMB) >> rest
    index += 1
    sums += _binned(index, high, total)
    return xp.reshape(sums[:rows * count], (rows, count))


def _binned(index: xp.ndarray, weights: xp.ndarray, total: int) -> xp.ndarray:
    # float64 bincount is exact here: integer weights below 2**32, at most 2**20 per bin.
    sums = xp.bincount(xp.reshape(index, (-1,)),
                       weights=astype(xp.reshape(weights, (-1,)), xp.float64), minlength=total)
    return astype(sums, xp.int64)


def _propagate_carries(limbs: xp.ndarray) -> None:
    for j in range(limbs.shape[1] - 1):
        carry = limbs[:, j] >> _LIMB
        limbs[:, j] &= _MASK32
        limbs[:, j + 1] += carry


def _limbs_to_float_round_to_odd(limbs: xp.ndarray, first: int) -> xp.ndarray:
    """Nonnegative normalised limbs (each in [0, 2**32)) to float64, rounded to odd."""
    rows, count = limbs.shape
    nonzero = limbs != 0
    any_nonzero = xp.any(nonzero, axis=1)
    # the highest nonzero limb: the first nonzero one in reversed order (argmax of a bool
    # array: the first True; the reversal is a take, not a negative-step slice)
    top_index = count - 1 - xp.argmax(xp.take(nonzero, xp.arange(count - 1, -1, -1), axis=1),
                                      axis=1)
    padded = xp.concatenate([xp.zeros((rows, 2), xp.int64), limbs], axis=1)
    row = xp.arange(rows)
    top = padded[row, top_index + 2]
    second = padded[row, top_index + 1]
    third = padded[row, top_index]
    below = xp.cumsum(nonzero, axis=1)          # count of nonzero limbs at or below each index
    below_third = xp.where(top_index >= 3, below[row, xp.maximum(top_index - 3, 0)], 0)
    sticky = below_third > 0

    top_bits = astype(xp.frexp(astype(xp.maximum(top, 1), xp.float64))[1], xp.int64)  # 1..32
    drop = top_bits + 11                        # bits of the 96-bit (top, second, third) window
    #                                             below the 53 kept: 12..43
    # kept = floor(window / 2**drop) in int64, every part below 2**53 (signed integers only:
    # torch has no unsigned arithmetic): top's bits moved up by 64 - drop = 53 - top_bits,
    # second's moved down by drop - 32 (or up by 32 - drop), third's down by drop
    far = xp.maximum(drop - _LIMB, 0)
    kept = ((top << (53 - top_bits)) | ((second >> far) << xp.maximum(_LIMB - drop, 0))
            | (third >> drop))
    # the bits below the cut: second's lowest far, third's lowest min(drop, 32)
    lost = (second & ((1 << far) - 1)) | (third & ((1 << (drop - far)) - 1))
    sticky |= lost != 0
    exponent = _LIMB * (top_index - 2 + first) + drop - 1075
    # kept holds exactly 53 bits and the result is normal (module docstring), so the float's
    # last bit is kept's: the truncation plus the sticky bit is the round-to-odd value.
    value = round_to_odd(xp.ldexp(astype(kept, xp.float64), exponent),
                         astype(sticky, xp.float64))
    value[~any_nonzero] = 0.0
    return value
