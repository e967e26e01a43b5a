"""Correctly rounded transcendentals: certify the float64 evaluation, fall back to Decimal.

Each function takes float32/float64 values and an output ``Format`` and returns a float64
*proxy* array: a value that ``round_to(., fmt)`` (round to nearest, ties to even) sends to the
correctly rounded exact result, so callers keep their single ``round_array`` call (and the
underflow counting on it). Rounding straight into ``fmt`` from float64, never through float32.

Certificate: with v from ``fpsim.exact.elementary`` and its relative bound b, the exact value
lies in [v - e, v + e], e = |v| (b + 2**-52) (the extra 2**-52 |v| covers the two roundings
of v -+ e; b = 0 marks a proxy that rounds like the exact value, and e = 0). Rounding is
monotonic, so when both ends round to the same value the exact one does too, and v is
returned. The rest goes to ``settle``: a Ziv loop on ``fpsim.exact.decimal_ref`` at 30, 60,
120, ... digits, until the numbers just inside both ends of the Decimal enclosure, taken
exactly, round alike; its proxy is the exact value rounded to odd into float64 (see
``settle``). How many that is, over all 2**32 float32 inputs (``tests/data``): for fp32
output exp 10, log 111, tanh 22, sigmoid 588, gelu 107; for fp16, bf16 and e4m3fn almost
all are tiny inputs x that are midpoints of the format, tanh x and gelu 2x lying a relative
x*x beside them (tanh into bf16 26568, gelu into bf16 3445 and fp16 335; every other
function and format 5 or fewer).
"""
from __future__ import annotations

from contextlib import contextmanager
from fractions import Fraction

from ..backend import round_to, size, to_list, tuning, xp
from ..formats import FP32
from ..rounding import float64_round_to_odd
from . import decimal_ref as ref
from .certificate import certify
from . import elementary
from .odd_rounding import round_to_odd

__all__ = ["certified", "settle", "enclosure", "forced_fallback", "cr_exp", "cr_log", "cr_tanh",
           "cr_sigmoid", "cr_silu", "cr_gelu", "gelu_bound", "silu64", "SILU_BOUND",
           "cr_gelu_tanh", "gelu_tanh64", "gelu_tanh_parts", "gelu_tanh_bound",
           "TWO_SQRT_2_OVER_PI", "GELU_TANH_KAPPA", "FALLBACK_COUNT", "nan_as_input"]

# how many elements ``certified`` looked at ("checked") and ``settle`` decided ("elements"): the
# fallback's share, which tests and benchmarks/bench_models.py read
FALLBACK_COUNT = {"elements": 0, "checked": 0}
_FORCED = {"on": False}            # the test switch of ``forced_fallback``
_FAR = 2.0 ** 160                  # beyond 2**+-160 every format over- or underflows by far


@contextmanager
def forced_fallback():
    """Test switch: inside ``with forced_fallback():`` the float64 certificate decides only
    what ``settle`` must not or cannot take, and every other element goes to ``settle``:
    NaN, +-inf and zero values (their bits are the evaluation's own), proxies with bound 0
    (exact by argument: ``cr_gelu``'s tails), and values beyond 2**+-160, which round to
    zero or overflow in every format, where the Decimal evaluation of the clamped arguments
    would overflow its exponent range."""
    before = _FORCED["on"]
    _FORCED["on"] = True
    try:
        yield
    finally:
        _FORCED["on"] = before
_DIGITS = (30, 60, 120, 240, 480)


def certified(v, bound, fmt):
    """Mask of elements of float64 ``v`` (relative error <= ``bound``, a scalar or array)
    whose rounding to ``fmt`` is decided. NaN and +-inf count as decided: the evaluations give
    them only where they are the exact result (inf input, log 0) or NaN."""
    FALLBACK_COUNT["checked"] += size(v)
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
    if _FORCED["on"]:
        far = (xp.abs(v1) > _FAR) | (xp.abs(v1) < 1 / _FAR)
        decided = ~xp.isfinite(v1) | (v1 == 0) | (xp.atleast_1d(bound) == 0) | far
        return xp.reshape(decided, xp.shape(v))
    decided = same | (xp.isnan(lo) & xp.isnan(hi)) | ~xp.isfinite(v1) | (v1 == 0)
    return xp.reshape(decided, xp.shape(v))


