"""The certified product with its reduction in parts: a @ b where a (M, K) and b (K, N) arrive
as slices along K, never whole (a convolution's weight gradient, batch by batch).

``matmul_in_parts(parts, (m, n), out_fmt, rows_of, cols_of)`` returns the bits of
``fast_matmul.matmul_2d(a, b, out_fmt)`` without holding a, b or their float64 copies: only
one part's at a time, and the (M, N) float64 product. Proof: ``fast_matmul``'s module
docstring, whose steps read a and b only through

* approx = fl64(a @ b), in any order, blocking or threads: here the sum over the parts of
  each part's float64 BLAS product, one more blocking of the same K products;
* the 2-norms of a's rows and b's columns, float64 sums of squares in any order: here each
  part's sums of squares, summed over the parts, then one square root;
* the exact step on the elements the certificates leave open, which gathers their rows of a
  and columns of b: here ``rows_of(rows)`` (float32 (len(rows), K)) and ``cols_of(cols)``
  (float32 (K, len(cols))) rebuild just those (few) lines.

No exact rows are tried (they need the lines' quanta: the same bits without them, (5)).
Where a part holds a non-finite value, the result is None and the caller takes the general
path, as where ``matmul_2d`` returns None.
"""
from __future__ import annotations

from ..backend import round_to, size, xp
from ..formats import FP32
from . import observers
from .certificate import certify_fp32_open
from .fast_matmul import certificate_widths, settle_open
from .open_elements import exact_elements
from .product_count import note_fast

__all__ = ["matmul_in_parts"]


def matmul_in_parts(parts, shape, out_fmt, rows_of, cols_of, exact_budget: int, *,
                    note: bool = True):
    """ExactAccumulation(fp32) a @ b rounded to ``out_fmt`` (float32 (m, n)), a and b given
    by ``parts``: an iterable of (a_part (m, K_t), b_part (K_t, n)) float32 arrays, the slices
    of K in any order; ``rows_of``/``cols_of`` rebuild lines for the exact step (module doc),
    for as many open elements at a time (in column order, at least one) as gather at most
    ``exact_budget`` values of each operand. None where
    a value is not finite or K is 0. ``note``: report the rounding to the underflow
    observers, as ``matmul_2d`` does."""
    m, n = shape
    approx = xp.zeros((m, n), xp.float64)
    row_squares, col_squares = xp.zeros(m, xp.float64), xp.zeros(n, xp.float64)
    k = 0
    with xp.errstate(over="ignore", invalid="ignore"):      # inf * 0 in a non-finite part
        for a_part, b_part in parts:
            a64 = xp.asarray(a_part, xp.float64)
            b64 = xp.asarray(b_part, xp.float64)
            row_squares += xp.einsum("pq,pq->p", a64, a64)
            col_squares += xp.einsum("pq,pq->q", b64, b64)
            approx += xp.matmul(a64, b64)
            k += a64.shape[1]
            del a64, b64                     # one part's float64 copies at a time
    # squares of float32 values cannot overflow a float64 sum: finite exactly when a and b are
    if k == 0 or not xp.isfinite(xp.sum(row_squares) + xp.sum(col_squares)):
        return None
    row_norm, col_norm = xp.sqrt(row_squares), xp.sqrt(col_squares)
    fp32_out = out_fmt == FP32
    pre = xp.empty((m, n), xp.float32)
    with xp.errstate(over="ignore", invalid="ignore"):
        row_width, col_width = certificate_widths(row_norm, col_norm, k)
        opened, low32, _ = certify_fp32_open(approx, row_width, col_width, pre)
        out = pre if fp32_out else round_to(pre, out_fmt)

        def exact_at(rows, cols, where):
            # exact_budget // k elements at a time (their lines: at most twice that many
            # values), in column order: neighbours share the columns they rebuild
            acc = xp.empty(size(where), xp.float32)
            order = xp.argsort(cols)
            step, flat = max(1, exact_budget // k), xp.reshape(approx, (-1,))
            for lo in range(0, size(where), step):
                chosen = order[lo:lo + step]
                lines, row_of = _distinct(rows[chosen], m)
                columns, col_of = _distinct(cols[chosen], n)
                acc[chosen] = exact_elements(rows_of(lines), cols_of(columns), row_norm[lines],
                                             col_norm[columns], row_of, col_of,
                                             flat[where[chosen]])
            return acc

        exact = settle_open(opened, low32, pre, out, None, out_fmt, exact_at) \
            if opened.shape[0] else 0
    if note:
        observers.rounded(pre, out)
    note_fast(1, size(out), opened.shape[0], exact)
    return out


def _distinct(index, count: int):
    """(the distinct values of ``index`` in [0, count), ascending; each element's place among
    them), without a sort."""
    marked = xp.zeros(count, bool)
    marked[index] = True
    return xp.flatnonzero(marked), (xp.cumsum(marked) - 1)[index]
