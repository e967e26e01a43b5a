"""Correctly rounded softmax, log-softmax and cross-entropy over rows, libm-free.

Per row x (float32 values, read exactly as float64), with m = max x and j* its first index:

- s_i = x_i - m in float64 with its exact error err_i (TwoSum, + and - only): s_i + err_i is
  x_i - m exactly, |err_i| <= 2**-53 |s_i| (nonzero only when x_i is far below m).
- e_i = exp(s_i) within EXP_BOUND + 1.01 |err_i| (``elementary.exp``; e_j* = 1 exactly).
- t = sum over i != j* of e_i, within max eps_e + 3 * 2**-53 (an exact split sum, see
  ``_sum_rows``; beyond 4096 classes NumPy's sum, + 1.01 (n - 1) 2**-53); S = 1 + t rounds
  once more.
- softmax y_i = e_i / S: within eps_e(i) + eps_t + 2 * 2**-53.
- log-softmax y_i = (s_i - L) + err_i with L = log1p(t) (no cancellation for the dominant
  class: y_j* = -L; the others add two quantities of one sign): within LOG1P_BOUND + eps_t
  + 3 * 2**-53.
- cross-entropy: loss_r = -y_{r, label_r} >= 0 per row; "sum" adds N nonnegative float64
  values (+ 1.01 (N - 1) 2**-53), "mean" divides by N (+ 2**-53).

Terms with x_i - m < -400 enter as e**-400 (``elementary``'s clamp): they change t by less
than 2**-570 and only matter in rows where every result rounds to zero or to s_i anyway.
Each result is certified against its bound (``correctly_rounded.certified``); uncertified
elements (rows, for a reduced cross-entropy) are settled (``correctly_rounded.settle``) from
exact enclosures (``softmax_ref``). Non-finite rows give NaN (or -inf for log-softmax of -inf
entries) with no fallback.
"""
from __future__ import annotations

from ..backend import astype, copy, fused, size, to_list, xp

from . import elementary
from . import softmax_ref as ref
from .correctly_rounded import certified, settle

__all__ = ["row_terms", "settle_rows", "softmax64", "log_softmax64", "cr_softmax", "cr_log_softmax",
           "cr_cross_entropy"]

_U = 2.0 ** -53


def row_terms(x):
    """(s, err, e, t, eps_e, eps_t, top) for float64 rows x of shape (R, n) (module doc);
    ``top`` (R, 1) is e at the first maximum: 1 in finite rows, NaN where the row's max is
    inf or NaN (it then carries that NaN into every result, as e / e.sum() did). Where the
    backend offers the fused ``softmax_row_terms`` and it takes x, that computes them."""
    # C order: NumPy's sum adds a row of a C-ordered array pairwise, of an F-ordered one
    # term by term, and ``_sum_rows``' lo sum can round differently in the two orders (the
    # fused kernel follows the pairwise one; tests/test_fused_softmax.py has such rows)
    x = xp.ascontiguousarray(xp.asarray(x, xp.float64))
    kernel = fused("softmax_row_terms")
    if kernel is not None:
        terms = kernel(x)
        if terms is not None:
            return terms
    m = xp.max(x, axis=1, keepdims=True)
    s = x - m
    bp = s - x
    err = (x - (s - bp)) + (-m - bp)
    err = xp.where(xp.isfinite(s), err, 0.0)
    e = elementary.exp(s)
    first = (xp.arange(x.shape[0]), xp.argmax(x, axis=1))
    top = e[first][:, None]
    rest = copy(e)
    rest[first] = 0.0
    t, exact_sum = _sum_rows(rest)
    eps_e = elementary.EXP_BOUND + 1.01 * xp.abs(err)
    eps_t = xp.max(eps_e, axis=1, keepdims=True) + (3 * _U if exact_sum
                                                     else 1.01 * x.shape[1] * _U)
    return s, err, e, t, eps_e, eps_t, top


def _sum_rows(rest):
    """(row sums (R, 1), whether they are within 2u). Up to 4096 terms: each e_j splits
    exactly into hi_j, a multiple of 2**(E - 40) (2**E > the row's largest term), and lo_j;
    the hi_j add exactly (53 bits), the lo_j (< 2**(E - 40) each) with an error below
    n*n 2**(E - 92), so hi + lo is within u + 2**-70 of the sum. Beyond 4096 terms, NumPy's
    sum, within 1.01 (n - 1) u."""
    if rest.shape[1] > 4096 or xp.count_nonzero(xp.isfinite(rest)) < size(rest):
        return xp.sum(rest, axis=1, keepdims=True), False
    _, ex = xp.frexp(xp.max(rest, axis=1, keepdims=True))
    big = 1.5 * elementary.pow2(astype(ex + 12, xp.float64))
    hi = (rest + big) - big
    lo = rest - hi
    return xp.sum(hi, axis=1, keepdims=True) + xp.sum(lo, axis=1, keepdims=True), True


def softmax64(x):
    """Float64 softmax of rows (R, n), within the module doc's bound."""
    _, _, e, t, _, _, top = row_terms(x)
    return e / (top + t)


def log_softmax64(x):
    """Float64 log-softmax of rows (R, n), within the module doc's bound."""
    s, err, _, t, _, _, top = row_terms(x)
    return (s - _log_sum(t, top)) + err


