"""Float64 evaluations of exp, expm1, log, log1p, tanh, sigmoid and GELU with stated error bounds.

Every function here uses float64 ``+ - * /`` only, plus exact operations (``rint``, ``frexp``,
building ``2**k`` from its bits, comparisons, ``where``): no libm, no FMA, so every backend that
rounds float64 operations to nearest even computes the same bits. Each ``*_bound`` constant is a
relative error bound, ``|computed - exact| <= bound * |computed|`` (``correctly_rounded``
inflates it once more by 2**-52 for the computed interval ends). The derivations, in units of
u = 2**-53 (one float64 rounding):

- ``exp_parts(y)``: k = rint(y / ln 2); r = (y - k*LN2_HI) - k*LN2_LO with LN2_HI of 32
  significant bits, so k*LN2_HI is exact for |k| < 2**21 and y - k*LN2_HI is exact whenever
  k = 0 or y is a multiple of 2**-50 (float32 x with |x| >= 0.34, 2x, a*a/2 with a >= 0.83;
  a softmax shift x_i - m need not be, and then adds one more rounding, 0.35u) (Cody-Waite).
  |r| <= 0.3466; the reduced argument is off by at most 0.7u + |k| 2**-85. expm1(r) = r + r*r*q(r),
  q the Taylor series to r**12/14! (truncation < 2**-60 |r|): q carries <= 3u, r*r*q <= 0.07|r| so
  it adds <= 0.4u, the final sum u: expm1(r) within 1.5u (relative), and exp(y) = 2**k (1 +
  expm1(r)) within 3.5u.
- ``log`` of a positive float64: x = 2**e m, m in [1/sqrt 2, sqrt 2), f = m - 1 exact
  (Sterbenz), s = f / (2 + f) within 2u, log m = 2 atanh s = 2s + s z w(z), z = s*s, the
  series to s**23 (truncation < 2**-60): log m within 3.2u; with e*LN2_HI exact and
  |log x| >= |e| ln2 / 2 for e != 0, log x within 5.3u.
- ``log1p(t)``, t >= 0: t < 0.4 through s = t / (2 + t) as above (t exact, no cancellation);
  t >= 0.4 through log(1 + t): within 5.3u + u (1+t)/((1+t) log(1+t)) < 9u.
- ``tanh``: t = -E / (2 + E), E = expm1(-2|x|) within 3u (k = 0: 1.5u; k != 0:
  E = (2**k - 1) + 2**k p with |E| >= 0.29): 2 + E within 4u, the quotient within 8u.
- ``sigmoid``: z = exp(-|x|) within 3u; 1 / (1 + z) within 5u, z / (1 + z) within 8u.
- ``gelu``: x Phi(x) with Phi(-a) = Q(a) = exp(-a*a/2) M(a), a = |x| (a*a exact), and M,
  entire and smooth (M' = a M - 1/sqrt(2 pi)), from its Taylor series of degree 15 around
  c = j/4 (|h| <= 1/8, h = a - c exact), coefficients computed once in Decimal
  (``fpsim.exact.decimal_ref``) and rounded to float64: M within 3u, Q within 7u; x < 0:
  x Q within 8u; x >= 0: x (1 - Q) within 10u. x >= 10: the value is x (1 - Q) with
  Q < 2**-76, returned rounded to odd (of x and the float64 just below it, the odd one),
  which rounds like it into every format of at most 51 bits (``odd``); x <= -20:
  |gelu| < 2**-280, returned as -2**-1000 (both round to -0). 0 < |x| < 2**-60: the value
  x/2 + x*x/sqrt(2 pi) - ... lies just above x/2 (a tie when x is an odd subnormal
  multiple), closer than a float64 spacing; it is returned rounded to odd (``_tiny_gelu``).

The stated bounds below are these with a margin of 2 to 8 (the MPFR tests check them).
"""
from __future__ import annotations

import struct
from functools import lru_cache

from ..backend import astype, bitcast, copy, fused, name, size, tuning, xp
from .odd_rounding import round_to_odd

__all__ = ["pow2", "exp_parts", "exp", "expm1_neg", "log", "log1p", "tanh", "sigmoid",
           "sigmoid_pair", "gelu", "gelu_parts", "gelu_tail_q", "normal_cdf", "normal_pdf",
           "normal_cdf_pdf", "EXP_BOUND", "LOG_BOUND", "LOG1P_BOUND", "TANH_BOUND",
           "SIGMOID_BOUND", "GELU_BOUND"]

