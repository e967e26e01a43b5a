"""High-precision reference values in Python's ``decimal``: the fallback of ``correctly_rounded``.

Each ``d*`` function takes a float (converted exactly: ``Decimal.from_float``) and a
precision of ``digits`` significant decimal digits and returns ``(r, eta)``: a Decimal ``r``
with ``|r - exact| <= eta * |r|``. ``Decimal.exp`` and ``Decimal.ln`` are correctly rounded at
the context precision; the composite ones work with 10 guard digits more than the cancellation
they meet (1 - e**(-2a) for small a; 1/2 - Phi0(a) for the normal tail) and claim ``eta`` =
10**(5 - digits), far above the few-ulp error of their few hundred roundings.

Every operation runs in a context of its own (``context``): ties-to-even, the widest exponent
range, the default traps, nothing read from the caller's ``decimal`` context, so no global
setting (precision, rounding mode, traps, exponent limits) changes a result. The inputs enter
exactly: ``Decimal.from_float``, ``copy_abs`` and ``copy_negate`` are exact and read no
context (unary minus and ``abs()`` round to one, and the constructor ``Decimal(float)``
signals ``FloatOperation`` to the caller's, which may trap it).
"""
from __future__ import annotations

from decimal import (MAX_EMAX, MIN_EMIN, ROUND_HALF_EVEN, Context, Decimal, DivisionByZero,
                     InvalidOperation, Overflow, localcontext)
from fractions import Fraction

__all__ = ["context", "dexp", "dln", "dtanh", "dsigmoid", "dsilu", "dgelu", "dgelu_tanh",
           "dnormal_tail", "dpi", "mills_taylor"]


def context(digits: int):
    """``with context(digits) as ctx:`` a local ``decimal`` context built afresh, never copied
    from the caller's: ``digits`` significant digits, round half even, the widest exponent
    range, traps on invalid operations, division by zero and overflow (the defaults)."""
    return localcontext(Context(prec=digits, rounding=ROUND_HALF_EVEN, Emin=MIN_EMIN,
                                Emax=MAX_EMAX, clamp=0, flags=[],
                                traps=[InvalidOperation, DivisionByZero, Overflow]))


def dpi(digits: int) -> Decimal:
    """pi to ``digits`` digits (the series recipe of the ``decimal`` documentation)."""
    with context(digits + 5):
        lasts, t, s, n, na, d, da = Decimal(0), Decimal(3), Decimal(3), 1, 0, 0, 24
        while s != lasts:
            lasts = s
            n, na = n + na, na + 8
            d, da = d + da, da + 32
            t = (t * n) / d
            s += t
    with context(digits):
        return +s


def _eta(digits: int) -> Decimal:
    """10**(5 - digits), the relative error every ``d*`` value claims at ``digits`` digits
    (built by the constructor: exact, no context)."""
    return Decimal(f"1e{5 - digits}")


def dexp(x: float, digits: int):
    with context(digits):
        return Decimal.from_float(x).exp(), _eta(digits)


def dln(x: float, digits: int):
    with context(digits):
        return Decimal.from_float(x).ln(), _eta(digits)


def _small_extra(a: Decimal) -> int:
    """Digits lost to cancellation in 1 - e**(-2a) (about -log10 a for small a)."""
    return max(0, -a.adjusted()) + 2 if a else 0


def dtanh(x: float, digits: int):
    a = Decimal.from_float(x).copy_abs()     # exact (abs() would round to a context)
    with context(digits + 10 + _small_extra(a)):
        e = (-2 * a).exp()
        t = (1 - e) / (1 + e)
    return (t if x >= 0 else t.copy_negate()), _eta(digits)


def dsigmoid(x: float, digits: int):
    with context(digits + 10):
        return 1 / (1 + Decimal.from_float(x).copy_negate().exp()), _eta(digits)


def dsilu(x: float, digits: int):
    """x sigmoid(x): the exact x times ``dsigmoid``'s value, at 10 more digits (one more
    rounding of relative 10**(-digits - 9), far inside the claimed eta)."""
    s, eta = dsigmoid(x, digits)
    with context(digits + 10):
        return Decimal.from_float(x) * s, eta


def dnormal_tail(a, digits: int) -> Decimal:
    """Q(a) = P(N(0,1) > a) for Decimal or float a >= 0: 1/2 - phi(a) sum a^(2n+1)/(2n+1)!!,
    positive terms, with the ~a*a/4.6 digits that the subtraction cancels added as guard."""
    a = a if isinstance(a, Decimal) else Decimal.from_float(a)
    if not a:
        return Decimal("0.5")
    guard = int(Fraction(a) ** 2 * 10 / 46)   # exact: no context involved
    with context(digits + 10 + guard + _small_extra(a)) as ctx:
        a2 = a * a
        term, total, n = a, a, 0
        while True:
            n += 1
            term = term * a2 / (2 * n + 1)
            total += term
            if n > a2 and term <= total * Decimal(10) ** (-ctx.prec - 2):
                break
        phi = (-a2 / 2).exp() / (2 * dpi(ctx.prec)).sqrt()
        return Decimal("0.5") - phi * total


def dgelu(x: float, digits: int):
    """x Phi(x); meant for |x| <= 40 (the float64 path settles the rest)."""
    q = dnormal_tail(abs(x), digits)
    with context(digits + 10):
        value = Decimal.from_float(x) * (q if x < 0 else 1 - q)
    return value, _eta(digits)


def dgelu_tanh(x: float, digits: int):
    """x sigmoid(2 sqrt(2/pi) (x + 0.044715 x**3)), PyTorch's tanh GELU with the real
    constants; meant for -300 < y < 40 (the float64 path settles the rest). No step cancels
    (x and 0.044715 x**3 have one sign; 1 + e**-y > 1); the sigmoid multiplies y's relative
    error by |y| < 300, covered by the 15 guard digits."""
    with context(digits + 15):
        d = Decimal.from_float(x)
        y = 2 * (2 / dpi(digits + 15)).sqrt() * (d + Decimal("0.044715") * d * d * d)
        value = d / (1 + (-y).exp())
    return value, _eta(digits)


def mills_taylor(c: float, terms: int, radius: float, digits: int = 120):
    """Taylor coefficients m_0..m_{terms-1} of M(a) = Q(a) e^(a*a/2) around c, from
    M' = a M - 1/sqrt(2 pi): (n+1) m_{n+1} = c m_n + m_{n-1} - [n = 0]/sqrt(2 pi).

    The recurrence amplifies m_0's error by up to e^(c*c/2)-ish factors, hence 120 digits. Raises
    if the first omitted term, times ``radius``**terms, exceeds 2**-58 of m_0."""
    with context(digits):
        cd = Decimal.from_float(c)
        kappa = 1 / (2 * dpi(digits)).sqrt()
        m = [dnormal_tail(cd, digits) * (cd * cd / 2).exp()]
        prev = Decimal(0)
        for n in range(terms):
            nxt = (cd * m[n] + prev - (kappa if n == 0 else 0)) / (n + 1)
            prev = m[n]
            m.append(nxt)
        tail = abs(m[terms]) * Decimal.from_float(radius) ** terms
        if tail > abs(m[0]) * Decimal(2) ** -58:
            raise ArithmeticError(f"Taylor series of M at {c} needs more than {terms} terms")
        return m[:terms]
