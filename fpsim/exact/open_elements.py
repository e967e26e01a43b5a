"""The exact step of the 2-D fast path (``fast_matmul``): exact sums of chosen elements of a @ b.

``exact_elements(a, b, row_norm, col_norm, rows, cols, approx)`` returns, for each element
(rows[e], cols[e]), the exact dot product of row a_i and column b_j rounded once to fp32, with
the IEEE sign of an exact zero (-0 exactly when every product is -0, IEEE 754-2019 6.3):

* an element whose BLAS value is +-0 (every product zero gives exactly that) and whose row of
  a is sparse (at most ``tuning().support`` nonzeros: a unit that fired for few samples of a
  batch, in a weight gradient g^T x) is settled from that support alone when b is zero on
  it: then every product is zero (a_ik = +-0 off the support, b_kj = +-0 on it), and the
  sign comes from ``exact_zero_signs`` (any sum known to be zero: -0 exactly when
  signbit(a_ik) != signbit(b_kj) for every k) or, where no element of b has its sign bit
  set (relu activations), from a's row alone: -0 exactly when every a_ik has its sign bit.
  Tried where such elements hold at least ``tuning().sparse_from`` products: below, gathering them
  costs less than the test;
* the others gather their K products (exact in float64): every product zero gives the
  zero sum (``sums.zero_sum``), else the split certificate (``certificate.split_certify``),
  else the exact sum rounded to odd (``sums.round_to_odd_sum``), cast once to fp32.

Where the backend offers the fused kernel ``exact_dots`` (``FUSED_KERNELS``; the NumPy backend's
Numba loop, ``fpsim.backend.numba_dots``), it takes every element the sparse test left: each
element's products in a scratch row summed exactly (the tiers of ``certified_row_sums``),
rounded to odd at 53 bits, then once to fp32 (the same one correct rounding); the elements it
leaves undecided (sum |a_ik b_kj| of 2**1019 or more, nonzero sums below 2**-960: never for
finite float32 values) take the steps above, which stay the reference
(``fpsim.rounding.use_compiled(False)``).

Operands are float32 C- or F-ordered arrays, or their float64 copies (``gather_source``).
A batched product comes folded into 2-D (``fast_matmul``, (6)): a's rows and b's columns of
every block side by side, so an element's batch index is part of its row and column.
"""
from __future__ import annotations

from ..backend import astype, bitcast, fused, is_contiguous, size, tuning, xp

from .certificate import error_factor, split_certify
from .exact_dots import cauchy_schwarz_bound
from .sums import round_to_odd_sum, zero_sum

__all__ = ["exact_elements", "exact_zero_signs", "gather_source"]