EXP_BOUND = 2.0 ** -50
LOG_BOUND = 2.0 ** -49
LOG1P_BOUND = 2.0 ** -49
TANH_BOUND = 2.0 ** -48
SIGMOID_BOUND = 2.0 ** -48
GELU_BOUND = 2.0 ** -47

LOG2E = float.fromhex("0x1.71547652b82fep+0")
LN2_HI = float.fromhex("0x1.62e42fee00000p-1")     # 32 significant bits
LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")    # ln 2 - LN2_HI to float64
SQRT_HALF = float.fromhex("0x1.6a09e667f3bcdp-1")
INV_SQRT_2PI = float.fromhex("0x1.9884533d43651p-2")
# invalid operations (log of x < 0, gelu(-inf) = -inf * 0) give x86's default NaN, sign bit
# set, as NumPy's float64 functions did before
DEFAULT_NAN = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000000))[0]
_CLAMP = 400.0   # |y| beyond this: exp over/underflows every format by hundreds of binades


def _factorial(n: int) -> int:
    out = 1
    for i in range(2, n + 1):
        out *= i
    return out


# expm1(r) = r + r^2 q(r), q(r) = sum_{i=0}^{12} r^i / (i + 2)!  (Python int division rounds
# correctly, so each coefficient is the float64 nearest 1/(i+2)!)
_EXPM1_Q = tuple(1 / _factorial(i + 2) for i in range(13))
# log m = 2s + s z w(z), w(z) = sum_{i=0}^{10} 2 z^i / (2i + 3)
_ATANH_W = tuple(2 / (2 * i + 3) for i in range(11))


def _horner(x, coeffs):
    """((c_n x + c_{n-1}) x + ...) x + c_0, n >= 1, one rounding per operation. The first
    product is x * c_n (multiplication commutes: the bits of c_n * x, with no array of c_n
    to fill first)."""
    acc = x * coeffs[-1]
    acc += coeffs[-2]
    for c in coeffs[-3::-1]:
        acc *= x
        acc += c
    return acc


def pow2(k):
    """2.0**k for integer-valued float64 k in [-1022, 1023], built from its bits (exact)."""
    return bitcast((astype(k, xp.int64) + 1023) << 52, xp.float64)


def exp_parts(y):
    """(k, p) with exp(y) = 2**k (1 + p), p = expm1(r) within 1.5u; y float64, |y| <= 400."""
    k = xp.rint(y * LOG2E)
    r = y - k * LN2_HI
    r -= k * LN2_LO
    # r + (r*r) q(r), written in place (the same operations: + commutes for finite r)
    p = r * r
    p *= _horner(r, _EXPM1_Q)
    p += r
    return k, p


def exp(y):
    """exp(y) for float64 y with |y| <= 400 within 3.5u (``EXP_BOUND``); inf, -inf, NaN as
    IEEE exp. Beyond +-400 the argument is clamped to +-400: a proxy that overflows or
    underflows every fpsim format (and float32) as the exact value does, but is not exp(y) in
    float64 (exp(-760) gives exp(-400), not 0 as libm's float64 exp does). The backward
    formulas that use it therefore see a tiny nonzero gradient, flushed by the rounding into
    the gradient format and counted as underflow, where libm's exp gave an exact 0.
    Where the backend offers a fused ``exp`` (``fpsim.backend.fused``), that computes it."""
    y = xp.asarray(y, xp.float64)
    kernel = fused("exp")
    if kernel is not None:
        return kernel(y)
    # all finite: as many finite values as values (a count: NumPy's all costs more)
    finite = xp.count_nonzero(xp.isfinite(y)) == size(y)
    # the clamp as maximum then minimum: clip's values (no NaN here), without its wrapper
    k, p = exp_parts(xp.minimum(xp.maximum(y if finite else xp.where(xp.isfinite(y), y, 0.0),
                                           -_CLAMP), _CLAMP))
    p += 1.0
    p *= pow2(k)
    if finite:
        return p
    return xp.where(xp.isinf(y), xp.where(y > 0, xp.inf, 0.0), xp.where(xp.isnan(y), y, p))


def expm1_neg(y):
    """expm1(y) for float64 y <= 0 within 3u (finite y; clamped at -400)."""
    k, p = exp_parts(xp.maximum(y, -_CLAMP))
    scale = pow2(k)
    return xp.where(k == 0, p, (scale - 1.0) + scale * p)


