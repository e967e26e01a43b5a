"""The ``exact`` model's 2-D fast path: one float64 BLAS product, certified straight to the output.

``matmul_2d(a, b, out_fmt, bias)`` returns the same bits as the general path
(``certified.exact_matmul`` with ``acc = fp32``, then ``+ bias`` in float32, then one rounding
to ``out_fmt``), for a 2-D float32 ``a`` (M, K) and ``b`` (K, N) with finite values. Writing
``rnd32`` for fp32 nearest-even rounding, ``pre(x) = fl32(x + bias_j)`` (or ``x`` without a bias)
and ``f = rnd_out o pre``, the result is ``f(rnd32(s))`` with ``s`` the exact dot product::

    approx = fl64(a @ b)                                  # any BLAS, order, threads
    w      = ||a_i|| ||b_j|| * (g + 2**-50) (1 + 2g) (1 + 2**-39),  g = K * 2**-52
    lo32, hi32 = fl32(fl64(approx - w)), fl32(fl64(approx + w))
    certified where  bits(lo32) == bits(hi32)   (acc = hi32), except all-zero rows/columns
    the rest:       certified where f(lo32) == f(hi32) and pre(lo32), pre(hi32) are nonzero
                    of one sign                                          (acc = hi32)
                    else exact: the split certificate on the gathered products (exact
                    when every low part is zero), else round to odd (integer limbs,
                    ``round_to_odd_sum``: no host round trip)
    out = rnd_out(pre(acc))

Proof. (1) Enclosure: ``certificate`` (the interval certificate, N = ||a_i|| ||b_j||, as on the
general path): fl64(approx - w) <= s <= fl64(approx + w). (2) Monotonicity. rnd32, x -> fl32(x
+ b) and rnd_out are monotonic (non-decreasing), so f(rnd32(low end)) <= f(rnd32(s)) <=
f(rnd32(high end)): equal bit patterns at both ends give the bits at s. With equal bits at the
fp32 level, rnd32(s) is that value (as in the general path); at the f level only f(rnd32(s)) is
known, so the element keeps acc = hi32, whose f is the same and which is nonzero exactly when
rnd32(s) is (both ends nonzero of one sign after ``pre``): the underflow counter
(``underflow.note``) sees the same zero / nonzero pattern as on the general path. (3) Signed
zeros. An all-zero row of a or column of b has w = 0 and a BLAS zero of either sign: never
certified at the fp32 level; at the f level pre is then +-0 + bias, nonzero only for a nonzero
bias, where the zero's sign does not matter (+-0 + b = b). Any other exact zero sum has approx
= +-0 and w > 0, so lo32 and hi32 differ in sign: not certified at the fp32 level, and at the f
level only when a nonzero bias makes both pre values that same nonzero number. (4) The exact
step, on the gathered products of the elements left: the split certificate
(``certificate.split_certify``: one error-free split makes the float64 sum almost exact, so
it takes all but exact ties and exact sums; where every low part is zero its exact high sum
is s, an exact zero signed by the IEEE rule: -0 exactly when every product is -0), else the
exact sum rounded to odd (``round_to_odd_sum``) and
cast once to fp32. Non-finite inputs (seen as non-finite norms), K = 0 and empty shapes are
left to the general path (``matmul_2d`` returns None). Work arrays are reused per thread
(``_scratch``); results are always fresh arrays.
"""
from __future__ import annotations

import math

from ..backend import xp

from ..formats import FP16, FP32
from ..backend import round_to, scratch
from . import underflow
from .certificate import certify, error_factor, split_certify, width_factor
from .certified import cauchy_schwarz_bound
from .sums import ELEMENTS_PER_CHUNK, round_to_odd_sum

__all__ = ["matmul_2d", "round_out"]

_SMALL = 1 << 14        # below this, NumPy's float16 cast is cheaper than round_to's setup


def _finite(x: xp.ndarray) -> bool:
    # max and min propagate NaN, and an infinity is one of them: both finite <=> all finite
    return bool(xp.isfinite(x.max()) and xp.isfinite(x.min()))


