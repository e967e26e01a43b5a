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
"""
from __future__ import annotations

import numpy as np

__all__ = ["round_to_odd_sum"]

_LIMB = 32
_N_LIMBS = 2048 // _LIMB + 4          # limb index E // 32 <= 63, plus 2 spill limbs and carries
_TERMS_PER_PASS = 1 << 20             # bincount weights < 2**32: 2**20 of them sum below 2**52
_ELEMENTS_PER_CHUNK = 1 << 22         # rows * terms per chunk: bounds the scratch memory
_MASK32 = np.int64(0xFFFFFFFF)


def round_to_odd_sum(terms: np.ndarray) -> np.ndarray:
    """Exact sum along the last axis of a 2-D float64 array, rounded to odd at 53 bits.

    >>> t = np.array([[1.0, 2.0 ** -60, -1.0], [2.0 ** 53, 1.0, 0.0], [-0.0, -0.0, -0.0]])
    >>> round_to_odd_sum(t).tolist() == [2.0 ** -60, 2.0 ** 53 + 2.0, -0.0]
    True
    """
    terms = np.asarray(terms, dtype=np.float64)
    if terms.ndim != 2:
        raise ValueError(f"round_to_odd_sum expects a 2-D array of rows, got shape {terms.shape}")
    if not np.all(np.isfinite(terms)):
        raise ValueError("round_to_odd_sum takes finite terms; handle inf/NaN before calling")
    rows, width = terms.shape
    out = np.empty(rows, np.float64)
    rows_per_chunk = max(1, _ELEMENTS_PER_CHUNK // max(1, min(width, _TERMS_PER_PASS)))
    for lo in range(0, rows, rows_per_chunk):
        hi = min(rows, lo + rows_per_chunk)
        out[lo:hi] = _rows_round_to_odd(terms[lo:hi])
    return out


def _rows_round_to_odd(terms: np.ndarray) -> np.ndarray:
    rows, width = terms.shape
    limbs = np.zeros((rows, _N_LIMBS), np.int64)
    for start in range(0, width, _TERMS_PER_PASS):
        part = np.ascontiguousarray(terms[:, start:start + _TERMS_PER_PASS])
        limbs += _limb_sums(part)
        _propagate_carries(limbs)
    negative = limbs[:, -1] < 0
    if negative.any():
        limbs[negative] = -limbs[negative]
        _propagate_carries(limbs)
    value = _limbs_to_float_round_to_odd(limbs)
    np.negative(value, out=value, where=negative)
    zero = value == 0
    if zero.any():
        all_negative_zero = np.all(np.signbit(terms[zero]), axis=1) & (terms.shape[1] > 0)
        value[zero] = np.where(all_negative_zero, -0.0, 0.0)
    return value


def _limb_sums(part: np.ndarray) -> np.ndarray:
    """Per row, the sum of every term's three limbs, as exact integers (int64)."""
    rows, width = part.shape
    bits = part.view(np.int64)
    field = (bits >> 52) & 0x7FF
    mantissa = bits & ((1 << 52) - 1)
    mantissa |= (field > 0).astype(np.int64) << 52
    sign = bits >> 63                          # 0 or -1
    mantissa ^= sign
    mantissa -= sign                           # signed significand, |m| < 2**53
    exponent = np.maximum(field, 1)
    shift = exponent & (_LIMB - 1)
    rest = _LIMB - shift                       # 1..32
    index = exponent >> 5
    index += (np.arange(rows, dtype=np.int64) * _N_LIMBS)[:, None]
    total = rows * _N_LIMBS

    low = (mantissa & ((np.int64(1) << rest) - 1)) << shift
    sums = _binned(index, low, total)
    mid = (mantissa >> rest) & _MASK32
    index += 1
    sums += _binned(index, mid, total)
    high = (mantissa >> _LIMB) >> rest
    index += 1
    sums += _binned(index, high, total)
    return sums.reshape(rows, _N_LIMBS)


def _binned(index: np.ndarray, weights: np.ndarray, total: int) -> np.ndarray:
    # float64 bincount is exact here: integer weights below 2**32, at most 2**20 per bin.
    sums = np.bincount(index.ravel(), weights=weights.ravel().astype(np.float64),
                       minlength=total)
    return sums.astype(np.int64)


