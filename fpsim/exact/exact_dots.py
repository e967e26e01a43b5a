"""The ``exact`` model's general path: float64 BLAS plus a certificate; exact sums where it fails.

Products of float32 values are exact in float64 (multiples of 2**-298: nothing underflows),
so a float64 BLAS product or sum errs only through its additions. Each element is taken by
the interval certificate (``certificate.certify``: N = ||a_i|| ||b_j|| for matmul, by
Cauchy-Schwarz, N = fl(sum|x|) for sums), else by the second certificate
(``certificate.sums_exactly``: q, the lowest set bit of every product, from the row minimum
of a plus the column minimum of b), else summed exactly with integer limbs and rounded to
odd (``sums.round_to_odd_sum``), then rounded once to ``acc``. Row sums try a cheaper
certificate first (``exponent_window_open``): a row whose nonzero values span few enough
binades has an exact float64 sum in any order. The bits never depend on the BLAS, its
summation order or its thread count: only certified or exactly computed values are used.
"""
from __future__ import annotations

from ..backend import (astype, bitcast, is_contiguous, round_to, scratch, size, to_list, tuning,
                       xp)
from ..formats import FP32
from .certificate import certify, error_factor, sums_exactly, width_factor
from .sums import round_to_odd_sum, zero_sum

__all__ = ["exact_matmul", "exact_rows_sum", "exponent_window_open", "lowest_bit_exponent",
           "per_line_lowest_bit", "cauchy_schwarz_bound"]


def _round_acc(x: xp.ndarray, acc) -> xp.ndarray:
    """float64 -> float64 values of ``acc`` (nearest even); fp32 by the hardware cast."""
    if acc == FP32:     # IEEE binary32 nearest-even cast: subnormals, overflow to inf
        with xp.errstate(over="ignore", invalid="ignore"):
            return astype(astype(x, xp.float32), xp.float64)
    return round_to(x, acc)


def _certify_acc(approx, width, width_cols, acc):
    """(approx's rounding to ``acc`` where certified, as float64; certified mask)."""
    if acc == FP32:
        _, high, certified = certify(approx, width, width_cols)
        return astype(high, xp.float64), certified
    _, high, certified = certify(approx, width, width_cols, lambda x: round_to(x, acc))
    return high, certified


