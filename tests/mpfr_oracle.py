"""MPFR (through gmpy2) as an independent oracle for rounding one value to an fpsim format.

MPFR rounds correctly by construction in every IEEE direction, at any precision, with
emulated subnormals. We ask it for the rounding of one value to ``fmt.precision`` bits with the
format's subnormal range and an exponent range wide enough that the rounding itself never
overflows; fpsim's documented rules (``fpsim.rounding`` and ``round_to``'s docstring) then
decide what an out-of-range result becomes:

- overflow (|r| > max_finite, infinite inputs included): ``saturate`` -> the largest finite
  value of the same sign; else round-to-nearest (and stochastic) -> inf, and the directed modes
  -> inf only when rounding toward that infinity (or when the input is infinite), the largest
  finite value otherwise; formats without inf give NaN wherever IEEE would give inf;
- ``subnormals=False``: a result below min_normal in magnitude becomes zero of the same sign
  (after rounding); ``daz``: an input below min_normal in magnitude reads as zero of its sign;
- ``fnuz`` formats have no negative zero: -0 becomes +0; NaN stays NaN.

MPFR exponent conventions: MPFR writes x = m * 2**E with m in [0.5, 1), one more than the IEEE
exponent of x. The format's smallest subnormal 2**(emin - man_bits) is 0.5 * 2**E with
E = emin - man_bits + 1, which is MPFR's ``emin``; with ``subnormalize=True`` and precision
p = man_bits + 1, MPFR then gives values below 2**emin (MPFR exponent < emin_mpfr + p - 1)
the reduced precision of IEEE subnormals. The largest binade [2**emax, 2**(emax + 1)) has MPFR
exponent emax + 1, the ``emax`` that gives IEEE overflow (``native_ieee_round`` uses it to
check the rules above against MPFR's own overflow handling).

MPFR's ``RoundAwayZero`` is a directed rounding (away from zero), not round-to-nearest with
ties away; ``nearest_away`` is built here from the two exact neighbours instead.
"""
from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

import gmpy2
import numpy as np

from fpsim.formats import Format, get
from fpsim.rounding import round_to

__all__ = ["mpfr_round", "mpfr_round_rational", "stochastic_outcomes", "native_ieee_round",
           "DETERMINISTIC_MODES", "mpfr_rounded", "FUNCTIONS", "function_values", "row_terms",
           "softmax_values", "log_softmax_values"]

DETERMINISTIC_MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down")
_MPFR_DIRECTIONS = {"nearest_even": gmpy2.RoundToNearest, "toward_zero": gmpy2.RoundToZero,
                    "up": gmpy2.RoundUp, "down": gmpy2.RoundDown,
                    "away_from_zero": gmpy2.RoundAwayZero}
_WIDE_EMAX = 1 << 12  # beyond any float64 (2**1024): the MPFR rounding itself never overflows


@lru_cache(maxsize=None)
def _context(precision: int, mpfr_emin: int, mpfr_emax: int, direction: str):
    return gmpy2.context(precision=precision, emin=mpfr_emin, emax=mpfr_emax,
                         subnormalize=True, round=_MPFR_DIRECTIONS[direction])


def _mpfr_rounding(value: float, fmt: Format, direction: str, mpfr_emax: int = _WIDE_EMAX):
    """MPFR's rounding of ``value`` to fmt's precision and subnormal grid (an mpfr)."""
    ctx = _context(fmt.precision, fmt.emin - fmt.man_bits + 1, mpfr_emax, direction)
    with ctx:
        return gmpy2.mpfr(value)


def _exact(value) -> Fraction:
    return Fraction(*value.as_integer_ratio())


def _unbounded_rounding(value: float, fmt: Format, mode: str):
    """Round to fmt's significand grid (subnormals included) with no upper exponent limit."""
    if mode != "nearest_away":
        return _mpfr_rounding(value, fmt, mode)
    toward = _mpfr_rounding(value, fmt, "toward_zero")
    away = _mpfr_rounding(value, fmt, "away_from_zero")
    if toward == away or not gmpy2.is_finite(toward):
        return toward                                # exact, or inf/NaN
    midpoint = (_exact(toward) + _exact(away)) / 2
    return away if abs(Fraction(value)) >= abs(midpoint) else toward