def _propagate_carries(limbs: np.ndarray) -> None:
    for j in range(_N_LIMBS - 1):
        carry = limbs[:, j] >> _LIMB
        limbs[:, j] &= _MASK32
        limbs[:, j + 1] += carry


def _limbs_to_float_round_to_odd(limbs: np.ndarray) -> np.ndarray:
    """Nonnegative normalised limbs (each in [0, 2**32)) to float64, rounded to odd."""
    rows = limbs.shape[0]
    nonzero = limbs != 0
    any_nonzero = nonzero.any(axis=1)
    top_index = _N_LIMBS - 1 - np.argmax(nonzero[:, ::-1], axis=1)
    padded = np.concatenate([np.zeros((rows, 2), np.int64), limbs], axis=1)
    row = np.arange(rows)
    top = padded[row, top_index + 2]
    second = padded[row, top_index + 1]
    third = padded[row, top_index]
    below = np.cumsum(nonzero, axis=1)          # count of nonzero limbs at or below each index
    below_third = np.where(top_index >= 3, below[row, np.maximum(top_index - 3, 0)], 0)
    sticky = below_third > 0

    top_bits = np.frexp(np.maximum(top, 1).astype(np.float64))[1].astype(np.int64)  # 1..32
    drop = top_bits + 11                        # bits of the 96-bit (top, second, third) window
    wide = drop >= _LIMB                        # below the 53 kept: 12..43
    far = np.where(wide, drop - _LIMB, 0).astype(np.uint64)
    near = np.where(wide, _LIMB, drop).astype(np.uint64)
    u32 = np.uint64(_LIMB)
    head = (top.astype(np.uint64) << u32) | second.astype(np.uint64)   # below 2**64
    third = third.astype(np.uint64)
    one = np.uint64(1)
    kept_wide = head >> far
    kept_near = (head << np.where(wide, np.uint64(0), u32 - near)) | (third >> near)
    kept = np.where(wide, kept_wide, kept_near)
    lost_wide = ((head & ((one << far) - one)) != 0) | (third != 0)
    lost_near = (third & ((one << near) - one)) != 0
    sticky |= np.where(wide, lost_wide, lost_near)
    kept |= sticky.astype(np.uint64)
    exponent = _LIMB * (top_index - 2) + drop - 1075
    value = np.ldexp(kept.astype(np.float64), exponent)
    value[~any_nonzero] = 0.0
    return value


# --- the certified fast path of the "exact" model ----------------------------------------

def certified_round(approx: np.ndarray, bound: np.ndarray, exact_flag: np.ndarray, fmt,
                    round_to) -> tuple[np.ndarray, np.ndarray]:
    """Round ``approx`` to ``fmt`` where that is provably the rounding of the exact value.

    The exact value lies in [approx - bound, approx + bound] (``bound`` already covers every
    rounding made while computing ``approx`` and ``bound``); where ``exact_flag`` is set,
    ``approx`` is the exact value itself. Round-to-nearest-even is monotonic, so when both
    ends of the (outward-widened) interval round to the same bits, so does every point
    inside it, the exact value included. Returns (rounded float64, certified mask).
    """
    with np.errstate(invalid="ignore", over="ignore"):
        low = np.nextafter(approx - bound, -np.inf)
        high = np.nextafter(approx + bound, np.inf)
    low_r = round_to(low, fmt)
    high_r = round_to(high, fmt)
    certified = exact_flag | (low_r.view(np.uint64) == high_r.view(np.uint64))
    rounded = np.where(exact_flag, round_to(approx, fmt), high_r)
    return rounded, certified