def round_out(x32: xp.ndarray, fmt) -> xp.ndarray:
    """float32 values rounded once to ``fmt`` (nearest even), as ``round_to`` gives them, for
    any input without a signalling NaN (IEEE arithmetic and float64 -> float32 casts only make
    quiet ones; ``round_to`` would quiet a signalling one). FP32 is then the identity (same
    format, subnormals kept, payloads fit); NumPy's float32 -> float16 cast is IEEE
    nearest-even with subnormals, overflow to inf and the quiet NaN payloads ``round_to``
    keeps (``tests/test_fastpaths.py`` checks every quiet NaN pattern once)."""
    if fmt == FP32:
        return x32
    with xp.errstate(over="ignore", invalid="ignore"):
        if fmt == FP16 and x32.size < _SMALL:
            return x32.astype(xp.float16).astype(xp.float32)
        return round_to(x32, fmt)


def matmul_2d(a: xp.ndarray, b: xp.ndarray, out_fmt, bias: xp.ndarray | None = None,
              *, note: bool = True) -> xp.ndarray | None:
    """exact(fp32) ``a @ b`` (+ ``bias`` in the fp32 accumulator) rounded to ``out_fmt``, as
    float32; None where the fast path does not apply. ``note``: report (accumulator + bias,
    output) to the underflow counter, as ``accumulation._to_output`` does."""
    m, k = a.shape
    n = b.shape[1]
    if k == 0 or m == 0 or n == 0 or (bias is not None and not _finite(bias)):
        return None
    a64, b64 = _widen(a, "a"), _widen(b, "b")
    row_norm = xp.sqrt(xp.einsum("ik,ik->i", a64, a64))
    col_norm = xp.sqrt(xp.einsum("kj,kj->j", b64, b64))
    # Squares of float32 values cannot overflow a float64 sum (K 2**256 < 2**1024), so the
    # norms are finite exactly when a and b are: one check, no extra pass over the operands.
    if not (xp.isfinite(row_norm.sum()) and xp.isfinite(col_norm.sum())):
        return None
    approx = xp.matmul(a64, b64, out=_scratch("approx", (m, n), xp.float64))
    g = error_factor(k)
    # pre is the output itself for fp32; otherwise only a work array (out is rounded from it)
    pre_buffer = None if out_fmt == FP32 else _scratch("pre", (m, n), xp.float32)
    low32, high32, certified = certify(approx, (row_norm * width_factor(k))[:, None], col_norm,
                                       high=pre_buffer)
    if not (row_norm.all() and col_norm.all()):
        certified[row_norm == 0, :] = False
        certified[:, col_norm == 0] = False
    pre = high32                                # acc = hi32 wherever certified
    with xp.errstate(over="ignore"):
        if bias is not None:
            pre += bias                         # the fp32 epilogue: one float32 addition
        out = round_out(pre, out_fmt)
    if not certified.all():
        rows, cols = _f_uncertified(certified, low32, pre, out, bias, out_fmt)
        if rows.size:
            acc = _exact_elements(a64, b64, row_norm, col_norm, rows, cols, g)
            with xp.errstate(over="ignore"):
                if bias is not None:
                    acc += bias[cols]
                pre[rows, cols] = acc
                out[rows, cols] = round_out(acc, out_fmt)
    if note:
        underflow.note(pre, out)
    return out


def _scratch(name: str, shape: tuple, dtype) -> xp.ndarray:
    """A reused per-thread work array: ``round_to``'s per-thread buffers (fresh large arrays
    cost page faults on every call), under names of their own."""
    return scratch(name, dtype, math.prod(shape)).reshape(shape)


def _widen(x: xp.ndarray, name: str) -> xp.ndarray:
    """x in float64 (exact), in a reused buffer with x's memory order (BLAS reads either)."""
    if x.flags.f_contiguous and not x.flags.c_contiguous:
        out = _scratch(name, x.shape[::-1], xp.float64).T
    else:
        out = _scratch(name, x.shape, xp.float64)
    xp.copyto(out, x)
    return out