def _finish(rounded, value: float, fmt: Format, mode: str, saturate: bool,
            subnormals: bool) -> float:
    """Apply fpsim's overflow, flush and zero rules to an unbounded rounding; a Python float."""
    if gmpy2.is_nan(rounded):
        return math.nan
    result = float(rounded)  # exact (precision <= 24 bits), or inf beyond float64's range
    sign = -1.0 if math.copysign(1.0, result) < 0 else 1.0
    if abs(result) > fmt.max_finite:
        toward_that_infinity = (mode not in ("toward_zero", "up", "down")
                                or math.isinf(value)
                                or (mode == "up" and sign > 0)
                                or (mode == "down" and sign < 0))
        if saturate or not toward_that_infinity:
            return sign * fmt.max_finite
        return sign * math.inf if fmt.has_inf else math.nan
    if not subnormals and abs(result) < fmt.min_normal:
        result = sign * 0.0
    if not fmt.has_negative_zero and result == 0:
        result = 0.0
    return result


def _resolve(fmt, saturate, subnormals):
    fmt = get(fmt)
    return (fmt, fmt.saturate if saturate is None else bool(saturate),
            fmt.subnormals if subnormals is None else bool(subnormals))


def _read_input(value: float, fmt: Format, daz: bool) -> float:
    value = float(value)
    if daz and abs(value) < fmt.min_normal:
        return math.copysign(0.0, value)
    return value


def mpfr_round(value: float, fmt: "Format | str", mode: str, saturate: bool | None = None,
               subnormals: bool | None = None, daz: bool = False) -> float:
    """The value ``round_to(value, fmt, mode, saturate=..., subnormals=..., daz=...)`` must give,
    as a Python float (exact: every format value is a float64). ``saturate`` and ``subnormals``
    None mean the format's own setting, as in ``round_to``."""
    if mode not in DETERMINISTIC_MODES:
        raise ValueError(f"mpfr_round takes one of {DETERMINISTIC_MODES}, got {mode!r}")
    fmt, saturate, subnormals = _resolve(fmt, saturate, subnormals)
    value = _read_input(value, fmt, daz)
    return _finish(_unbounded_rounding(value, fmt, mode), value, fmt, mode, saturate,
                   subnormals)


def mpfr_round_rational(value: Fraction, fmt: "Format | str", mode: str) -> float:
    """``mpfr_round`` of an exact rational (an int or ``Fraction``, |value| < 2**1000): MPFR
    rounds it once, never through float64; the format's own saturation and subnormals."""
    if mode not in DETERMINISTIC_MODES:
        raise ValueError(f"mpfr_round_rational takes one of {DETERMINISTIC_MODES}, got {mode!r}")
    fmt, saturate, subnormals = _resolve(fmt, None, None)
    value = Fraction(value)
    return _finish(_unbounded_rounding(value, fmt, mode), value, fmt, mode, saturate,
                   subnormals)


def stochastic_outcomes(value: float, fmt: "Format | str", saturate: bool | None = None,
                        subnormals: bool | None = None,
                        daz: bool = False) -> tuple[float, float, Fraction]:
    """(lower, upper, p): stochastic rounding must give ``upper`` (the neighbour away from zero)
    with probability p = (|x| - |lower|) / (|upper| - |lower|), else ``lower`` (toward zero).
    Both neighbours then follow the round-to-nearest overflow rule and the flush rules; an
    exact input gives (x, x, 0)."""
    fmt, saturate, subnormals = _resolve(fmt, saturate, subnormals)
    value = _read_input(value, fmt, daz)
    toward = _mpfr_rounding(value, fmt, "toward_zero")
    away = _mpfr_rounding(value, fmt, "away_from_zero")
    if toward == away or not gmpy2.is_finite(toward):
        probability = Fraction(0)
    else:
        probability = (abs(Fraction(value)) - abs(_exact(toward))) / \
                      (abs(_exact(away)) - abs(_exact(toward)))
    lower = _finish(toward, value, fmt, "stochastic", saturate, subnormals)
    upper = _finish(away, value, fmt, "stochastic", saturate, subnormals)
    return lower, upper, probability


def native_ieee_round(value: float, fmt: "Format | str", mode: str) -> float:
    """MPFR's own IEEE overflow handling (emax = fmt.emax + 1) for an "ieee" format without
    saturation, in the modes MPFR has natively: a check on the rules ``_finish`` applies."""
    fmt = get(fmt)
    if fmt.encoding != "ieee" or mode not in ("nearest_even", "toward_zero", "up", "down"):
        raise ValueError("native_ieee_round covers ieee formats in MPFR's own modes only")
    with _context(fmt.precision, fmt.emin - fmt.man_bits + 1, fmt.emax + 1, mode):
        rounded = gmpy2.mpfr(float(value))
    if gmpy2.is_nan(rounded):
        return math.nan
    return float(rounded)