def _log_mantissa(m):
    """log m for m in [1/sqrt 2, sqrt 2) within 3.2u."""
    f = m - 1.0
    return _atanh2(f / (2.0 + f))


def _atanh2(s):
    """2 atanh s = log((1+s)/(1-s)) for |s| <= 0.1716."""
    z = s * s
    return 2.0 * s + s * (z * _horner(z, _ATANH_W))


def log(x):
    """Natural log of float64 x within 5.3u (``LOG_BOUND``); 0 -> -inf, x < 0 -> DEFAULT_NAN,
    inf -> inf, NaN -> itself."""
    x = xp.asarray(x, xp.float64)
    bad = ~(x > 0) | xp.isinf(x)
    any_bad = bool(xp.count_nonzero(bad))
    m, e = xp.frexp(xp.where(bad, 1.0, x) if any_bad else x)
    low = m < SQRT_HALF
    m = xp.where(low, m + m, m)                      # exact doubling where low
    e = astype(xp.where(low, e - 1, e), xp.float64)
    out = e * LN2_HI + (_log_mantissa(m) + e * LN2_LO)
    if not any_bad:
        return out
    special = xp.where(x == 0, -xp.inf, xp.where(x == xp.inf, xp.inf,
                                                   xp.where(xp.isnan(x), x, DEFAULT_NAN)))
    return xp.where(bad, special, out)


def log1p(t):
    """log(1 + t) for float64 t >= 0 within 9u (``LOG1P_BOUND``); inf -> inf."""
    t = xp.asarray(t, xp.float64)
    small = t < 0.4
    count = xp.count_nonzero(small)
    if count == size(t):   # one branch only where all take it: the same bits,
        return _atanh2(t / (2.0 + t))  # half the work
    if not count:        # (NaN is not small: log keeps it)
        return log(1.0 + t)
    ts = xp.where(small, t, 0.0)
    return xp.where(small, _atanh2(ts / (2.0 + ts)), log(1.0 + xp.where(small, 0.0, t)))


def tanh(x):
    """tanh of float64 x within 8u (``TANH_BOUND``); sign of zero kept, NaN -> itself."""
    x = xp.asarray(x, xp.float64)
    nan = xp.isnan(x)
    any_nan = bool(xp.count_nonzero(nan))
    big = expm1_neg(-2.0 * xp.minimum(xp.abs(xp.where(nan, 0.0, x) if any_nan else x), _CLAMP))
    t = xp.copysign(-big / (2.0 + big), x)
    return xp.where(nan, x, t) if any_nan else t


def sigmoid(x):
    """1 / (1 + exp(-x)) of float64 x within 8u (``SIGMOID_BOUND``); NaN -> -|NaN| (the NaN
    that exp(-|x|) gives, as before)."""
    x = xp.asarray(x, xp.float64)
    upper, lower = _sigmoid_branches(x)
    return xp.where(x >= 0, upper, lower)


def sigmoid_pair(x):
    """(sigmoid(x), sigmoid(-x)), the bits of two ``sigmoid`` calls from one exp: both take
    z = exp(-|x|) and 1 + z, x >= 0 picks 1 / (1 + z) for the first, x <= 0 for the second."""
    x = xp.asarray(x, xp.float64)
    upper, lower = _sigmoid_branches(x)
    return xp.where(x >= 0, upper, lower), xp.where(x <= 0, upper, lower)


def _sigmoid_branches(x):
    """1 / (1 + z) and z / (1 + z), z = exp(-|x|): sigmoid(|x|) and sigmoid(-|x|)."""
    z = exp(-xp.abs(x))
    one_plus = 1.0 + z
    return xp.divide(1.0, one_plus), z / one_plus


_STEP = 4            # centres j / 4
_CENTRES = 81        # j = 0 .. 80: a up to 20
_DEGREE = 15


@lru_cache(maxsize=None)
def _gelu_coefficients() -> tuple:
    """Per centre, the degree + 1 float64 Taylor coefficients of M around it (host floats:
    the Decimal work is done once per process)."""
    from .decimal_ref import mills_taylor

    cols = [mills_taylor(j / _STEP, _DEGREE + 1, 1 / (2 * _STEP)) for j in range(_CENTRES)]
    return tuple(tuple(float(c) for c in col[:_DEGREE + 1]) for col in cols)


