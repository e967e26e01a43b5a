"""The exact step of the 2-D fast path (``fast_matmul``): exact sums of chosen elements of a @ b.

``exact_elements(a, b, row_norm, col_norm, rows, cols, approx)`` returns, for each element
(rows[e], cols[e]), the exact dot product of row a_i and column b_j rounded once to fp32, with
the IEEE sign of an exact zero (-0 exactly when every product is -0, IEEE 754-2019 6.3):

* an element whose BLAS value is +-0 (every product zero gives exactly that) and whose row of
  a is sparse (at most ``_SUPPORT`` nonzeros: a unit that fired for few samples of a
  batch, in a weight gradient g^T x) is settled from that support alone when b is zero on
  it: then every product is zero (a_ik = +-0 off the support, b_kj = +-0 on it), and the
  sign comes from ``exact_zero_signs`` (any sum known to be zero: -0 exactly when
  signbit(a_ik) != signbit(b_kj) for every k) or, where no element of b has its sign bit
  set (relu activations), from a's row alone: -0 exactly when every a_ik has its sign bit.
  Tried where such elements hold at least ``_SPARSE_FROM`` products: below, gathering them
  costs less than the test;
* the others gather their K products (exact in float64): every product zero gives the
  zero sum (``sums.zero_sum``), else the split certificate (``certificate.split_certify``),
  else the exact sum rounded to odd (``sums.round_to_odd_sum``), cast once to fp32.

Operands are float32 C- or F-ordered arrays, or their float64 copies (``gather_source``).
"""
from __future__ import annotations

from ..backend import xp

from .certificate import error_factor, split_certify
from .certified import cauchy_schwarz_bound
from .sums import ELEMENTS_PER_CHUNK, round_to_odd_sum, zero_sum

__all__ = ["exact_elements", "exact_zero_signs", "gather_source"]

_SUPPORT = 16    # nonzeros of a's row up to which a zero sum is settled from its support
_PROBES = 8      # sign probes before a zero sum's whole lines are compared
_SPARSE_FROM = 1 << 12   # products of zero sums from which the support test pays its cost


