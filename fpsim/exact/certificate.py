"""The interval certificate, written once: when a float64 sum provably rounds like the exact one.

Setting. ``approx`` = fl64(sum of K exact float64 terms p_k), added in any order, blocked,
vectorised or with FMA (any BLAS, any thread count); s = sum p_k is the exact value and
S = sum |p_k|. Then |approx - s| <= gamma_{K-1} S, gamma_n = n u / (1 - n u), u = 2**-53
(Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 4.2 and Lemma 8.4);
``error_factor(K)`` = g = K * 2**-52 bounds that with room to spare (g < 2**-12 below 2**40
terms); the first certificate takes the tighter h = ``tight_error_factor(K)`` =
K 2**-53 (1 + K 2**-52) >= (K - 1) u (1 + 2 (K - 1) u) >= gamma_{K-1} ((K - 1) u < 2**-13).
The caller supplies N >= 0 with N (1 + 2h) >= S. For a dot product N = ||a_i|| ||b_j||
(Cauchy-Schwarz) with computed norms: each is the rounded root of a float64 sum of K exact
squares, at least the exact norm times sqrt(1 - gamma_{K-1}) (1 - u), so the exact product of
the norms is at most N / ((1 - gamma_{K-1}) (1 - u)**2) <= N (1 + (K + 1) u + 4 (K**2 + 1)
u**2) <= N (1 + 2h) for K >= 2 (K = 1: both norms and the one product are exact). For a sum
of values N = fl64(sum |x|) >= S (1 - gamma_{K-1}), and S <= N (1 + gamma_{K-1} +
2 gamma_{K-1}**2) <= N (1 + 2h).

First certificate (``certify``). The half-width w = fl(fl(N * c)) with
c = ``width_factor(K)`` = (h + 2**-50)(1 + 2h)(1 + 2**-39) (N as one factor or as a product
of two, each multiplication rounded, c itself computed in float64) is at least
(h + 2**-50) N (1 + 2h) >= h S + 2**-50 N (1 + 2h): its roundings lose at most 8 u relative,
far less than the 2**-39 margin. Each end fl64(approx -+ w) errs by at most
u (|approx| + w) <= 2**-53 N (1 + 2h) (1 + 2**-11) (|approx| <= S (1 + h), w <= 2**-12 N),
which 2**-50 N (1 + 2h) exceeds, so fl64(approx - w) <= approx - h S <= s <= approx + h S <=
fl64(approx + w): the exact s lies between the computed ends. Every rounding of fpsim
(``round_to`` in any mode but stochastic, the float32 cast) is monotonic: if both ends round
to the same bit pattern, so does every value between them, s included. Any w' >= w
encloses s as well.
``certify_fp32_open`` is the same certificate for a 2-D product with float32 ends, computed
chunk by chunk and reporting only the elements it leaves open.

Second certificate (``sums_exactly``), for what the first cannot take (exact ties, exact
zeros): if every term is a multiple of 2**q and U < 2**(q + 53), U >= S, every partial sum
is a multiple of 2**q below 2**(q + 53) in magnitude, hence a float64: approx is s itself.
``line_quanta`` gives, per row or column of a float32 matrix, a power of two dividing every
element: for a dot product q = its row's plus its column's.

Split certificate (``split_certify``), for the few elements the first one leaves, with their
K terms at hand: one error-free split (the extraction step of Rump, Ogita and Oishi's
AccSum, "Accurate floating-point summation part I", SIAM J. Sci. Comput. 31(1), 2008) makes
the float64 result nearly exact, so only exact ties and exact sums remain. Take sigma, a
power of two >= 2U (U >= S, K < 2**26). For each term p, |p| <= S <= sigma/2, so
fl(sigma + p) lies in [sigma/2, 3 sigma/2] and hi = fl(sigma + p) - sigma is exact (Sterbenz),
a multiple of 2**-53 sigma (the float64 spacing there is 2**-53 sigma or 2**-52 sigma);
lo = p - hi = (sigma + p) - fl(sigma + p) is that addition's rounding error, a float64
(computed exactly) with |lo| <= 2**-53 sigma. Then sum |hi| <= S + K 2**-53 sigma <= sigma:
every partial sum of the hi parts is a multiple of 2**-53 sigma of magnitude <= sigma, a
float64, so tau = fl(sum hi) is exact in any order. The lo parts' float64 sum E errs by at
most g sum |lo| <= g K 2**-53 sigma (as above, g = ``error_factor(K)``), and r = fl(tau + E)
by less than 2**-52 |r|: |r - s| <= 2**-52 |r| + K**2 2**-105 sigma. The half-width
w = fl(2**-50 |r| + K**2 2**-103 sigma) (both products exact: powers of two, K**2 < 2**53)
is at least (2**-50 |r| + K**2 2**-103 sigma)(1 - u), and each end fl64(r -+ w) errs by at
most u (|r| + w), so w (1 - u) - u |r| >= |r - s|: the ends enclose s and the first
certificate's monotonicity argument applies. Where they do not agree and every lo part is
zero, tau is s itself (an exact zero takes the IEEE sign from the terms, ``sums.zero_sum``).
No step depends on the summation order. Terms are multiples of 2**-298 below 2**266
(products of float32 values): nothing underflows or overflows in float64.

>>> import numpy as np
>>> approx = np.float64([1.0, 1.0 + 2.0 ** -24])      # fl64 sums of two terms each
>>> N = np.float64([2.0, 2.0])                         # >= sum |p|
>>> low, high, certified = certify(approx, N * width_factor(2))
>>> high.tolist(), certified.tolist()                  # 1 + 2**-24 is an fp32 tie
([1.0, 1.0000001192092896], [True, False])
"""
from __future__ import annotations