def _rounds_alike(a: float, b: float, fmt) -> bool:
    ends = round_to(xp.asarray([a, b], xp.float64), fmt)
    return bool(ends[0] == ends[1]) or bool(xp.all(xp.isnan(ends)))


def enclosure(r, eta):
    """The open interval (r - eta |r|, r + eta |r|) as exact ``Fraction`` ends, for the
    ``decimal_ref`` values (r, eta): they claim eta 10**5 times their error, so the exact
    value lies strictly inside; r = 0 (an exact zero) gives the point (0, 0)."""
    q = Fraction(r)
    width = abs(q) * Fraction(eta)
    return q - width, q + width


def settle(value, fmt):
    """A float64 proxy for the exact value x enclosed by ``value(digits) -> (low, high)``:
    exact rationals with low < x < high, or low = high = x. The proxy is x rounded to odd into
    float64, or another odd float64 that rounds to ``fmt`` as x does.

    Why round to odd: round-to-nearest into ``fmt`` changes its result only at the format's
    midpoints and its overflow threshold, numbers of at most 25 significant bits; a float64
    with an odd last bit has 53 and is never one of them. So the odd float64 next to x (or x
    itself, when x is a float64) lies between the same two of them as x and rounds to fmt as x
    does (``fpsim.rounding.rational``); it is zero or negative exactly where x is. No decision
    is taken on a float64 proxy of x: the interval's ends are exact; the numbers just inside
    each end are rounded to odd (``float64_round_to_odd`` with a side) and then to ``fmt``;
    once both give the same value every point between them does (both roundings are
    monotonic), x among them, and the one just inside the upper end is returned (it is x
    rounded to odd once the two agree as float64 too). Otherwise the precision is raised
    (Ziv). An x that is itself a midpoint is never decided (it raises): no value the callers
    ask for is one, except at inputs the float64 certificate decides."""
    FALLBACK_COUNT["elements"] += 1
    for digits in _DIGITS:
        low, high = value(digits)
        if low == high:
            return float64_round_to_odd(low)
        below_high = float64_round_to_odd(high, side=-1)
        if _rounds_alike(float64_round_to_odd(low, side=1), below_high, fmt):
            return below_high
    raise ArithmeticError("settle: no decision at 480 digits")


def _finish(x, evaluate, fmt, dref):
    """Evaluate chunk by chunk (``tuning().correctly_rounded_chunk`` elements: the float64
    temporaries stay in cache), certify, settle the rest. ``evaluate(chunk)`` gives the
    float64 values and their relative bound (a scalar, or one per element), from one pass
    over the chunk's inputs (converted to float64 chunk by chunk, not all at once)."""
    x = xp.asarray(x)
    flat_x = xp.reshape(x, (-1,))
    v = xp.empty(flat_x.shape, xp.float64)
    chunk = tuning().correctly_rounded_chunk
    for i in range(0, size(flat_x), chunk):
        part = slice(i, i + chunk)
        values, bound = evaluate(xp.asarray(flat_x[part], xp.float64))
        v[part] = values
        ok = certified(values, bound, fmt)
        for j in to_list(xp.flatnonzero(~ok) + i):     # few: one transfer to the host
            xj = float(flat_x[j])
            v[j] = settle(lambda d, xj=xj: enclosure(*dref(xj, d)), fmt)
    return xp.reshape(v, x.shape)


def _with_bound(function, bound):
    """``evaluate`` for ``_finish``: ``function``'s values with one relative bound for all."""
    return lambda x: (function(x), bound)


def cr_exp(x, fmt):
    """exp(x) correctly rounded to ``fmt``, as a float64 proxy (see module doc)."""
    return _finish(x, _with_bound(elementary.exp, elementary.EXP_BOUND), fmt, ref.dexp)