def exact_elements(a, b, row_norm, col_norm, rows, cols, approx) -> xp.ndarray:
    """float32 exact sums of elements (rows, cols) of a @ b, rounded once to fp32 (module
    docstring); ``approx``: their float64 BLAS values (only where they are zero matters)."""
    out = xp.empty(rows.size, xp.float32)
    todo = xp.arange(rows.size)
    zero = xp.flatnonzero(approx == 0)
    if zero.size * a.shape[1] >= _SPARSE_FROM:
        settled, value = _zero_sums_of_sparse_rows(a, b, rows[zero], cols[zero])
        if settled.any():
            out[zero[settled]] = value[settled]
            left = xp.ones(rows.size, bool)
            left[zero[settled]] = False
            todo = todo[left]
    g = error_factor(a.shape[1])
    step = max(1, ELEMENTS_PER_CHUNK // a.shape[1])
    for lo in range(0, todo.size, step):
        part = todo[lo:lo + step]
        r, c = rows[part], cols[part]
        products = xp.multiply(_rows_of(a, r), _cols_of(b, c), dtype=xp.float64)
        live = products.any(axis=1)
        if not live.all():          # every product zero (disjoint supports): no sum to take
            out[part[~live]] = zero_sum(products[~live])
            products, r, c, part = products[live], r[live], c[live], part[live]
        upper = cauchy_schwarz_bound(row_norm[r], col_norm[c], g)     # >= sum |a_ik b_kj|
        acc, known = split_certify(products, upper)
        rest = xp.flatnonzero(~known)
        if rest.size:
            acc[rest] = round_to_odd_sum(products[rest])   # round-to-odd, one fp32 cast
        out[part] = acc
    return out


def _zero_sums_of_sparse_rows(a, b, rows, cols):
    """(settled, value): where the row of a has at most _SUPPORT nonzeros and b is zero on
    them (every product zero), the IEEE zero sum (float32 +-0; module docstring)."""
    marked = xp.zeros(a.shape[0], bool)      # the distinct rows, without a sort
    marked[rows] = True
    unique_rows = xp.flatnonzero(marked)
    which = (xp.cumsum(marked) - 1)[rows]      # each element's place in unique_rows
    lines = _rows_of(a, unique_rows)                       # (R, K)
    nonzero = lines != 0
    counts = nonzero.sum(axis=1)
    sparse = counts <= _SUPPORT
    value = xp.zeros(rows.size, xp.float32)
    if not sparse.any():
        return xp.zeros(rows.size, bool), value
    width = max(1, int(counts[sparse].max()))
    # each row's nonzero positions first (a stable sort of "is zero"), padded past its count
    support = xp.argsort(xp.logical_not(nonzero), axis=1, kind="stable")[:, :width]
    on_support = xp.arange(width) < counts[:, None]
    b_there = _values_of(b, support[which], cols[:, None])          # (E, width)
    settled = sparse[which] & ~((b_there != 0) & on_support[which]).any(axis=1)
    if _has_sign_bits(b):
        value[settled] = exact_zero_signs(a, b, rows[settled], cols[settled])
    else:                       # -0 exactly where every a_ik has its sign bit (module docstring)
        value[settled & xp.signbit(lines).all(axis=1)[which]] = -0.0
    return settled, value


def _has_sign_bits(x) -> bool:
    """Whether any element of the float32 or float64 ``x`` has its sign bit set (-0 too)."""
    sign = 1 << (8 * x.itemsize - 1)
    return int(x.view(xp.uint32 if x.itemsize == 4 else xp.uint64).max()) >= sign


def exact_zero_signs(a, b, rows, cols) -> xp.ndarray:
    """float32 +-0 for elements (rows, cols) of a @ b whose exact sum is known to be zero: -0
    exactly when every product is -0, that is (the sum being zero) when signbit(a_ik) !=
    signbit(b_kj) for every k (every product is then <= 0, so each is -0). A few probes
    first, the whole lines only where every probe differs."""
    value = xp.zeros(rows.size, xp.float32)
    k = a.shape[1]
    probes = xp.arange(0, k, max(1, k // _PROBES))[:_PROBES]
    differ = (xp.signbit(_values_of(a, rows[:, None], probes))
              != xp.signbit(_values_of(b, probes, cols[:, None])))
    candidates = xp.flatnonzero(differ.all(axis=1))
    if candidates.size:
        differ = (xp.signbit(_rows_of(a, rows[candidates]))
                  != xp.signbit(_cols_of(b, cols[candidates])))
        value[candidates[differ.all(axis=1)]] = -0.0
    return value


def gather_source(x32, x64):
    """The operand to gather from: the float32 original where it is C- or F-ordered (half
    the bytes), else its float64 copy (always one of the two)."""
    return x32 if x32.flags.c_contiguous or x32.flags.f_contiguous else x64


def _rows_of(a, rows) -> xp.ndarray:
    """(len(rows), K) rows of a, gathered by ``take`` along its contiguous axis (on a
    C-ordered array: ``take`` would first copy any other whole)."""
    return xp.take(a, rows, axis=0) if a.flags.c_contiguous else xp.take(a.T, rows, axis=1).T


def _cols_of(b, cols) -> xp.ndarray:
    """(len(cols), K) columns of b, gathered as ``_rows_of`` gathers rows: the layouts of the
    two agree wherever the operands' orders allow it."""
    return xp.take(b.T, cols, axis=0) if b.flags.f_contiguous else xp.take(b, cols, axis=1).T


def _values_of(x, rows, cols) -> xp.ndarray:
    """x[rows, cols] (broadcast index arrays) of a C- or F-ordered x, through its flat
    buffer."""
    if x.flags.c_contiguous:
        return xp.take(x.reshape(-1), rows * x.shape[1] + cols)
    return xp.take(x.T.reshape(-1), cols * x.shape[0] + rows)
