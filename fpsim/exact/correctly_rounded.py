"""Correctly rounded transcendentals: certify the float64 evaluation, fall back to Decimal.

Each function takes float32/float64 values and an output ``Format`` and returns a float64
*proxy* array: a value that ``round_to(., fmt)`` (round to nearest, ties to even) sends to the
correctly rounded exact result, so callers keep their single ``round_array`` call (and the
underflow counting on it). Rounding straight into ``fmt`` from float64, never through float32.

Certificate: with v from ``fpsim.exact.elementary`` and its relative bound b, the exact value
lies in [v - e, v + e], e = |v| (b + 2**-52) (the extra 2**-52 |v| covers the two roundings
of v -+ e; b = 0 marks a proxy that rounds like the exact value, and e = 0). Rounding is
monotonic, so when both ends round to the same value the exact one does too, and v is
returned. The rest (measured: 0 to 2 of 10**7 random inputs per function for fp32 output,
fewer for narrower formats) goes to ``settle``: a Ziv loop on ``fpsim.exact.decimal_ref``
at 30, 60, 120, ... digits, until the Decimal enclosure decides the rounding (see ``settle``).
"""
from __future__ import annotations

from decimal import Decimal, localcontext

from ..backend import xp

from ..formats import FP32
from ..backend import round_to
from . import decimal_ref as ref
from .certificate import certify
from . import elementary as el

__all__ = ["certified", "settle", "cr_exp", "cr_log", "cr_tanh", "cr_sigmoid", "cr_gelu",
           "FALLBACK_COUNT"]

FALLBACK_COUNT = {"elements": 0}   # how many elements ``settle`` decided (tests read it)
_DIGITS = (30, 60, 120, 240, 480)


def certified(v, bound, fmt):
    """Mask of elements of float64 ``v`` (relative error <= ``bound``, a scalar or array)
    whose rounding to ``fmt`` is decided. NaN and +-inf count as decided: the evaluations give
    them only where they are the exact result (inf input, log 0) or NaN."""
    bound = xp.asarray(bound, xp.float64)
    # the 2**-52 covers the roundings of v -+ e; a zero bound (a proxy known to round like
    # the exact value) needs none: v -+ 0 is exact
    with xp.errstate(invalid="ignore", over="ignore"):      # inf * 0: v = inf is decided
        e = xp.abs(v) * xp.where(bound > 0, bound + 2.0 ** -52, 0.0)
    # the one interval certificate (``certificate.certify``); for FP32 its default end
    # rounding is NumPy's IEEE cast, round_to(., FP32) bit for bit and 10x faster
    round_end = None if fmt == FP32 else (lambda y: round_to(y, fmt))
    lo, hi, same = certify(xp.atleast_1d(v), xp.atleast_1d(e), round_end=round_end)
    # both NaN: both ends overflow a format without inf; v = -0 has e = 0 but -0 + 0 = +0,
    # so a zero (exact: a zero input, or far below every format) is decided as it stands
    v1 = xp.atleast_1d(v)
    decided = same | (xp.isnan(lo) & xp.isnan(hi)) | ~xp.isfinite(v1) | (v1 == 0)
    return decided.reshape(xp.shape(v))


def _rounds(y: float, fmt) -> float:
    return float(round_to(xp.float64(y), fmt))


def settle(value, fmt):
    """A float64 proxy for the exact value enclosed by ``value(digits) -> (r, eta)``.

    y = float(r) is r's nearest float64. Every midpoint between neighbours of ``fmt`` is a
    float64, so none lies strictly between y and the exact value once eta |r| is below half
    of y's float64 spacing; then y works unless y is itself a midpoint (its two float64
    neighbours round apart). In that case the exact value is on one side of y, decided once
    |r - y| > eta |r|, and y's float64 neighbour on that side is returned. Otherwise the
    precision is raised."""
    FALLBACK_COUNT["elements"] += 1
    for digits in _DIGITS:
        r, eta = value(digits)
        y = float(r)
        if not xp.isfinite(y):
            return y
        with localcontext() as ctx:
            ctx.prec = 2 * digits + 40          # exact enough for the comparisons below
            err = abs(r) * eta
            gap = r - Decimal(y)
        if err * 4 >= Decimal(float(xp.spacing(abs(y)))):
            continue
        below, above = xp.nextafter(y, -xp.inf), xp.nextafter(y, xp.inf)
        if _rounds(below, fmt) == _rounds(above, fmt):
            return y
        if abs(gap) > err:
            return float(above if gap > 0 else below)
    raise ArithmeticError("settle: no decision at 480 digits")


_CHUNK = 1 << 16   # elements per evaluation chunk: its float64 temporaries stay in cache


def _finish(x, evaluate, bound, fmt, dref):
    """Evaluate chunk by chunk, certify, settle the rest; ``bound`` scalar or per-element."""
    x = xp.asarray(x, xp.float64)
    flat_x = x.reshape(-1)
    v = xp.empty(flat_x.shape, xp.float64)
    bounds = xp.broadcast_to(xp.asarray(bound, xp.float64), x.shape).reshape(-1)
    for i in range(0, flat_x.size, _CHUNK):
        part = slice(i, i + _CHUNK)
        v[part] = evaluate(flat_x[part])
        ok = certified(v[part], bounds[part], fmt)
        for j in xp.flatnonzero(~ok) + i:
            xj = float(flat_x[j])
            v[j] = settle(lambda d, xj=xj: dref(xj, d), fmt)
    return v.reshape(x.shape)


def cr_exp(x, fmt):
    """exp(x) correctly rounded to ``fmt``, as a float64 proxy (see module doc)."""
    x = xp.asarray(x, xp.float64)
    return _finish(x, el.exp, el.EXP_BOUND, fmt, ref.dexp)


def cr_log(x, fmt):
    x = xp.asarray(x, xp.float64)
    return _finish(x, el.log, el.LOG_BOUND, fmt, ref.dln)


def cr_tanh(x, fmt):
    x = xp.asarray(x, xp.float64)
    return _finish(x, el.tanh, el.TANH_BOUND, fmt, ref.dtanh)


def cr_sigmoid(x, fmt):
    x = xp.asarray(x, xp.float64)
    return _finish(x, el.sigmoid, el.SIGMOID_BOUND, fmt, ref.dsigmoid)


def cr_gelu(x, fmt):
    x = xp.asarray(x, xp.float64)
    # x >= 10, x <= -20 and tiny |x| give proxies that round like the exact value
    # (``elementary``'s doc)
    a = xp.abs(x)
    bound = xp.where((x >= 10.0) | (x <= -20.0) | ((a < 2.0 ** -60) & (a > 0)), 0.0,
                     el.GELU_BOUND)
    return _finish(x, el.gelu, bound, fmt, ref.dgelu)