def exact_elements(a, b, row_norm, col_norm, rows, cols, approx) -> xp.ndarray:
    """float32 exact sums of elements (rows, cols) of a @ b, rounded once to fp32 (module
    docstring); ``approx``: their float64 BLAS values (only where they are zero matters)."""
    a, b, rows, cols, approx = xp.asarray(a), xp.asarray(b), xp.asarray(rows), \
        xp.asarray(cols), xp.asarray(approx)
    row_norm, col_norm = xp.asarray(row_norm), xp.asarray(col_norm)
    count = size(rows)
    out = xp.empty(count, xp.float32)
    todo = xp.arange(count)
    zero = xp.flatnonzero(approx == 0)
    settings = tuning()
    if size(zero) * a.shape[1] >= settings.sparse_from:
        settled, value = _zero_sums_of_sparse_rows(a, b, rows[zero], cols[zero],
                                                   settings.support)
        if xp.any(settled):
            out[zero[settled]] = value[settled]
            left = xp.ones(count, bool)
            left[zero[settled]] = False
            todo = todo[left]
    kernel = fused("exact_dots")        # a backend's compiled pass per element, where offered
    found = kernel(a, b, rows[todo], cols[todo]) if kernel is not None and size(todo) else None
    if found is not None:               # (None: it declined the input)
        value, decided = found
        out[todo[decided]] = value[decided]
        todo = todo[~decided]
    g = error_factor(a.shape[1])
    step = max(1, settings.sums_chunk // a.shape[1])
    for lo in range(0, size(todo), step):
        part = todo[lo:lo + step]
        r, c = rows[part], cols[part]
        products = xp.multiply(_rows_of(a, r), _cols_of(b, c), dtype=xp.float64)
        live = xp.any(products, axis=1)
        if not xp.all(live):        # every product zero (disjoint supports): no sum to take
            out[part[~live]] = astype(zero_sum(products[~live]), xp.float32)
            products, r, c, part = products[live], r[live], c[live], part[live]
        upper = cauchy_schwarz_bound(row_norm[r], col_norm[c], g)     # >= sum |a_ik b_kj|
        acc, known = split_certify(products, upper)
        rest = xp.flatnonzero(~known)
        if size(rest):              # round-to-odd, one fp32 cast
            acc[rest] = astype(round_to_odd_sum(products[rest]), xp.float32)
        out[part] = acc
    return out


def _zero_sums_of_sparse_rows(a, b, rows, cols, support_max: int):
    """(settled, value): where the row of a has at most ``support_max`` nonzeros and b is
    zero on them (every product zero), the IEEE zero sum (float32 +-0; module docstring)."""
    marked = xp.zeros(a.shape[0], bool)      # the distinct rows, without a sort
    marked[rows] = True
    unique_rows = xp.flatnonzero(marked)
    which = (xp.cumsum(marked) - 1)[rows]      # each element's place in unique_rows
    lines = _rows_of(a, unique_rows)                       # (R, K)
    nonzero = lines != 0
    counts = xp.count_nonzero(nonzero, axis=1)
    sparse = counts <= support_max
    value = xp.zeros(size(rows), xp.float32)
    if not xp.any(sparse):
        return xp.zeros(size(rows), bool), value
    width = max(1, int(xp.max(counts[sparse])))
    # each row's nonzero positions first (a stable sort of "is zero"), padded past its count
    support = xp.argsort(xp.logical_not(nonzero), axis=1, kind="stable")[:, :width]
    on_support = xp.arange(width) < counts[:, None]
    b_there = _values_of(b, support[which], cols[:, None])          # (E, width)
    settled = sparse[which] & ~xp.any((b_there != 0) & on_support[which], axis=1)
    if _has_sign_bits(b):
        value[settled] = exact_zero_signs(a, b, rows[settled], cols[settled])
    else:                       # -0 exactly where every a_ik has its sign bit (module docstring)
        value[settled & xp.all(xp.signbit(lines), axis=1)[which]] = -0.0
    return settled, value


def _has_sign_bits(x) -> bool:
    """Whether any element of the float32 or float64 ``x`` has its sign bit set (-0 too):
    its smallest bit pattern, read as a signed integer, is negative."""
    return int(xp.min(bitcast(x, xp.int32 if x.dtype == xp.float32 else xp.int64))) < 0


def exact_zero_signs(a, b, rows, cols) -> xp.ndarray:
    """float32 +-0 for elements (rows, cols) of a @ b whose exact sum is known to be zero: -0
    exactly when every product is -0, that is (the sum being zero) when signbit(a_ik) !=
    signbit(b_kj) for every k (every product is then <= 0, so each is -0). A few probes
    first, the whole lines only where every probe differs."""
    a, b, rows, cols = xp.asarray(a), xp.asarray(b), xp.asarray(rows), xp.asarray(cols)
    value = xp.zeros(size(rows), xp.float32)
    k = a.shape[1]
    count = tuning().probes         # sign probes before the whole lines are compared
    probes = xp.arange(0, k, max(1, k // count))[:count]
    differ = (xp.signbit(_values_of(a, rows[:, None], probes))
              != xp.signbit(_values_of(b, probes, cols[:, None])))
    candidates = xp.flatnonzero(xp.all(differ, axis=1))
    if size(candidates):
        differ = (xp.signbit(_rows_of(a, rows[candidates]))
                  != xp.signbit(_cols_of(b, cols[candidates])))
        value[candidates[xp.all(differ, axis=1)]] = -0.0
    return value


def gather_source(x32, x64):
    """The operand to gather from: the float32 original where it is C- or F-ordered (half
    the bytes), else its float64 copy (always one of the two)."""
    return x32 if is_contiguous(x32, "C") or is_contiguous(x32, "F") else x64


def _rows_of(a, rows) -> xp.ndarray:
    """(len(rows), K) rows of a, gathered by ``take`` along its contiguous axis (on a
    C-ordered array: ``take`` would first copy any other whole)."""
    return xp.take(a, rows, axis=0) if is_contiguous(a, "C") else xp.take(a.T, rows, axis=1).T


def _cols_of(b, cols) -> xp.ndarray:
    """(len(cols), K) columns of b, gathered as ``_rows_of`` gathers rows: the layouts of the
    two agree wherever the operands' orders allow it."""
    return xp.take(b.T, cols, axis=0) if is_contiguous(b, "F") else xp.take(b, cols, axis=1).T


def _values_of(x, rows, cols) -> xp.ndarray:
    """x[rows, cols] (broadcast index arrays) of a C- or F-ordered x, through its flat
    buffer."""
    if is_contiguous(x, "C"):
        return xp.take(xp.reshape(x, (-1,)), rows * x.shape[1] + cols)
    return xp.take(xp.reshape(x.T, (-1,)), cols * x.shape[0] + rows)
