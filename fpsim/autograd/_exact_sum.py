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
_CHUNK = 1 << 14                      # elements per chunk of the certification pass


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
#
# Proof sketch. Products of float32 values are exact in float64, so a float64 BLAS sum of
# K of them errs only through its additions: in any order, blocked, vectorised or with FMA,
# |approx - exact| <= gamma_{K-1} * sum|p|, gamma_n = n u / (1 - n u), u = 2**-53 (Higham,
# Accuracy and Stability of Numerical Algorithms, 2nd ed., section 4.2 and Lemma 8.4).
# U >= sum|p| is a rigorous upper bound: for matmul ||a_i|| ||b_j|| (Cauchy-Schwarz, with
# its own rounding covered, see _cauchy_schwarz_bound), for sums fl(sum|x|) (1 + 2g). With
# g = K * 2**-52 (see error_factor) the exact value lies in [approx - g*U, approx + g*U];
# widening the ends (see _interval_round) covers the rounding of computing them.
# Rounding to nearest even is monotonic: if both ends round to the same bits, so does every
# point between them, the exact value included. Second certificate, for the elements the
# first cannot take (exact ties, exact zeros): if U < 2**(q + 53), q the exponent of the
# lowest set bit of any product (at least the row minimum of a plus the column minimum of
# b), every partial sum is a multiple of 2**q below 2**(q+53), hence exact: approx is exact.
# Products are multiples of 2**-298, so nothing underflows. The rest: integer limbs above.


def error_factor(terms: int) -> float:
    """g with |fl(sum p) - sum p| <= g * fl(sum |p|) for every summation order of ``terms``
    exact float64 terms: g = n * 2**-52 exceeds gamma_{n-1} / (1 - gamma_{n-1}) * (1 + u),
    which also covers the rounding of g * fl(sum|p|), for every n < 2**40."""
    if terms >= 1 << 40:
        raise ValueError(f"sums of {terms} terms are beyond the certified range (2**40)")
    return max(terms, 1) * 2.0 ** -52


def _round_acc(x: np.ndarray, acc) -> np.ndarray:
    """float64 -> float64 values of ``acc`` (nearest even); fp32 by the hardware cast."""
    from ..formats import FP32
    from ..rounding import round_to

    if acc == FP32:     # IEEE binary32 nearest-even cast: subnormals, overflow to inf
        with np.errstate(over="ignore", invalid="ignore"):
            return x.astype(np.float32).astype(np.float64)
    return round_to(x, acc)