import math

from ..backend import astype, bitcast, bits, fused, is_contiguous, scratch, size, tuning, xp
from .sums import zero_sum

__all__ = ["error_factor", "tight_error_factor", "width_factor", "certify", "certify_fp32_open",
           "sums_exactly", "line_quanta", "lowest_bit_patterns", "quanta_from_patterns",
           "split_certify"]


def error_factor(terms: int) -> float:
    """g with |fl(sum p) - sum p| <= g * fl(sum |p|) for every summation order of ``terms``
    exact float64 terms: g = n * 2**-52 exceeds gamma_{n-1} / (1 - gamma_{n-1}) * (1 + u),
    which also covers the rounding of g * fl(sum|p|), for every n < 2**40."""
    if terms >= 1 << 40:
        raise ValueError(f"sums of {terms} terms are beyond the certified range (2**40)")
    return max(terms, 1) * 2.0 ** -52


def tight_error_factor(terms: int) -> float:
    """h = K 2**-53 (1 + K 2**-52) >= gamma_{K-1}, the first certificate's error factor (half
    of ``error_factor`` to first order; module docstring)."""
    g = error_factor(terms)
    return g * 0.5 * (1 + g)


def width_factor(terms: int) -> float:
    """c with w = N * c the certified half-width of a sum of ``terms`` exact terms, for any
    N with N (1 + 2h) >= sum |p|, h = ``tight_error_factor(terms)`` (module docstring)."""
    h = tight_error_factor(terms)
    return (h + 2.0 ** -50) * (1 + 2 * h) * (1 + 2.0 ** -39)