@lru_cache(maxsize=None)
def _gelu_table(backend_name: str):
    """(degree + 1, centres) float64 array of ``_gelu_coefficients``, one per backend."""
    return copy(xp.asarray(_gelu_coefficients(), xp.float64).T)


def gelu_tail_q(a):
    """Q(a) = P(N(0,1) > a) for float64 0 <= a <= 20 within 7u."""
    kernel = fused("normal_tail")
    if kernel is not None:
        # Phi(-a) is Q(a) for a > 0; at a = 0 the kernel takes 1 - Q(0), the same float64:
        # Q(0) is exp(-0) M(0) = 1/2, the table's first coefficient, exactly
        return kernel(-a, _gelu_table(name()))[0]
    q = exp(-(a * a) * 0.5)
    q *= _mills_series(a)
    return q


def _mills_series(a):
    """M(a) = Q(a) e**(a*a/2) for float64 0 <= a <= 20 within 3u: the Taylor polynomial
    around the nearest centre j / 4, by Horner in place, each coefficient row gathered with
    ``take`` (a 1-D gather from a row in cache, not 2-D fancy indexing)."""
    table = _gelu_table(name())
    centre = xp.rint(a * _STEP)
    j = astype(centre, xp.intp)
    h = a - xp.divide(centre, _STEP)     # j / 4, exact
    acc = xp.take(table[_DEGREE], j)
    for degree in range(_DEGREE - 1, -1, -1):        # Horner, highest coefficient first
        acc *= h
        acc += xp.take(table[degree], j)
    return acc


def gelu(x):
    """x Phi(x) of float64 x within 10u (``GELU_BOUND``), see the module doc for |x| >= 10;
    -inf -> DEFAULT_NAN (-inf * 0, as before), inf -> inf, NaN -> itself."""
    return gelu_parts(x)[0]


def gelu_parts(x):
    """(``gelu(x)``, mask of the elements off the table path, or None when there are none).
    The table path, x Phi(x) from ``gelu_tail_q``, takes -20 < x < 10 with |x| >= 2**-60 or
    x = 0: the activations a network feeds it. The others (NaN, +-inf, x >= 10, x <= -20,
    tiny x) are taken one formula each, on themselves only (``_gelu_outside``)."""
    x = xp.asarray(x, xp.float64)
    a = xp.abs(x)
    on_table = (x < 10.0) & (x > -20.0) & ((a >= 2.0 ** -60) | (x == 0))   # NaN: none
    if xp.count_nonzero(on_table) == size(x):
        return x * _phi_on_table(x, a), None
    out = _phi_on_table(xp.where(on_table, x, 0.0), xp.where(on_table, a, 0.0))
    out *= x
    outside = ~on_table
    out[outside] = _gelu_outside(x[outside])
    return out, outside


def _phi_on_table(x, a):
    """Phi(x) for x with every |x| <= 20 (the callers put 0 in place of the others), a = |x|:
    Q(a) for x < 0, 1 - Q(a) otherwise (by the backend's fused ``normal_tail`` where it
    offers one)."""
    kernel = fused("normal_tail")
    if kernel is not None:
        return kernel(x, _gelu_table(name()))[0]
    q = gelu_tail_q(a)
    return xp.where(x < 0, q, 1.0 - q)


def _gelu_outside(x):
    """gelu of the x off the table path (module doc): x >= 10 rounded to odd below x, x <= -20
    as -2**-1000, tiny x by ``_tiny_gelu``, inf, -inf -> DEFAULT_NAN, NaN -> itself."""
    big = x >= 10.0
    out = xp.where(big, round_to_odd(x, xp.where(big, -1.0, 0.0)), -(2.0 ** -1000))
    out = xp.where((xp.abs(x) < 2.0 ** -60) & (x != 0), _tiny_gelu(x), out)
    out = xp.where(x == xp.inf, xp.inf, xp.where(x == -xp.inf, DEFAULT_NAN, out))
    return xp.where(xp.isnan(x), x, out)


def _tiny_gelu(x):
    """gelu(x) for 0 < |x| < 2**-60, rounded to odd: the value x/2 + x*x/sqrt(2 pi) - ... lies
    just above x/2, closer to it than any float64 spacing there (x*x/sqrt(2 pi) < 2**-61 |x|),
    so its rounding to odd is that of x/2 nudged up: h = fl(x/2) with the residual x - 2h
    (exact; nonzero only for an odd subnormal x, whose half is a float64 tie) or +1."""
    h = x * 0.5
    with xp.errstate(invalid="ignore"):      # inf - inf where x is infinite (not used there)
        r = x - 2.0 * h
    return round_to_odd(h, xp.where(r == 0, 1.0, r))