def cr_log(x, fmt):
    return _finish(x, _with_bound(elementary.log, elementary.LOG_BOUND), fmt, ref.dln)


def cr_tanh(x, fmt):
    return _finish(x, _with_bound(elementary.tanh, elementary.TANH_BOUND), fmt, ref.dtanh)


def cr_sigmoid(x, fmt):
    return _finish(x, _with_bound(elementary.sigmoid, elementary.SIGMOID_BOUND), fmt,
                   ref.dsigmoid)


# sigmoid within SIGMOID_BOUND (2**-48), times the exact x, one float64 rounding (2**-53)
SILU_BOUND = elementary.SIGMOID_BOUND + 2.0 ** -52


def silu64(x):
    """x sigmoid(x) in float64, within ``SILU_BOUND`` relative: ``elementary.sigmoid`` times
    the exact x. Below x = -400 (``elementary``'s clamp of exp) the bound does not hold, but
    |x sigmoid(x)| is below 2**-560 and the float64 value below 2**-440: both round to -0
    in every format. silu(-inf) = -inf * 0 is NaN, as PyTorch gives; NaN -> itself
    (``nan_as_input``)."""
    x = xp.asarray(x, xp.float64)
    with xp.errstate(invalid="ignore"):        # -inf * 0
        return nan_as_input(x, x * elementary.sigmoid(x))


def nan_as_input(x, value):
    """``value`` with x's own NaN where x is NaN. A formula like x * sigmoid(x) makes a NaN
    x meet a second NaN (sigmoid's -|x|), and which of two NaNs an operation returns is left
    open: NumPy's choice varies with its SIMD path and the array's length, torch's add
    returns its second operand's. Selecting x's fixes the bits on every backend."""
    return xp.where(xp.isnan(x), x, value)


def cr_silu(x, fmt):
    """SiLU, x sigmoid(x), correctly rounded to ``fmt`` as a float64 proxy (module doc)."""
    return _finish(x, _with_bound(silu64, SILU_BOUND), fmt, ref.dsilu)


def gelu_bound(x):
    """The relative bound of ``elementary.gelu`` at each float64 x: 0 where it returns a proxy
    that rounds like the exact value (x >= 10, x <= -20, 0 < |x| < 2**-60: ``elementary``'s
    doc), ``GELU_BOUND`` elsewhere."""
    a = xp.abs(x)
    return xp.where((x >= 10.0) | (x <= -20.0) | ((a < 2.0 ** -60) & (a > 0)), 0.0,
                    elementary.GELU_BOUND)


def _gelu_and_bound(x):
    """gelu's values and bound: ``GELU_BOUND`` for all when every x takes the table path
    (``elementary.gelu_parts``), else ``gelu_bound``."""
    value, outside = elementary.gelu_parts(x)
    return value, elementary.GELU_BOUND if outside is None else gelu_bound(x)


def cr_gelu(x, fmt):
    return _finish(x, _gelu_and_bound, fmt, ref.dgelu)


# sqrt(2/pi) * 2 and 0.044715 as float64 (each within 2**-53 relative of the real constant)
TWO_SQRT_2_OVER_PI = float.fromhex("0x1.9884533d43651p+0")
GELU_TANH_KAPPA = 0.044715


def gelu_tanh_parts(x):
    """(y, s) for float64 x: y = 2 sqrt(2/pi) (x + 0.044715 x**3) within 7u relative
    (u = 2**-53: x**3 two roundings, the constant and the product two, the sum of two terms
    of one sign one, 2 sqrt(2/pi) one more) and s = sigmoid(y) within 8u of sigmoid(y)."""
    y = _gelu_tanh_argument(x)
    return y, elementary.sigmoid(y)


def _gelu_tanh_argument(x):
    """y = 2 sqrt(2/pi) (x + 0.044715 x**3) for float64 x (``gelu_tanh_parts``)."""
    x = xp.asarray(x, xp.float64)
    with xp.errstate(over="ignore", invalid="ignore"):
        return TWO_SQRT_2_OVER_PI * (x + GELU_TANH_KAPPA * (x * x * x))