def certify(approx: xp.ndarray, width: xp.ndarray, width_cols: xp.ndarray | None = None,
            round_end=None):
    """(low, high, certified): the ends approx -+ w rounded by ``round_end``, and where their
    bit patterns agree (there the exact sum rounds to ``high``).

    w = ``width`` (shaped like ``approx``, or broadcasting along its first axis) times
    ``width_cols`` when given (broadcasting against ``approx[i]``), the product rounded once:
    pass N's two factors, one already times ``width_factor``. ``round_end`` maps float64
    arrays to rounded arrays (``round_to`` in any mode but stochastic); None is the float32
    cast, computed chunk by chunk (``tuning().certificate_chunk`` elements) so the
    temporaries stay in cache: ``low`` and ``certified`` then live in this thread's reused
    buffers, valid until the next call, and ``high`` is a fresh float32 array. ``approx`` has at
    least one axis. Host arrays are taken as the backend's (``xp.asarray``), as by every function
    exported here.
    """
    approx, width = xp.asarray(approx), xp.asarray(width)
    width_cols = None if width_cols is None else xp.asarray(width_cols)
    if round_end is not None:
        with xp.errstate(invalid="ignore", over="ignore"):
            w = width if width_cols is None else width * width_cols
            low, high = round_end(approx - w), round_end(approx + w)
        return low, high, _same_bits(low, high)
    count = size(approx)
    low = xp.reshape(scratch("certify.low", xp.float32, count), approx.shape)
    high = xp.empty(approx.shape, xp.float32)
    certified = xp.reshape(scratch("certify.same", bool, count), approx.shape)
    # one at a time (an empty stack has no approx[0])
    if approx.ndim > 2 and approx.shape[0] and size(approx[0]) >= tuning().certificate_chunk:
        for i in range(approx.shape[0]):
            _fp32_ends(approx[i], _line(width, approx, i), _line(width_cols, approx, i),
                       low[i], high[i], certified[i])
    else:
        _fp32_ends(approx, width, width_cols, low, high, certified)
    return low, high, certified


def _line(x, approx, i):
    """Operand x's part for approx[i] (x broadcasts against approx)."""
    if x is None or x.ndim < approx.ndim:
        return x
    return x[0] if x.shape[0] == 1 else x[i]