def normal_cdf(x):
    """Phi(x) of float64 x within 7u (x < 0) or 4u (x >= 0; 1 for x > 20); NaN -> NaN."""
    x = xp.asarray(x, xp.float64)
    a = xp.abs(x)
    on_table = a <= 20.0                             # NaN: not
    if xp.count_nonzero(on_table) == size(x):
        return _phi_on_table(x, a)
    phi = _phi_on_table(xp.where(on_table, x, 0.0), xp.where(on_table, a, 0.0))
    return _cdf_outside(x, phi, on_table)


def _cdf_outside(x, out, on_table):
    """``out`` with Phi of the x off the table (|x| > 20 or NaN): 0, 1, or x's NaN."""
    out = xp.where(on_table, out, xp.where(x < -20.0, 0.0, 1.0))
    return xp.where(xp.isnan(x), x, out)


def normal_pdf(x):
    """exp(-x*x/2) / sqrt(2 pi) of float64 x within 5u (x*x/2 rounds once for |x| beyond float32
    values); 0 for |x| = inf."""
    x = xp.asarray(x, xp.float64)
    return exp(-(x * x) * 0.5) * INV_SQRT_2PI


def normal_cdf_pdf(x):
    """(``normal_cdf(x)``, ``normal_pdf(x)``), their bits from one exp: Q(|x|) is
    exp(-a*a/2) M(a), and a*a is x*x (GELU's gradient takes both). Chunk by chunk beyond
    ``tuning().correctly_rounded_chunk`` elements, the chunk ``correctly_rounded`` evaluates
    in (the float64 temporaries stay in cache: a 2**20-element gradient 25% faster), except
    where the backend offers a fused ``normal_tail``: it keeps no temporaries, and chunks of
    it were slower (2**18 elements: 1.9 ms in chunks, 1.7 ms whole)."""
    x = xp.asarray(x, xp.float64)
    kernel = fused("normal_tail")
    if kernel is not None:
        return _normal_cdf_pdf_fused(x, kernel)
    chunk = tuning().correctly_rounded_chunk
    if size(x) <= chunk:
        return _normal_cdf_pdf(x)
    flat = xp.reshape(x, (-1,))
    cdf, pdf = xp.empty(flat.shape, xp.float64), xp.empty(flat.shape, xp.float64)
    for i in range(0, size(flat), chunk):
        part = slice(i, i + chunk)
        cdf[part], pdf[part] = _normal_cdf_pdf(flat[part])
    return xp.reshape(cdf, x.shape), xp.reshape(pdf, x.shape)


def _normal_cdf_pdf(x):
    a = xp.abs(x)
    gauss = exp(-(x * x) * 0.5)
    on_table = a <= 20.0
    all_on = xp.count_nonzero(on_table) == size(x)
    q = _mills_series(a if all_on else xp.where(on_table, a, 0.0))
    q *= gauss
    cdf = xp.where(x < 0, q, 1.0 - q)
    return (cdf if all_on else _cdf_outside(x, cdf, on_table)), gauss * INV_SQRT_2PI


def _normal_cdf_pdf_fused(x, kernel):
    """``_normal_cdf_pdf`` by the fused ``normal_tail``: its Gaussian factor is the pdf's
    exp where every |x| <= 20 (else exp takes all of x: the pdf of |x| > 20 and NaN)."""
    if _all_on_table(x):
        cdf, gauss = kernel(x, _gelu_table(name()))
    else:
        on_table = xp.abs(x) <= 20.0
        cdf = _cdf_outside(x, kernel(xp.where(on_table, x, 0.0), _gelu_table(name()))[0],
                           on_table)
        gauss = exp(-(x * x) * 0.5)
    gauss *= INV_SQRT_2PI
    return cdf, gauss


def _all_on_table(x) -> bool:
    """Whether every |x| <= 20 (no NaN): two reductions, no mask array (max and min return
    NaN where there is one, and compare false)."""
    return size(x) == 0 or bool((xp.max(x) <= 20.0) & (xp.min(x) >= -20.0))