def gelu_tanh64(x):
    """PyTorch's tanh GELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3))), taken with the
    real constants sqrt(2/pi) and 0.044715, in float64 as x sigmoid(y) (the same real number:
    (1 + tanh(z)) / 2 = sigmoid(2z), with no cancellation in 1 + tanh(z) for z << 0).

    Relative error (``gelu_tanh_bound``): y is off by 7u |y|, which moves log sigmoid(y) by at
    most 7u |y| sigmoid(-y); sigmoid's own 8u and the product's u: within
    16u (1 + |y| sigmoid(-y)). Where y >= 40 the value x (1 - sigmoid(-y)) lies within
    x e**-40 < 2**-57 x below x, strictly between x's lower float64 neighbour and x: returned
    rounded to odd (the odd one of the two), which rounds like it into every format. Where
    y <= -300, |value| <= |x| e**-300 < 2**-300 for |x| < 2**128 (float32 inputs): returned
    as -2**-1000, which rounds like it (to -0) into every format. inf -> inf, -inf -> NaN
    (-inf * 0, as PyTorch's 0.5 x (1 + tanh) gives), NaN -> itself (``nan_as_input``)."""
    x = xp.asarray(x, xp.float64)
    y, s = gelu_tanh_parts(x)
    return _gelu_tanh_value(x, y, s, _gelu_tanh_middle(y))


def _gelu_tanh_middle(y):
    """Whether every y lies in (-300, 40), where x sigmoid(y) is taken as it stands (NaN and
    +-inf do not)."""
    return xp.count_nonzero((y < 40.0) & (y > -300.0)) == size(y)


def _gelu_tanh_value(x, y, s, middle: bool):
    """``gelu_tanh64`` from x, y and s = sigmoid(y); ``middle``: ``_gelu_tanh_middle(y)``."""
    with xp.errstate(invalid="ignore"):
        out = x * s
    if middle:
        return out
    big = xp.isfinite(x) & (y >= 40.0)
    out = xp.where(big, round_to_odd(x, xp.where(big, -1.0, 0.0)), out)
    out = xp.where(xp.isfinite(x) & (y <= -300.0), -(2.0 ** -1000), out)
    return nan_as_input(x, xp.where(x == xp.inf, xp.inf, out))


def gelu_tanh_bound(x):
    """The relative bound of ``gelu_tanh64`` at each float64 x (its doc): 0 where it returns
    a proxy that rounds like the exact value (y >= 40, y <= -300)."""
    y = _gelu_tanh_argument(x)
    return _gelu_tanh_bound(y, elementary.sigmoid(-y), False)


def _gelu_tanh_bound(y, s_neg, middle: bool):
    """``gelu_tanh_bound`` from y and s_neg = sigmoid(-y)."""
    with xp.errstate(invalid="ignore", over="ignore"):
        b = 2.0 ** -49 * (1.0 + xp.abs(y) * s_neg)
    return b if middle else xp.where((y >= 40.0) | (y <= -300.0), 0.0, b)


def _gelu_tanh_and_bound(x):
    """``gelu_tanh64`` and ``gelu_tanh_bound`` of float64 x from one y and one exp
    (``elementary.sigmoid_pair``), the y <= -300 and y >= 40 cases only where there are any."""
    y = _gelu_tanh_argument(x)
    s, s_neg = elementary.sigmoid_pair(y)
    middle = _gelu_tanh_middle(y)
    return _gelu_tanh_value(x, y, s, middle), _gelu_tanh_bound(y, s_neg, middle)


def cr_gelu_tanh(x, fmt):
    """The tanh GELU of float32 values x, its exact real value (``gelu_tanh64``) correctly
    rounded to ``fmt``, as a float64 proxy (module doc)."""
    return _finish(x, _gelu_tanh_and_bound, fmt, ref.dgelu_tanh)