def _fp32_ends(approx, width, width_cols, low, high, same) -> None:
    """low, high = fl32(fl64(approx -+ w)) and same = their bit patterns agree, chunks of
    rows along axis 0 (each chunk compared while it is in cache). The float64 subtraction
    and addition write straight into the float32 arrays: NumPy computes them in float64 (the
    inputs' loop) and casts each result once on output, the same bits as a float64
    temporary cast afterwards."""
    lines = approx.shape[0]
    step = max(1, tuning().certificate_chunk // max(1, size(approx) // max(1, lines)))
    chunk = (min(step, lines),) + approx.shape[1:]
    w_buf = xp.reshape(scratch("certify.width", xp.float64, math.prod(chunk)), chunk)
    with xp.errstate(invalid="ignore", over="ignore"):
        for lo in range(0, lines, step):
            hi = min(lines, lo + step)
            x = approx[lo:hi]
            w = _rows(width, approx, lo, hi)
            if width_cols is not None:
                w = xp.multiply(w, _rows(width_cols, approx, lo, hi), out=w_buf[:hi - lo])
            xp.subtract(x, w, out=low[lo:hi])
            xp.add(x, w, out=high[lo:hi])
            _same_bits(low[lo:hi], high[lo:hi], same[lo:hi])


def certify_fp32_open(approx: xp.ndarray, width_rows: xp.ndarray, width_cols: xp.ndarray,
                      high: xp.ndarray, row_blocks: xp.ndarray | None = None):
    """The first certificate on a 2-D ``approx`` (M, N) with float32 ends, reporting only
    the elements it leaves open. w = ``width_rows`` (M,) times ``width_cols`` (N,), the
    product rounded once; with ``row_blocks`` (M,) (a batched product's rows, each in its
    block), ``width_cols`` is (blocks, N) and row i takes ``width_cols[row_blocks[i]]``.
    ``high`` (float32, C-ordered (M, N)) receives fl32(fl64(approx + w)) everywhere.
    Returns (open, low, high_open): the flat C-order indices where fl32(fl64(approx - w))
    has other bits, and the two ends there. Certified elements round to ``high``. Chunks
    of rows: the work arrays stay in cache and only the open elements leave the loop (no
    (M, N) low end or mask is written).

    Each chunk is first certified with one width W = fl(max width_rows * max width_cols)
    (the maxima over the chunk's rows and the widths they take; a scalar operand: no outer
    product, cheaper passes). W >= w everywhere (rounding is monotonic), so where its ends
    agree they enclose s as well and fl32(fl64(approx +- W)) is the common value, the same as
    fl32(fl64(approx +- w)) between them; only the few elements where they differ are taken again
    with their own w (gathered), and the result is the same as with w throughout. Where W leaves
    more than 1/``recheck_share`` of a chunk (widths of very different sizes), the chunk is taken
    again with w throughout. Chunk sizes and thresholds: ``tuning()``'s ``certificate_open_chunk``,
    ``einsum_from``, ``recheck_share``. (This needs widths > 0, as the callers' floors give.) A
    backend's fused kernel, where offered, gives the same in one compiled pass, w per element."""
    approx, width_rows, width_cols = xp.asarray(approx), xp.asarray(width_rows), \
        xp.asarray(width_cols)
    high = xp.asarray(high)              # the caller's array itself (it receives the ends)
    kernel = fused("certify_fp32_open")  # one compiled pass, w per element: the same bits
    if kernel is not None:
        found = kernel(approx, width_rows, width_cols, high, row_blocks)
        if found is not None:            # None: inputs it declines (widths <= 0 ...)
            return found
    cols = _ColumnWidths(width_cols, None if row_blocks is None else xp.asarray(row_blocks))
    settings = tuning()
    recheck_share = settings.recheck_share
    lines, n = approx.shape
    step = max(1, settings.certificate_open_chunk // max(1, n))
    rows = min(step, lines)
    if rows * n >= settings.einsum_from:
        # One rounded product per element: an einsum outer product is faster per element
        # than NumPy's broadcast multiply here, the multiply faster per call (small
        # matrices). Large work arrays are reused (fresh pages cost more than the work);
        # small ones are cheaper to allocate than to look up.
        outer = _outer_einsum
        low_buf = xp.reshape(scratch("certify.open.low", xp.float32, rows * n), (rows, n))
        open_buf = xp.reshape(scratch("certify.open.mask", bool, rows * n), (rows, n))
    else:
        outer = _outer_multiply
        low_buf = xp.empty((rows, n), xp.float32)
        open_buf = xp.empty((rows, n), bool)
    # one width per chunk only where chunks are large (below, the outer product is cheap)
    widest = outer is _outer_einsum
    found = []
    with xp.errstate(invalid="ignore", over="ignore"):
        for lo in range(0, lines, step):
            hi = min(lines, lo + step)
            x, top = approx[lo:hi], high[lo:hi]
            if not widest:
                wide = outer(width_rows[lo:hi], cols.chunk(lo, hi), _w_buffer(False, hi - lo, n))
            else:                                                       # W, rounded once
                wide = float(xp.max(width_rows[lo:hi])) * cols.widest(lo, hi)
            low = xp.subtract(x, wide, out=low_buf[:hi - lo])
            xp.add(x, wide, out=top)
            differ = xp.not_equal(bits(low), bits(top), out=open_buf[:hi - lo])
            if not xp.any(differ):
                continue
            where = xp.flatnonzero(differ)
            # flat indices into the C-ordered chunks: thousands of elements may be open
            # (fp32 ties of narrow data), and 1-D gathers are the cheap ones
            if not widest:
                found.append((where + lo * n, _flat(low)[where], _flat(top)[where]))
                continue
            if where.shape[0] * recheck_share > (hi - lo) * n:         # w over the chunk
                w = outer(width_rows[lo:hi], cols.chunk(lo, hi),
                          _w_buffer(outer is _outer_einsum, rows, n)[:hi - lo])
                low = xp.subtract(x, w, out=low)
                xp.add(x, w, out=top)
                differ = xp.not_equal(bits(low), bits(top), out=differ)
                where = xp.flatnonzero(differ)
                found.append((where + lo * n, _flat(low)[where], _flat(top)[where]))
                continue
            line, col = xp.divmod(where, n)                             # w where W failed
            w = width_rows[lo:hi][line] * cols.at(lo + line, col)
            value = _flat(x)[where]
            low = astype(value - w, xp.float32)
            up = astype(value + w, xp.float32)
            _flat(top)[where] = up
            keep = xp.flatnonzero(bits(low) != bits(up))
            found.append((where[keep] + lo * n, low[keep], up[keep]))
    found = [part for part in found if part[0].shape[0]]
    if not found:
        return xp.zeros(0, xp.intp), xp.zeros(0, xp.float32), xp.zeros(0, xp.float32)
    if len(found) == 1:
        return found[0]
    return tuple(xp.concatenate(part) for part in zip(*found))


class _ColumnWidths:
    """The column widths of ``certify_fp32_open``'s rows: one (N,) vector for every row, or
    (``row_blocks``: a batched product's rows) the row of a (blocks, N) array for the row's
    block."""

    def __init__(self, widths, row_blocks):
        self.widths, self.row_blocks = widths, row_blocks
        self.block_widest = None if row_blocks is None else xp.max(widths, axis=1)
        self.largest = None

    def widest(self, lo: int, hi: int) -> float:
        """The largest width any of rows lo:hi takes."""
        if self.row_blocks is not None:
            return float(xp.max(self.block_widest[self.row_blocks[lo:hi]]))
        if self.largest is None:
            self.largest = float(xp.max(self.widths))
        return self.largest

    def chunk(self, lo: int, hi: int) -> xp.ndarray:
        """Rows lo:hi's widths: (N,) for all of them, or (hi - lo, N) row by row."""
        if self.row_blocks is None:
            return self.widths
        return xp.take(self.widths, self.row_blocks[lo:hi], axis=0)

    def at(self, rows: xp.ndarray, cols: xp.ndarray) -> xp.ndarray:
        """The widths of elements (rows, cols), gathered."""
        if self.row_blocks is None:
            return self.widths[cols]
        return self.widths[self.row_blocks[rows], cols]


def _w_buffer(reused: bool, rows: int, n: int) -> xp.ndarray:
    """The outer product's work array: reused where large, fresh where small."""
    if reused:
        return xp.reshape(scratch("certify.width", xp.float64, rows * n), (rows, n))
    return xp.empty((rows, n), xp.float64)


def _flat(x):
    """The C-ordered x as one axis (a view: assigning into it writes x)."""
    return xp.reshape(x, (-1,))


def _outer_einsum(rows, cols, out):
    return xp.einsum("i,j->ij" if cols.ndim == 1 else "i,ij->ij", rows, cols, out=out)


def _outer_multiply(rows, cols, out):
    return xp.multiply(rows[:, None], cols, out=out)


def _rows(x, approx, lo, hi):
    """Rows lo:hi of operand x where it has approx's first axis, else x (it broadcasts)."""
    return x[lo:hi] if x.ndim == approx.ndim and x.shape[0] != 1 else x


def _same_bits(low: xp.ndarray, high: xp.ndarray, out=None) -> xp.ndarray:
    return xp.equal(bits(low), bits(high), out=out)


def sums_exactly(upper: xp.ndarray, lowest_bit: xp.ndarray) -> xp.ndarray:
    """Where the float64 sum is exact (second certificate): ``upper`` >= sum |p| and every
    term a multiple of 2**``lowest_bit``."""
    return upper < xp.ldexp(1.0, xp.minimum(lowest_bit + 53, 1023))


def line_quanta(x: xp.ndarray, axis: int) -> xp.ndarray:
    """For each line of the finite float32 ``x`` along ``axis`` (0 or 1 of a 2-D array): a
    power of two (float64) that divides every element of the line, 1.0 for an all-zero line.

    Clearing a pattern's lowest set bit (p & (p - 1)) lowers |x| by exactly that bit's value
    where the fraction is nonzero (Sterbenz: the difference is exact), by at least |x| / 2
    for a power of two (an exponent bit goes): the line's smallest such difference, cut to
    the power of two at or below it, divides every element. The patterns of negative
    float32 values, read as int32, order like the values' magnitudes above -2**31 (the
    pattern of +0), so the minimum of the negated differences' patterns is the smallest
    nonzero difference (a zero difference, +0, stays out of it). The minimum may be taken
    over parts of a line and combined (``lowest_bit_patterns``, ``quanta_from_patterns``).
    Signed integers only: torch has no arithmetic on unsigned ones."""
    return quanta_from_patterns(lowest_bit_patterns(x, axis))


def lowest_bit_patterns(x: xp.ndarray, axis: int) -> xp.ndarray:
    """Per line of the finite float32 ``x`` along ``axis``: the smallest nonzero lowest-bit
    difference d of its elements as the int32 pattern of -d (-2**31 + d's pattern), or 0
    (+0's) for an all-zero line; the minimum of these over parts of a line is the whole
    line's (``line_quanta``)."""
    # Python int operands take the int32 patterns' dtype (weak scalars)
    across = is_contiguous(x, "F") and not is_contiguous(x, "C")
    mag = _like(x, across, "quanta.mag", xp.int32)
    xp.bitwise_and(bitcast(x, xp.int32), 0x7FFFFFFF, out=mag)      # |x|, >= 0
    low = _like(x, across, "quanta.low", xp.int32)
    xp.subtract(mag, 1, out=low)                       # -1 for zeros: they give 0 below
    xp.bitwise_and(low, mag, out=low)                  # |x| less its lowest set bit
    # -d = (|x| less that bit) - |x|, exact (Sterbenz); +0 for x = 0
    cleared = bitcast(low, xp.float32)
    xp.subtract(cleared, bitcast(mag, xp.float32), out=cleared)
    return xp.min(low, axis=axis)


def quanta_from_patterns(patterns: xp.ndarray) -> xp.ndarray:
    """``line_quanta`` from the lines' ``lowest_bit_patterns`` (combined by minimum)."""
    smallest = patterns & 0x7FFFFFFF                    # d's pattern; 0 for an all-zero line
    normal = smallest >= 0x00800000                     # subnormal differences: powers of two
    smallest[normal] &= 0x7F800000
    quanta = astype(bitcast(smallest, xp.float32), xp.float64)
    quanta[quanta == 0] = 1.0
    return quanta


def _like(x: xp.ndarray, column_major: bool, name: str, dtype) -> xp.ndarray:
    """A reused work array shaped like the 2-D x, in x's memory order (``column_major``:
    x is F- and not C-ordered)."""
    work = scratch(name, dtype, x.shape[0] * x.shape[1])
    if column_major:
        return xp.reshape(work, x.shape[::-1]).T
    return xp.reshape(work, x.shape)


def split_certify(terms: xp.ndarray, upper: xp.ndarray) -> tuple[xp.ndarray, xp.ndarray]:
    """(fp32 values, known): for each row of ``terms`` (2-D float64, exact products of float32
    values) whose absolute sum is at most ``upper``, the exact row sum rounded once to fp32
    (nearest even, IEEE sign for exact zeros) where ``known``; garbage elsewhere (the split
    certificate in the module docstring)."""
    terms, upper = xp.asarray(terms), xp.asarray(upper)
    rows, k = terms.shape
    if k >= 1 << 26:
        return xp.zeros(rows, xp.float32), xp.zeros(rows, bool)
    sigma = xp.ldexp(1.0, xp.frexp(upper + upper)[1])      # a power of two >= 2U (1 for 0)
    column = sigma[:, None]
    parts = xp.add(terms, column)
    parts -= column                                        # the hi parts, exact
    tau = xp.sum(parts, axis=1)                            # exact, any order
    xp.subtract(terms, parts, out=parts)                   # the lo parts, exact
    with xp.errstate(over="ignore", invalid="ignore"):
        r = tau + xp.sum(parts, axis=1)
        w = xp.abs(r) * 2.0 ** -50
        w += sigma * (float(k * k) * 2.0 ** -103)
        low = astype(r - w, xp.float32)
        high = astype(r + w, xp.float32)
    known = _same_bits(low, high)
    if not xp.all(known):
        where = xp.flatnonzero(~known)
        where = where[~xp.any(parts[where], axis=1)]       # every lo part zero: tau is s
        with xp.errstate(over="ignore"):
            high[where] = astype(tau[where], xp.float32)
        zero = where[tau[where] == 0]
        high[zero] = astype(zero_sum(terms[zero]), xp.float32)
        known[where] = True
    return high, known