def _f_uncertified(certified, low32, pre_high, out_high, bias, out_fmt):
    """(rows, cols) of the elements neither certificate takes. The second one holds where
    f = rnd_out(pre(.)) gives one bit pattern at both ends and pre is nonzero of one sign at
    both (so pre(acc) keeps the zero/nonzero pattern of the exact path); it only helps when
    f is coarser than rnd32 (an output format or a bias). Few candidates: gathered; many
    (fp16 data makes exact fp32 ties common): checked over the whole matrix."""
    uncertified = xp.logical_not(certified, out=_scratch("uncertified", certified.shape, bool))
    if bias is None and out_fmt == FP32:
        return _where_2d(uncertified)
    if 8 * xp.count_nonzero(uncertified) < certified.size:
        rows, cols = _where_2d(uncertified)
        ok = _f_agree(low32[rows, cols], pre_high[rows, cols], out_high[rows, cols],
                      None if bias is None else bias[cols], out_fmt)
        return rows[~ok], cols[~ok]
    ok = _f_agree(low32, pre_high, out_high, bias, out_fmt, _scratch)
    xp.logical_and(uncertified, xp.logical_not(ok, out=ok), out=uncertified)
    return _where_2d(uncertified)


def _where_2d(mask: xp.ndarray):
    """``np.nonzero`` of a 2-D mask, through the flat indices (several times faster)."""
    return xp.divmod(xp.flatnonzero(mask), mask.shape[1])


def _f_agree(low32, pre_high, out_high, bias, out_fmt, scratch=None) -> xp.ndarray:
    """Where f gives one bit pattern at both ends and pre is nonzero of one sign at both.
    ``scratch``: ``_scratch``, to work in reused buffers (whole matrices: fresh ones cost
    page faults), the result then valid until the next call."""
    def buffer(name, dtype):
        return xp.empty(low32.shape, dtype) if scratch is None else scratch(name, low32.shape,
                                                                            dtype)
    with xp.errstate(over="ignore", invalid="ignore"):
        pre_low = low32 if bias is None else xp.add(low32, bias, out=buffer("f.pre", xp.float32))
        same = xp.not_equal(pre_low, 0, out=buffer("f.same", bool))
        test = xp.not_equal(pre_high, 0, out=buffer("f.test", bool))
        same &= test
        sign = xp.signbit(pre_low, out=buffer("f.sign", bool))
        same &= xp.equal(sign, xp.signbit(pre_high, out=test), out=test)
        out_low = round_out(pre_low, out_fmt)
        same &= xp.equal(out_low.view(xp.uint32), out_high.view(xp.uint32), out=test)
    return same


def _exact_elements(a64, b64, row_norm, col_norm, rows, cols, g) -> xp.ndarray:
    """The exact sums of elements (rows, cols) rounded once to fp32 (float32), with the
    IEEE sign of exact zeros: the split certificate on their gathered products, then the
    exact sum (rounded to odd, cast once) for the exact ties it leaves."""
    out = xp.empty(rows.size, xp.float32)
    step = max(1, ELEMENTS_PER_CHUNK // a64.shape[1])
    for lo in range(0, rows.size, step):
        r, c = rows[lo:lo + step], cols[lo:lo + step]
        products = _products(a64, b64, r, c)
        upper = cauchy_schwarz_bound(row_norm[r], col_norm[c], g)     # >= sum |a_ik b_kj|
        acc, known = split_certify(products, upper)
        rest = xp.flatnonzero(~known)
        if rest.size:
            exact = round_to_odd_sum(products[rest])
            with xp.errstate(over="ignore"):
                acc[rest] = exact                      # round-to-odd, then one fp32 cast
        out[lo:lo + step] = acc
    return out


def _products(a64, b64, rows, cols) -> xp.ndarray:
    """(len(rows), K) products a64[rows[e], k] * b64[k, cols[e]], exact in float64. Gathered
    by np.take along b's memory order, so that both factors share one layout (a mixed-layout
    product, or fancy indexing of a C-ordered b's columns, is several times slower)."""
    if b64.flags.c_contiguous:      # b's columns are strided: build the products k-major
        return (xp.take(a64.T, rows, axis=1) * xp.take(b64, cols, axis=1)).T
    return xp.take(a64, rows, axis=0) * xp.take(b64.T, cols, axis=0)