def exact_matmul(a3: xp.ndarray, b3: xp.ndarray, acc, *, force_fallback: bool = False
                 ) -> tuple[xp.ndarray, int]:
    """(nb, M, K) @ (nb, K, N) float32 -> (float64 values of ``acc``, fallback count).

    Each element is the exact dot product rounded once to ``acc`` (nearest even); the sign
    of a zero follows IEEE addition of the exact products (see the module docstring).
    """
    a3, b3 = xp.asarray(a3), xp.asarray(b3)
    nb, m, k = a3.shape
    n = b3.shape[2]
    finite_a, finite_b = xp.isfinite(a3), xp.isfinite(b3)
    all_finite = bool(xp.all(finite_a)) and bool(xp.all(finite_b))
    a64 = astype(a3 if all_finite else xp.where(finite_a, a3, 0.0), xp.float64)
    b64 = astype(b3 if all_finite else xp.where(finite_b, b3, 0.0), xp.float64)
    if force_fallback:
        out = xp.empty((nb, m, n), xp.float64)
        todo = xp.ones((nb, m, n), bool)
    else:
        approx = xp.matmul(a64, b64)
        g = error_factor(k)
        row_norm, col_norm = _norms(a64, b64)
        out, certified = _certify_acc(approx, (row_norm * width_factor(k))[:, :, None],
                                      col_norm[:, None, :], acc)
        zero_sum = (row_norm[:, :, None] == 0) | (col_norm[:, None, :] == 0)
        todo = ~certified & ~zero_sum
        if xp.any(todo):                               # second certificate: approx is exact
            b_i, m_i, n_i = xp.nonzero(todo)
            qa = per_line_lowest_bit(b_i * m + m_i, lambda u: a3[u // m, u % m, :],
                           lambda: lowest_bit_exponent(a3, axis=2), nb * m)
            qb = per_line_lowest_bit(b_i * n + n_i, lambda u: b3[u // n, :, u % n],
                           lambda: lowest_bit_exponent(b3, axis=1), nb * n)
            upper = cauchy_schwarz_bound(row_norm[b_i, m_i], col_norm[b_i, n_i], g)
            exact_flag = sums_exactly(upper, qa + qb)
            hit = tuple(w[exact_flag] for w in (b_i, m_i, n_i))
            out[hit] = _round_acc(approx[hit], acc)
            todo[hit] = False
            zero_sum[hit] = approx[hit] == 0
        _fix_zero_signs(out, zero_sum, a3, b3)         # exact zeros: IEEE sign rule
    count = int(xp.count_nonzero(todo))
    if count:
        where = xp.nonzero(todo)
        step = max(1, tuning().sums_chunk // max(k, 1))
        for lo in range(0, count, step):
            b_i, m_i, n_i = (w[lo:lo + step] for w in where)
            products = a64[b_i, m_i, :] * b64[b_i, :, n_i]
            out[b_i, m_i, n_i] = _round_acc(round_to_odd_sum(products), acc)
    if not all_finite:
        _apply_non_finite(out, a3, b3, finite_a, finite_b)
    return out, count


def exact_rows_sum(rows: xp.ndarray, acc, *, force_fallback: bool = False
                   ) -> tuple[xp.ndarray, int]:
    """Sum of each row of a (n, K) float32 array, exact, rounded once to ``acc``.

    Rows whose float64 sum is exact by their exponent window (``exponent_window_open``: the
    common case of gradients) are rounded from that sum straight away; an exact zero sum is
    +0 then (its terms are not all zeros, and IEEE addition of terms not all zeros gives +0
    for an exact zero in any order: x + (-x) is +0, +0 + -0 is +0). All-zero rows take the
    zero-sign rule (``sums.zero_sum``); the other rows, inf and NaN among them, take
    ``_rows_sum_certified``.
    """
    rows = xp.asarray(rows)
    k = rows.shape[1]
    if force_fallback or not rows.shape[0] * k:
        return _rows_sum_certified(rows, acc, force_fallback)
    with xp.errstate(invalid="ignore", over="ignore"):
        approx, top, low = _sums_and_patterns(rows)
        out = astype(astype(approx, xp.float32), xp.float64) if acc == FP32 else \
            round_to(approx, acc)                       # as _round_acc
    # (bool counts: NumPy's any costs several times more on these small arrays)
    zero = top == 0
    if xp.count_nonzero(zero):                         # a row of zeros (+0 or -0)
        out[zero] = zero_sum(rows[zero])
    open_rows = exponent_window_open(top, low, k)
    if not xp.count_nonzero(open_rows):
        return out, 0
    idx = xp.nonzero(open_rows)[0]
    out[idx], count = _rows_sum_certified(rows[idx], acc, False)
    return out, count


# Python ints: they take the int32 patterns' dtype (weak scalars in every array library)
_EXPONENT_SHIFT = 23            # |x|'s pattern >> 23: the exponent field
_LARGEST_FINITE_EXPONENT = 254


def exponent_window_open(top: xp.ndarray, low: xp.ndarray, terms: int) -> xp.ndarray:
    """Where a float64 sum of ``terms`` finite float32 values may not be exact, judged from
    their exponent window alone (``_sums_and_patterns``: ``top`` = the largest |x| pattern,
    ``low`` = the pattern of minus the smallest nonzero |x|, -2**31 + p, or 0 for an
    all-zero line, int32; all-zero lines are never open, lines holding inf or NaN always).
    Outside the mask the float64 sum, in any order, IS the exact sum.

    Proof. A pattern without its sign bit is the magnitude's, so ``top >> 23`` is the
    largest biased exponent E of the line's values, and ((``low`` - 1) >> 23) + 256, that
    is (p - 1) >> 23 with p the smallest nonzero |x| pattern, is at most the smallest
    nonzero value's (one low when that value is a power of two: p - 1 borrows from the
    exponent field; an all-zero line gives (-1 >> 23) + 256 = 255).
    With e = max(E, 1) every finite float32 x has |x| < 2**(e - 126) and is a multiple of
    2**(e - 150) (subnormals: e = 1, multiples of 2**-149), and patterns order like
    magnitudes, so every nonzero term is a multiple of 2**q, q = e_low - 150, and
    S = sum |x| < 2**(B + e_top - 126) with 2**B >= ``terms``. Every partial sum, whatever
    the order or blocking (pairwise, SIMD lanes, blocks added up, threads), is a multiple of
    2**q with magnitude <= S: a float64 (53 bits, q >= -150 > -1074) when
    B + e_top - 126 <= q + 53, i.e. e_top - e_low <= 29 - B. Then no addition rounds.
    The mask reads E for e and the one-low exponent for e_low: where E_top >= 1 that only
    widens the window; where E_top = 0 every term is subnormal (multiples of 2**-149 below
    2**-126), and their sum is exact for any K <= 2**29 (2**(B - 126) <= 2**(-149 + 53)),
    which the mask (0 > E_low + limit never holds) says. A window of 22 binades at K = 128
    holds nearly every gradient column (a ReLU's exact zeros take no part).
    """
    limit = 29 - max(terms - 1, 0).bit_length()
    if limit < 0:
        return xp.ones(top.shape, bool)
    # The bound is capped at 254, the largest finite exponent: a line holding inf or NaN
    # (top >> 23 = 255) is open too.
    # (p - 1) >> 23 from low - 1 = -2**31 + p - 1 (arithmetic shift: -256 + that), 255 for
    # an all-zero line (low - 1 = -1)
    bound = xp.add((low - 1) >> _EXPONENT_SHIFT, limit + 256)
    return (top >> _EXPONENT_SHIFT) > xp.minimum(bound, _LARGEST_FINITE_EXPONENT, out=bound)


def _rows_sum_certified(rows: xp.ndarray, acc, force_fallback: bool
                        ) -> tuple[xp.ndarray, int]:
    """exact_rows_sum by the certificates: the interval one (N = fl(sum |x|)), then the
    lowest-bit one (``sums_exactly``), then exact integer-limb sums; inf and NaN by IEEE."""
    count_rows, k = rows.shape
    approx, magnitude = _float64_sums(rows)
    # Finite float32 values cannot overflow a float64 sum (K 2**128 < 2**1024): the sum of
    # magnitudes is finite exactly when every value is.
    all_finite = bool(xp.isfinite(xp.sum(magnitude)))
    terms = rows
    if not all_finite:
        finite = xp.isfinite(rows)
        terms = xp.where(finite, rows, 0.0)
        approx, magnitude = _float64_sums(terms)
    if force_fallback:
        out = xp.empty(count_rows, xp.float64)
        todo = xp.ones(count_rows, bool)
    else:
        g = error_factor(k)
        out, certified = _certify_acc(approx, magnitude * width_factor(k), None, acc)
        zero = magnitude == 0
        if xp.any(zero):
            out[zero] = zero_sum(rows[zero])
            certified |= zero
        todo = ~certified
        if xp.any(todo):
            idx = xp.nonzero(todo)[0]
            lowest = lowest_bit_exponent(rows[idx], axis=1)
            idx = idx[sums_exactly(magnitude[idx] * (1 + 2 * g), lowest)]
            out[idx] = xp.where(approx[idx] == 0, 0.0, _round_acc(approx[idx], acc))
            todo[idx] = False
    count = int(xp.count_nonzero(todo))
    if count:
        out[todo] = _round_acc(round_to_odd_sum(astype(terms[todo], xp.float64)), acc)
    if not all_finite:
        special = xp.where(finite, 0.0, astype(rows, xp.float64))
        with xp.errstate(invalid="ignore"):
            special = xp.sum(special, axis=1)          # IEEE: NaN wins, +inf + -inf is NaN
        bad = ~xp.all(finite, axis=1)
        out[bad] = special[bad]
    return out, count


def _sums_and_patterns(rows: xp.ndarray):
    """(fl64 sum, ``top``, ``low``) of each row of float32 ``rows``, as
    ``exponent_window_open`` reads them: top = max of |x|'s int32 pattern, low = min of the
    int32 pattern of 0 - |x|: -2**31 + |x|'s for nonzero x, ordered like |x|, and +0's, 0,
    for zeros, out of the minimum (signed integers only: torch has no arithmetic on
    unsigned ones). Block by block in memory order through a reused buffer, as
    ``_float64_sums``; the sums are float64 sums of the widened values (any order: see the
    certificates). Call under errstate(invalid="ignore")."""
    across = is_contiguous(rows, "F") and not is_contiguous(rows, "C")
    lines = rows.T if across else rows      # across: the sums run across the lines
    count, width = lines.shape
    # int32 elements per block (tuning().certified_pattern_block)
    step = max(1, tuning().certified_pattern_block // width)
    patterns = scratch("rows_sum.patterns", xp.int32, min(step, count) * width)
    axis = 0 if across else 1
    parts = []
    for lo in range(0, count, step):
        hi = min(lo + step, count)
        part = lines[lo:hi]
        pattern = xp.reshape(patterns[:(hi - lo) * width], (hi - lo, width))
        xp.bitwise_and(bitcast(part, xp.int32), 0x7FFFFFFF, out=pattern)     # |x|'s
        approx = xp.sum(part, axis=axis, dtype=xp.float64)
        top = xp.max(pattern, axis=axis)
        magnitude = bitcast(pattern, xp.float32)
        xp.subtract(0.0, magnitude, out=magnitude)             # -|x|; +0 for zeros
        parts.append((approx, top, xp.min(pattern, axis=axis)))
    if len(parts) == 1:
        return parts[0]
    if not across:
        return tuple(xp.concatenate(part) for part in zip(*parts))
    approx, top, low = parts[0]
    for more in parts[1:]:
        approx += more[0]
        xp.maximum(top, more[1], out=top)
        xp.minimum(low, more[2], out=low)
    return approx, top, low


def _float64_sums(rows: xp.ndarray) -> tuple[xp.ndarray, xp.ndarray]:
    """(fl64 sum, fl64 sum of |x|) of each row of float32 ``rows``, widened block by block
    in memory order into one reused buffer (no full float64 copy, no transposition).
    Column-major rows (a bias gradient's columns) are summed as the row-major array they
    are the transpose of, a block of its rows at a time, the partial sums added up: another
    order of the same additions, which the certificate covers (any order)."""
    across = is_contiguous(rows, "F") and not is_contiguous(rows, "C")
    lines = rows.T if across else rows      # across: the sums run across the lines
    count, width = lines.shape
    # float64 elements per block (tuning().certified_block: in cache)
    step = max(1, tuning().certified_block // max(1, width))
    buffer = scratch("rows_sum.block", xp.float64, min(step, count) * width)
    sums = xp.zeros((2, width if across else count), xp.float64)
    approx, magnitude = sums
    with xp.errstate(invalid="ignore"):     # inf - inf: the caller starts again without
        for lo in range(0, count, step):
            hi = min(lo + step, count)
            block = xp.reshape(buffer[:(hi - lo) * width], (hi - lo, width))
            xp.copyto(block, lines[lo:hi])
            if across:
                approx += xp.sum(block, axis=0)
                magnitude += xp.sum(xp.abs(block, out=block), axis=0)
            else:
                approx[lo:hi] = xp.sum(block, axis=1)
                magnitude[lo:hi] = xp.sum(xp.abs(block, out=block), axis=1)
    return approx, magnitude


def lowest_bit_exponent(x: xp.ndarray, axis: int) -> xp.ndarray:
    """A lower bound, over ``axis``, on the exponent of the lowest set bit of each nonzero
    float32 (exact except for powers of two, up to 1 low; zeros are ignored; an all-zero
    line gives 2000; non-finite values give garbage, as their results are replaced anyway).

    In value space: clearing the lowest set bit of the pattern (b & (b - 1)) lowers |x| by
    exactly that bit's value when the fraction is nonzero. For a power of two it clears an
    exponent bit instead and lowers |x| by at least |x| / 2: one bit low, still a bound.
    """
    magnitude = bitcast(xp.ascontiguousarray(x), xp.int32) & 0x7FFFFFFF
    cleared = magnitude - 1                # -1 for zeros; they are masked out below
    cleared &= magnitude
    low = bitcast(magnitude, xp.float32) - bitcast(cleared, xp.float32)     # exact (Sterbenz)
    if low.shape[axis] == 0:
        return xp.full(low.shape[:axis] + low.shape[axis + 1:], 2000, xp.int64)
    # a plain where + min (not ufunc.reduce(where=, initial=)): every array library has both
    smallest = xp.min(xp.where(magnitude != 0, low, xp.inf), axis=axis)
    exponent = astype(xp.frexp(smallest)[1], xp.int64) - 1
    return xp.where(xp.isinf(smallest), 2000, exponent)


def per_line_lowest_bit(keys: xp.ndarray, lines, all_lines, total: int) -> xp.ndarray:
    """lowest_bit_exponent of the line named by each key: over the distinct lines gathered
    (few of them) or over every line at once (many), whichever reads less memory."""
    unique, inverse = xp.unique(keys, return_inverse=True)
    if size(unique) * 8 > total:
        return xp.reshape(all_lines(), (-1,))[keys]
    return lowest_bit_exponent(lines(unique), axis=1)[inverse]


def _norms(a64: xp.ndarray, b64: xp.ndarray):
    """||a_i||_2 and ||b_j||_2 in float64, (nb, M) and (nb, N); each errs by less than
    (K/2 + 2) u relative, which ``cauchy_schwarz_bound``'s 1 + 2g covers."""
    return (xp.sqrt(xp.einsum("bmk,bmk->bm", a64, a64)),
            xp.sqrt(xp.einsum("bkn,bkn->bn", b64, b64)))


def cauchy_schwarz_bound(row_norm, col_norm, g: float) -> xp.ndarray:
    """U >= sum_k |a_ik b_kj|: ||a_i|| ||b_j|| (Cauchy-Schwarz) inflated by 1 + 2g,
    g = K * 2**-52, which covers the norms' rounding. One pass over a and b instead of a
    second matrix product; about 1.5x looser than sum |a||b| on random data."""
    return row_norm * col_norm * (1 + 2 * g)


def _fix_zero_signs(out, all_zero, a3, b3) -> None:
    """Where the exact sum is zero, it is -0 exactly when every product is -0: a zero sum
    with a product of positive sign is +0 (a nonzero one cancels; all zero: +0 + -0)."""
    if not xp.any(all_zero):
        return
    # host ints: an integer index gives a view of out[batch], written below (a 0-d array
    # index would give a copy in NumPy)
    for batch in to_list(xp.unique(xp.nonzero(all_zero)[0])):
        mask = all_zero[batch]
        rows, cols = xp.nonzero(xp.any(mask, axis=1))[0], xp.nonzero(xp.any(mask, axis=0))[0]
        dtype = xp.float32 if a3.shape[2] < 1 << 24 else xp.float64  # exact counts
        sign_a = astype(xp.signbit(a3[batch][rows]), dtype)              # (r, K)
        sign_b = astype(xp.signbit(b3[batch][:, cols]), dtype)           # (K, c)
        # Count the products with a positive sign.
        positive = (1 - sign_a) @ (1 - sign_b) + sign_a @ sign_b
        negative_zero = (positive == 0) & (a3.shape[2] > 0)
        sub = out[batch][xp.ix_(rows, cols)]
        sub_mask = mask[xp.ix_(rows, cols)]
        sub[sub_mask] = xp.where(negative_zero, -0.0, 0.0)[sub_mask]
        out[batch][xp.ix_(rows, cols)] = sub


def _apply_non_finite(out, a3, b3, finite_a, finite_b) -> None:
    """IEEE results for every element whose row of a or column of b holds inf or NaN."""
    bad_rows = ~xp.all(finite_a, axis=2)               # (nb, M)
    bad_cols = ~xp.all(finite_b, axis=1)               # (nb, N)
    with xp.errstate(invalid="ignore"):
        f = xp.float32
        a_inf, b_inf = xp.isinf(a3), xp.isinf(b3)
        a_pos, a_neg = (a3 > 0), (a3 < 0)              # NaN is neither
        b_pos, b_neg = (b3 > 0), (b3 < 0)
        a_nan, b_nan = xp.isnan(a3), xp.isnan(b3)
        a_zero, b_zero = (a3 == 0), (b3 == 0)

    def count(pairs):                                  # sum of indicator matmuls, exact
        return sum(xp.matmul(astype(x, f), astype(y, f)) for x, y in pairs)

    positive_inf = count([(a_inf & a_pos, b_pos), (a_inf & a_neg, b_neg),
                          (~a_inf & a_pos, b_inf & b_pos), (~a_inf & a_neg, b_inf & b_neg)])
    negative_inf = count([(a_inf & a_pos, b_neg), (a_inf & a_neg, b_pos),
                          (~a_inf & a_pos, b_inf & b_neg), (~a_inf & a_neg, b_inf & b_pos)])
    nan = ((count([(a_inf, b_zero), (a_zero, b_inf)]) > 0)
           | xp.any(a_nan, axis=2)[:, :, None] | xp.any(b_nan, axis=1)[:, None, :])
    result = xp.where(positive_inf > 0, xp.inf, -xp.inf)
    result[nan | ((positive_inf > 0) & (negative_inf > 0))] = xp.nan
    affected = bad_rows[:, :, None] | bad_cols[:, None, :]
    out[affected] = result[affected]