def error_factor(terms: int) -> float:
    """A factor g with |fl(sum p) - sum p| <= g * fl(sum |p|) for any summation order.

    Any order of n - 1 float64 additions (pairwise, blocked, vectorised, with or without FMA
    on exact products) errs by at most gamma_{n-1} * sum|p|, gamma_n = n u / (1 - n u),
    u = 2**-53 (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., (3.4),
    Lemma 8.4 and section 4.2); the computed fl(sum |p|) is at least (1 - gamma) sum |p|.
    g = n * 2**-52 exceeds gamma / (1 - gamma) times (1 + u), covering the rounding of the
    product g * fl(sum |p|) too, for every n < 2**40.
    """
    if terms >= 1 << 40:
        raise ValueError(f"sums of {terms} terms are beyond the certified range (2**40)")
    return max(terms, 1) * 2.0 ** -52


def exact_matmul(a3: np.ndarray, b3: np.ndarray, acc, *, force_fallback: bool = False
                 ) -> tuple[np.ndarray, int]:
    """(nb, M, K) @ (nb, K, N) float32 -> (float64 values of ``acc``, fallback count).

    Each element is the exact dot product rounded once to ``acc`` (nearest even).
    """
    from ..rounding import round_to

    nb, m, k = a3.shape
    n = b3.shape[2]
    finite_a, finite_b = np.isfinite(a3), np.isfinite(b3)
    all_finite = bool(finite_a.all() and finite_b.all())
    a64 = a3.astype(np.float64) if all_finite else np.where(finite_a, a3, 0).astype(np.float64)
    b64 = b3.astype(np.float64) if all_finite else np.where(finite_b, b3, 0).astype(np.float64)
    if force_fallback:
        out = np.empty((nb, m, n), np.float64)
        todo = np.ones((nb, m, n), bool)
    else:
        approx = np.matmul(a64, b64)
        magnitude = np.matmul(np.abs(a64), np.abs(b64))
        g = error_factor(k)
        qa = _lowest_bit_exponent(a3, axis=2)                  # (nb, M)
        qb = _lowest_bit_exponent(b3, axis=1)                  # (nb, N)
        limit = np.ldexp(1.0, np.minimum(qa[:, :, None] + qb[:, None, :] + 53, 1023))
        exact_flag = magnitude * (1 + 2 * g) < limit
        out, certified = certified_round(approx, magnitude * g, exact_flag, acc, round_to)
        out[exact_flag & (approx == 0) & (magnitude > 0)] = 0.0   # cancellation gives +0
        _fix_zero_signs(out, magnitude == 0, a3, b3)
        todo = ~certified
    count = int(todo.sum())
    if count:
        where = np.nonzero(todo)
        step = max(1, _ELEMENTS_PER_CHUNK // max(k, 1))
        for lo in range(0, count, step):
            b_i, m_i, n_i = (w[lo:lo + step] for w in where)
            products = a64[b_i, m_i, :] * b64[b_i, :, n_i]
            out[b_i, m_i, n_i] = round_to(round_to_odd_sum(products), acc)
    if not all_finite:
        _apply_non_finite(out, a3, b3, finite_a, finite_b)
    return out, count


def exact_rows_sum(rows: np.ndarray, acc, *, force_fallback: bool = False
                   ) -> tuple[np.ndarray, int]:
    """Sum of each row of a (n, K) float32 array, exact, rounded once to ``acc``."""
    from ..rounding import round_to

    count_rows, k = rows.shape
    finite = np.isfinite(rows)
    all_finite = bool(finite.all())
    x64 = rows.astype(np.float64) if all_finite else np.where(finite, rows, 0).astype(np.float64)
    if force_fallback:
        out = np.empty(count_rows, np.float64)
        todo = np.ones(count_rows, bool)
    else:
        approx = x64.sum(axis=1)
        magnitude = np.abs(x64).sum(axis=1)
        g = error_factor(k)
        limit = np.ldexp(1.0, np.minimum(_lowest_bit_exponent(rows, axis=1) + 53, 1023))
        exact_flag = magnitude * (1 + 2 * g) < limit
        out, certified = certified_round(approx, magnitude * g, exact_flag, acc, round_to)
        out[exact_flag & (approx == 0) & (magnitude > 0)] = 0.0
        zero = magnitude == 0
        if zero.any():
            all_negative = np.all(np.signbit(rows[zero]), axis=1) & (k > 0)
            out[zero] = np.where(all_negative, -0.0, 0.0)
        todo = ~certified
    count = int(todo.sum())
    if count:
        out[todo] = round_to(round_to_odd_sum(x64[todo]), acc)
    if not all_finite:
        special = np.where(finite, 0.0, rows.astype(np.float64))
        with np.errstate(invalid="ignore"):
            special = special.sum(axis=1)              # IEEE: NaN wins, +inf + -inf is NaN
        bad = ~finite.all(axis=1)
        out[bad] = special[bad]
    return out, count


def _lowest_bit_exponent(x: np.ndarray, axis: int) -> np.ndarray:
    """min over ``axis`` of the exponent of the lowest set bit of each nonzero finite float32
    (zeros and non-finite values are ignored; an all-ignored line gives 2000)."""
    bits = x.view(np.uint32).astype(np.int64)
    field = (bits >> 23) & 0xFF
    mantissa = (bits & 0x7FFFFF) | ((field > 0).astype(np.int64) << 23)
    lowest = mantissa & -mantissa
    exponent = np.frexp(lowest.astype(np.float64))[1] - 1 + np.maximum(field, 1) - 150
    ignore = (mantissa == 0) | (field == 0xFF)
    return np.where(ignore, 2000, exponent).min(axis=axis, initial=2000)


def _fix_zero_signs(out, all_zero, a3, b3) -> None:
    """Where every product is zero, the sum is -0 exactly when every product is -0."""
    if not all_zero.any():
        return
    for batch in np.unique(np.nonzero(all_zero)[0]):
        mask = all_zero[batch]
        rows, cols = np.nonzero(mask.any(axis=1))[0], np.nonzero(mask.any(axis=0))[0]
        sign_a = np.signbit(a3[batch][rows]).astype(np.float32)        # (r, K)
        sign_b = np.signbit(b3[batch][:, cols]).astype(np.float32)     # (K, c)
        # Count products with a positive sign; exact in float32 for K < 2**24.
        positive = (1 - sign_a) @ (1 - sign_b) + sign_a @ sign_b
        negative_zero = (positive == 0) & (a3.shape[2] > 0)
        sub = out[batch][np.ix_(rows, cols)]
        sub_mask = mask[np.ix_(rows, cols)]
        sub[sub_mask] = np.where(negative_zero, -0.0, 0.0)[sub_mask]
        out[batch][np.ix_(rows, cols)] = sub


def _apply_non_finite(out, a3, b3, finite_a, finite_b) -> None:
    """IEEE results for every element whose row of a or column of b holds inf or NaN."""
    bad_rows = ~finite_a.all(axis=2)                   # (nb, M)
    bad_cols = ~finite_b.all(axis=1)                   # (nb, N)
    with np.errstate(invalid="ignore"):
        f = np.float32
        a_inf, b_inf = np.isinf(a3), np.isinf(b3)
        a_pos, a_neg = (a3 > 0), (a3 < 0)              # NaN is neither
        b_pos, b_neg = (b3 > 0), (b3 < 0)
        a_nan, b_nan = np.isnan(a3), np.isnan(b3)
        a_zero, b_zero = (a3 == 0), (b3 == 0)

    def count(pairs):                                  # sum of indicator matmuls, exact
        return sum(np.matmul(x.astype(f), y.astype(f)) for x, y in pairs)

    positive_inf = count([(a_inf & a_pos, b_pos), (a_inf & a_neg, b_neg),
                          (~a_inf & a_pos, b_inf & b_pos), (~a_inf & a_neg, b_inf & b_neg)])
    negative_inf = count([(a_inf & a_pos, b_neg), (a_inf & a_neg, b_pos),
                          (~a_inf & a_pos, b_inf & b_neg), (~a_inf & a_neg, b_inf & b_pos)])
    nan = count([(a_inf, b_zero), (a_zero, b_inf)])
    nan = nan + a_nan.any(axis=2)[:, :, None] + b_nan.any(axis=1)[:, None, :]
    result = np.where(positive_inf > 0, np.inf, -np.inf)
    result[(nan > 0) | ((positive_inf > 0) & (negative_inf > 0))] = np.nan
    affected = bad_rows[:, :, None] | bad_cols[:, None, :]
    out[affected] = result[affected]