def mpfr_rounded(exact, fmt):
    """Each exact mpfr value rounded once to ``fmt`` (grid and subnormals by MPFR, overflow by
    fpsim's rule, which the rounding tests above check separately), as float32."""
    fmt = get(fmt)
    ctx = gmpy2.context(precision=fmt.precision, emin=fmt.emin - fmt.man_bits + 1,
                        emax=1 << 12, subnormalize=True)
    with ctx:
        grid = np.array([float(gmpy2.mpfr(v)) for v in exact], np.float64)
    return round_to(grid, fmt).astype(np.float32)


def _sigmoid(x):
    return 1 / (1 + gmpy2.exp(-x))


def _gelu(x):
    if 0 < abs(x) < 2 ** -30:
        # x Phi(x) = x/2 + x^2/sqrt(2 pi) - x^4/(6 sqrt(2 pi)) + O(x^6): for an odd subnormal
        # x, x/2 is a tie that only the x^2 term (2**-150 relative) decides, so 400 bits
        with gmpy2.context(precision=400):
            k = 1 / gmpy2.sqrt(2 * gmpy2.const_pi())
            return x / 2 + x * x * k - x ** 4 * k / 6
    if x > 0 and gmpy2.is_finite(x):
        # x Phi(x) = x - x Q(x), the small term on its own: Q(x) <= e**(-x*x/2) / 2 (Chernoff),
        # below 2**-450 from x = 25 on, so x - x Q(x) would come out as x itself, a tie wherever
        # x is a midpoint of the format; the value lies strictly between x and the number just
        # below it, which then stands for it (it has far more bits than any format)
        if x >= 25:
            return gmpy2.next_below(x)
        value = x - x * gmpy2.erfc(x / gmpy2.sqrt(2)) / 2
        return gmpy2.next_below(x) if value == x else value
    return x * gmpy2.erfc(-x / gmpy2.sqrt(2)) / 2


# The exact functions, evaluated by MPFR at the precision of the enclosing gmpy2 context
FUNCTIONS = {"exp": gmpy2.exp, "log": gmpy2.log, "tanh": gmpy2.tanh, "sigmoid": _sigmoid,
             "gelu": _gelu}


def function_values(name, x, precision=200):
    """``FUNCTIONS[name]`` of each element of x (exact floats) as mpfr at ``precision`` bits."""
    fn = FUNCTIONS[name]
    with gmpy2.context(precision=precision):
        return [fn(gmpy2.mpfr(v)) for v in np.asarray(x).ravel().tolist()]


def row_terms(x, precision=400):
    """Per row of a 2-D float array: (list of x_i - m, log sum_j exp(x_j - m)) as mpfr, m the
    row's max. At 400 bits x_i - m of float32 values is exact (at most 277 bits). The sum is
    1 + t, t over all but the first maximum, and its log is taken as log1p(t), with ~350 good
    bits however small t is (log of the rounded 1 + t would be 0 for t below 2**-400, and
    the dominant class's log-softmax -log1p(t) is negative, never 0)."""
    out = []
    with gmpy2.context(precision=precision):
        for row in np.asarray(x).tolist():
            top = row.index(max(row))
            m = gmpy2.mpfr(row[top])
            d = [gmpy2.mpfr(v) - m for v in row]
            t = gmpy2.fsum([gmpy2.exp(di) for j, di in enumerate(d) if j != top])
            out.append((d, gmpy2.log1p(t)))
    return out


def softmax_values(x, precision=400):
    """Softmax of each row of x, exact to ~350 bits, as a flat list of mpfr (C order):
    e**(x_i - m) / sum_j e**(x_j - m), exact where the row's terms are (n equal values: 1/n,
    a tie in some formats, where exp(-log n) would miss the tie by 2**-400)."""
    out = []
    with gmpy2.context(precision=precision):
        for row in np.asarray(x).tolist():
            m = gmpy2.mpfr(max(row))
            e = [gmpy2.exp(gmpy2.mpfr(v) - m) for v in row]
            total = gmpy2.fsum(e)
            out += [ei / total for ei in e]
    return out


def log_softmax_values(x, precision=400):
    """Log-softmax of each row of x as a flat list of mpfr (C order). Where log sum exp is
    below the precision's reach beside x_i - m (a row spread over hundreds: it is e**-446 in
    [-446.125, 0]), x_i - m - log sum exp lies strictly between x_i - m, which may be a
    midpoint of the format, and the number just below it, which then stands for it."""
    out = []
    with gmpy2.context(precision=precision):
        for d, lse in row_terms(x, precision):
            for di in d:
                value = di - lse
                out.append(gmpy2.next_below(di) if value == di and lse > 0 else value)
    return out