def _log_sum(t, top):
    """log(top + t) as log1p(t) (top is 1), NaN where top is."""
    return elementary.log1p(t) + (top - 1.0)


def _rows_of(x, axis):
    moved = xp.moveaxis(xp.asarray(x, xp.float64), axis, -1)
    return xp.reshape(moved, (-1, moved.shape[-1])), moved.shape


def _back(rows, shape, axis):
    return xp.moveaxis(xp.reshape(rows, shape), -1, axis)


def settle_rows(x_rows, v, ok, fmt, kind):
    """``v`` (R, n) with each element not ``ok`` replaced by ``settle``'s proxy for the
    ``kind`` ("softmax" or "log_softmax") of its row of ``x_rows``."""
    if xp.count_nonzero(ok) == size(ok):
        return v
    dvalue = {"softmax": ref.softmax_enclosure, "log_softmax": ref.log_softmax_enclosure}[kind]
    v = copy(v)
    rows = {}                                   # one ``Row`` per row: its sums once
    # the few undecided elements' indices, as host ints (one transfer)
    for r, i in zip(*(to_list(w) for w in xp.nonzero(~ok))):
        if r not in rows:
            rows[r] = ref.Row(x_rows[r])
        v[r, i] = settle(dvalue(rows[r], i), fmt)
    return v


def cr_softmax(x, axis, fmt):
    """Softmax along ``axis`` correctly rounded to ``fmt``, as a float64 proxy array."""
    rows, shape = _rows_of(x, axis)
    with xp.errstate(invalid="ignore", over="ignore", under="ignore"):
        v, bound, t = _softmax_proxy(rows)
        ok = certified(v, bound, fmt)
        if t is not None:
            ok = ok | ~xp.isfinite(t)
    return _back(settle_rows(rows, v, ok, fmt, "softmax"), shape, axis)


def _softmax_proxy(rows):
    """(v, its bound, t) of softmax (module doc): the backend's fused ``softmax_proxy`` where
    offered and it takes ``rows`` (t is None: it is finite in every row it takes), else
    from ``row_terms``."""
    kernel = fused("softmax_proxy")
    proxy = None if kernel is None else kernel(rows)
    if proxy is not None:
        return proxy[0], proxy[1], None
    _, _, e, t, eps_e, eps_t, top = row_terms(rows)
    return e / (top + t), eps_e + eps_t + 2 * _U, t


def cr_log_softmax(x, axis, fmt):
    """Log-softmax along ``axis`` correctly rounded to ``fmt``, as a float64 proxy array."""
    rows, shape = _rows_of(x, axis)
    with xp.errstate(invalid="ignore", over="ignore", under="ignore"):
        s, err, _, t, _, eps_t, top = row_terms(rows)
        v = (s - _log_sum(t, top)) + err
        bound = elementary.LOG1P_BOUND + eps_t + 3 * _U
        ok = certified(v, xp.broadcast_to(bound, v.shape), fmt) | ~xp.isfinite(v)
    return _back(settle_rows(rows, v, ok, fmt, "log_softmax"), shape, axis)


def cr_cross_entropy(logits, labels, reduction, fmt, *, with_log_softmax: bool = False):
    """Cross-entropy of (N, C) ``logits`` against integer ``labels`` (``reduction`` "mean",
    "sum" or "none"), correctly rounded to ``fmt``: a float64 proxy (shape () or (N,)).
    ``with_log_softmax``: return (proxy, ``log_softmax64(logits)``), the float64 log-softmax
    the loss is read from (for the backward pass, without a second evaluation)."""
    logits = xp.asarray(logits, xp.float64)
    n = logits.shape[0]
    rows = xp.arange(n)
    with xp.errstate(invalid="ignore", over="ignore", under="ignore"):
        s, err, _, t, _, eps_t, top = row_terms(logits)
        logp = (s - _log_sum(t, top)) + err             # log_softmax64's operations
        loss = -logp[rows, labels]
        eps = elementary.LOG1P_BOUND + eps_t[:, 0] + 3 * _U
        if reduction == "none":
            ok = certified(loss, eps, fmt) | ~xp.isfinite(loss)
            value = (loss if xp.count_nonzero(ok) == ok.shape[0]
                     else _settle_each(logits, labels, loss, ok, fmt))
            return (value, logp) if with_log_softmax else value
        total = xp.sum(loss)
        bound = (xp.max(eps) if n else 0.0) + 1.01 * max(n - 1, 0) * _U
        if reduction == "mean":
            total, bound = xp.divide(total, n), bound + _U
        total = xp.asarray(total)
        if not (certified(total, bound, fmt) | ~xp.isfinite(total)):
            dvalue = ref.cross_entropy_enclosure([ref.Row(r) for r in logits],
                                                 [int(v) for v in to_list(labels)], reduction)
            total = xp.asarray(settle(dvalue, fmt))
    return (total, logp) if with_log_softmax else total


def _settle_each(logits, labels, loss, ok, fmt):
    loss = copy(loss)
    for r in to_list(xp.flatnonzero(~ok)):            # few: one transfer to the host
        loss[r] = settle(ref.cross_entropy_enclosure([ref.Row(logits[r])],
                                                     [int(labels[r])], "sum"), fmt)
    return loss