def _interval_round(approx, bound, acc):
    """(rounded approx-side value, certified mask) from the enclosure [approx +- bound].

    The ends are computed as approx -+ w with w = bound * (1 + 2**-40) + |approx| * 2**-50,
    which contains [approx - bound, approx + bound] despite the rounding of every operation:
    each end errs by at most u * (|approx| + w) (u = 2**-53), and w - bound exceeds that by a
    wide margin even after w's own three roundings. (np.nextafter would do the same job 40x
    slower.)
    """
    from ..formats import FP32

    if acc != FP32:
        with np.errstate(invalid="ignore", over="ignore"):
            widen = bound * (1 + 2.0 ** -40) + np.abs(approx) * 2.0 ** -50
            low, high = _round_acc(approx - widen, acc), _round_acc(approx + widen, acc)
        return high, low.view(np.uint64) == high.view(np.uint64)
    # fp32: the hardware cast, chunk by chunk so the temporaries stay in cache.
    flat_approx, flat_bound = approx.reshape(-1), bound.reshape(-1)
    rounded = np.empty(flat_approx.size, np.float64)
    certified = np.empty(flat_approx.size, bool)
    size = min(flat_approx.size, _CHUNK)
    widen, end = np.empty(size, np.float64), np.empty(size, np.float64)
    low32, high32 = np.empty(size, np.float32), np.empty(size, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for lo in range(0, flat_approx.size, _CHUNK):
            hi = min(lo + _CHUNK, flat_approx.size)
            x, n = flat_approx[lo:hi], hi - lo
            w, e, l32, h32 = widen[:n], end[:n], low32[:n], high32[:n]
            np.abs(x, out=w)
            np.multiply(w, 2.0 ** -50, out=w)
            np.multiply(flat_bound[lo:hi], 1 + 2.0 ** -40, out=e)
            np.add(w, e, out=w)
            np.subtract(x, w, out=e)
            l32[...] = e
            np.add(x, w, out=e)
            h32[...] = e
            np.equal(l32.view(np.uint32), h32.view(np.uint32), out=certified[lo:hi])
            rounded[lo:hi] = h32
    return rounded.reshape(approx.shape), certified.reshape(approx.shape)


def exact_matmul(a3: np.ndarray, b3: np.ndarray, acc, *, force_fallback: bool = False
                 ) -> tuple[np.ndarray, int]:
    """(nb, M, K) @ (nb, K, N) float32 -> (float64 values of ``acc``, fallback count).

    Each element is the exact dot product rounded once to ``acc`` (nearest even); the sign
    of a zero follows IEEE addition of the exact products (see the module docstring).
    """
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
        g = error_factor(k)
        upper = _cauchy_schwarz_bound(a64, b64, g)     # >= sum |a_ik b_kj|, rigorously
        out, certified = _interval_round(approx, upper * g, acc)
        zero_sum = upper == 0                          # an all-zero row or column
        todo = ~certified & ~zero_sum
        if todo.any():                                 # second certificate: approx is exact
            b_i, m_i, n_i = np.nonzero(todo)
            qa = _per_line(b_i * m + m_i, lambda u: a3[u // m, u % m, :],
                           lambda: _lowest_bit_exponent(a3, axis=2), nb * m)
            qb = _per_line(b_i * n + n_i, lambda u: b3[u // n, :, u % n],
                           lambda: _lowest_bit_exponent(b3, axis=1), nb * n)
            limit = np.ldexp(1.0, np.minimum(qa + qb + 53, 1023))
            exact_flag = upper[b_i, m_i, n_i] < limit
            hit = tuple(w[exact_flag] for w in (b_i, m_i, n_i))
            out[hit] = _round_acc(approx[hit], acc)
            todo[hit] = False
            zero_sum[hit] = approx[hit] == 0
        _fix_zero_signs(out, zero_sum, a3, b3)         # exact zeros: IEEE sign rule
    count = int(todo.sum())
    if count:
        where = np.nonzero(todo)
        step = max(1, _ELEMENTS_PER_CHUNK // max(k, 1))
        for lo in range(0, count, step):
            b_i, m_i, n_i = (w[lo:lo + step] for w in where)
            products = a64[b_i, m_i, :] * b64[b_i, :, n_i]
            out[b_i, m_i, n_i] = _round_acc(round_to_odd_sum(products), acc)
    if not all_finite:
        _apply_non_finite(out, a3, b3, finite_a, finite_b)
    return out, count


def exact_rows_sum(rows: np.ndarray, acc, *, force_fallback: bool = False
                   ) -> tuple[np.ndarray, int]:
    """Sum of each row of a (n, K) float32 array, exact, rounded once to ``acc``."""
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
        out, certified = _interval_round(approx, magnitude * g, acc)
        zero = magnitude == 0
        if zero.any():
            all_negative = np.all(np.signbit(rows[zero]), axis=1) & (k > 0)
            out[zero] = np.where(all_negative, -0.0, 0.0)
            certified |= zero
        todo = ~certified
        if todo.any():
            idx = np.nonzero(todo)[0]
            limit = np.ldexp(1.0, np.minimum(_lowest_bit_exponent(rows[idx], axis=1) + 53,
                                             1023))
            idx = idx[magnitude[idx] * (1 + 2 * g) < limit]
            out[idx] = np.where(approx[idx] == 0, 0.0, _round_acc(approx[idx], acc))
            todo[idx] = False
    count = int(todo.sum())
    if count:
        out[todo] = _round_acc(round_to_odd_sum(x64[todo]), acc)
    if not all_finite:
        special = np.where(finite, 0.0, rows.astype(np.float64))
        with np.errstate(invalid="ignore"):
            special = special.sum(axis=1)              # IEEE: NaN wins, +inf + -inf is NaN
        bad = ~finite.all(axis=1)
        out[bad] = special[bad]
    return out, count


def _lowest_bit_exponent(x: np.ndarray, axis: int) -> np.ndarray:
    """A lower bound, over ``axis``, on the exponent of the lowest set bit of each nonzero
    float32 (exact except for powers of two, up to 1 low; zeros are ignored; an all-zero
    line gives 2000; non-finite values give garbage, as their results are replaced anyway).

    In value space: clearing the lowest set bit of the pattern (b & (b - 1)) lowers |x| by
    exactly that bit's value when the fraction is nonzero. For a power of two it clears an
    exponent bit instead and lowers |x| by at least |x| / 2: one bit low, still a bound.
    """
    bits = np.ascontiguousarray(x).view(np.uint32) & np.uint32(0x7FFFFFFF)
    cleared = bits - np.uint32(1)          # zeros wrap around; they are masked out below
    cleared &= bits
    low = bits.view(np.float32) - cleared.view(np.float32)      # exact (Sterbenz)
    smallest = np.minimum.reduce(low, axis=axis, where=bits != 0, initial=np.inf)
    exponent = np.frexp(smallest)[1].astype(np.int64) - 1
    return np.where(np.isinf(smallest), 2000, exponent)


def _per_line(keys: np.ndarray, lines, all_lines, total: int) -> np.ndarray:
    """_lowest_bit_exponent of the line named by each key: over the distinct lines gathered
    (few of them) or over every line at once (many), whichever reads less memory."""
    unique, inverse = np.unique(keys, return_inverse=True)
    if unique.size * 8 > total:
        return all_lines().reshape(-1)[keys]
    return _lowest_bit_exponent(lines(unique), axis=1)[inverse]


def _cauchy_schwarz_bound(a64: np.ndarray, b64: np.ndarray, g: float) -> np.ndarray:
    """U >= sum_k |a_ik b_kj| for every (i, j): ||a_i||_2 ||b_j||_2 (Cauchy-Schwarz), the
    norms computed in float64 (relative error below (K/2 + 2) u each) and the product inflated
    by 1 + 2g, g = K * 2**-52, which covers those errors. One pass over a and b instead of a
    second matrix product; about 1.5x looser than sum |a||b| on random data."""
    row_norms = np.sqrt(np.einsum("bmk,bmk->bm", a64, a64))
    col_norms = np.sqrt(np.einsum("bkn,bkn->bn", b64, b64))
    return row_norms[:, :, None] * col_norms[:, None, :] * (1 + 2 * g)


def _fix_zero_signs(out, all_zero, a3, b3) -> None:
    """Where the exact sum is zero, it is -0 exactly when every product is -0: a zero sum
    with a product of positive sign is +0 (a nonzero one cancels; all zero: +0 + -0)."""
    if not all_zero.any():
        return
    for batch in np.unique(np.nonzero(all_zero)[0]):
        mask = all_zero[batch]
        rows, cols = np.nonzero(mask.any(axis=1))[0], np.nonzero(mask.any(axis=0))[0]
        dtype = np.float32 if a3.shape[2] < 1 << 24 else np.float64  # exact counts
        sign_a = np.signbit(a3[batch][rows]).astype(dtype)               # (r, K)
        sign_b = np.signbit(b3[batch][:, cols]).astype(dtype)            # (K, c)
        # Count the products with a positive sign.
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
