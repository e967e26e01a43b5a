"""Exact enclosures of softmax, log-softmax and cross-entropy of float rows: the fallback of
``softmax``, for ``correctly_rounded.settle``.

Each ``*_enclosure`` returns ``value(digits) -> (low, high)``: exact ``Fraction`` ends with
low < x < high, or low = high = x where x is exact (a row of one element). Per row x, with
m = max x and j* its first index:

- d_j = x_j - m, exact (``Fraction`` of floats is exact).
- t = sum over j != j* of e**d_j, each term enclosed by a ``Decimal`` exp at digits + 15
  digits (``exp_enclosure``), or, where d_j < -2000, by (0, 10**-868) (e**-2000 < 10**-868):
  no Decimal underflow, and no precision that grows with the row's spread.
- L = log(1 + t) (so log sum_j e**d_j = L), enclosed from t's ends (log1p is increasing)
  with as many more digits as t is small (``_log1p``), or, where t < 10**-(digits + 5), by
  t - t*t/2 < L < t.
- log-softmax_i = d_i - L in (d_i - L_hi, d_i - L_lo); softmax_i = e**d_i / (1 + t) from
  the ends of both (exact where every term is: e**0 = 1, so a row of n equal values gives
  1/n, which can be a format midpoint); cross-entropy: the ends of L_r - d_(r, label) added
  exactly (and divided by N for "mean").

Why enclosures, not a value and a relative error: where t is tiny against d_i (logits far
apart), d_i - L sits closer to d_i than any relative error can tell (d_i may be a format
midpoint, and L as small as e**-60000), and for the dominant class x = -L is negative however
small. The ends are strict: each claimed relative error (10**-(digits + 5)) is 10**5 times
the error of the Decimal operations it covers, and t > 0 (so L > 0) in every row of two or
more finite values. Every Decimal operation runs in ``decimal_ref.context`` (no global state).
"""
from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

from ..backend import to_list
from .decimal_ref import context

__all__ = ["exp_enclosure", "Row", "softmax_enclosure", "log_softmax_enclosure",
           "cross_entropy_enclosure"]

FAR = 2000                          # e**d for d < -FAR enters as the bound (0, FAR_BOUND)
FAR_BOUND = Fraction(1, 10 ** 868)  # e**-2000 = 10**-868.6...


def _claim(digits: int) -> Fraction:
    return Fraction(1, 10 ** (digits + 5))


def _decimal(q: Fraction) -> Decimal:
    """q to the current context's precision (one rounding: relative error 10**(1 - prec))."""
    return Decimal(q.numerator) / Decimal(q.denominator)


def exp_enclosure(a: Fraction, digits: int) -> tuple[Fraction, Fraction]:
    """(lo, hi) with lo < e**a < hi for a <= 0 (the row's x_j - m): (1, 1) at a = 0, exactly;
    (0, 10**-868) below -2000; else relative width 2 10**-(digits + 5): a to digits + 15
    digits is within 2 10**-(digits + 11) absolute, e**a then within 2.1 10**-(digits + 11)
    relative, and the exp rounds once more (10**-(digits + 14))."""
    if a == 0:
        return Fraction(1), Fraction(1)           # exact: a tie with the row's maximum
    if a < -FAR:
        return Fraction(0), FAR_BOUND
    with context(digits + 15):
        q = Fraction(_decimal(Fraction(a)).exp())
    width = q * _claim(digits)
    return q - width, q + width


def _log1p(t: Fraction, digits: int) -> Fraction:
    """log(1 + t) for t >= 0 within 10**-(digits + 10) relative: 1 + t keeps t's first
    digits + 15 digits (the precision grows by about -log10 t), and ln rounds once."""
    if t == 0:
        return Fraction(0)
    tiny = max(0, len(str(t.denominator)) - len(str(t.numerator)) + 1)   # ~ -log10 t
    with context(digits + 15 + tiny):
        return Fraction((1 + _decimal(t)).ln())


class Row:
    """One row's exact pieces, computed once per precision and shared by its elements (a row
    of n undecided elements costs n terms per precision, not n * n)."""

    def __init__(self, values):
        self.xs = to_list(values)                # host floats, exact: the row's one transfer
        self._sums: dict[int, tuple] = {}
        self._logs: dict[int, tuple] = {}

    def sums(self, digits: int):
        """(d, t_lo, t_hi): d_j = x_j - m exact, and t = sum over j != j* of e**d_j with
        t_lo < t < t_hi, or t_lo = t = t_hi where every term is exact (d_j = 0: ties with
        the maximum; none: a row of one value). A -inf value (an fp16 logit that overflowed
        downwards) has d_j = None and adds e**-inf = 0 exactly; the row's maximum is finite
        (rows with +inf or NaN, or of -inf only, give inf or NaN, never asked here)."""
        if digits not in self._sums:
            m = max(self.xs)
            top = self.xs.index(m)
            d = [None if v == -math.inf else Fraction(v) - Fraction(m) for v in self.xs]
            t_lo = t_hi = Fraction(0)
            for j, dj in enumerate(d):
                if j != top and dj is not None:
                    lo, hi = exp_enclosure(dj, digits)
                    t_lo, t_hi = t_lo + lo, t_hi + hi
            self._sums[digits] = d, t_lo, t_hi
        return self._sums[digits]

    def logs(self, digits: int):
        """(d, L_lo, L_hi): L = log sum_j e**d_j with L_lo < L < L_hi (L_lo = L_hi = 0 for a
        row of one value, where L = 0 exactly)."""
        if digits not in self._logs:
            d, t_lo, t_hi = self.sums(digits)
            claim = _claim(digits)
            if t_hi == 0:
                ends = Fraction(0), Fraction(0)
            elif t_hi < claim:      # t - t*t/2 < log(1 + t) < t for t > 0: no Decimal log
                ends = t_lo - t_lo * t_lo / 2, t_hi
            else:
                ends = _log1p(t_lo, digits) * (1 - claim), _log1p(t_hi, digits) * (1 + claim)
            self._logs[digits] = (d, *ends)
        return self._logs[digits]


def log_softmax_enclosure(row: Row, i: int):
    def value(digits):
        d, low, high = row.logs(digits)
        return d[i] - high, d[i] - low
    return value


def softmax_enclosure(row: Row, i: int):
    """e**d_i / (1 + t), from the ends of both: exact (a point) where every term is, as in a
    row of equal values (1/n, which can be a format midpoint: 2**-10 for e4m3fn)."""
    def value(digits):
        d, t_lo, t_hi = row.sums(digits)
        if d[i] is None:                     # e**-inf: exactly 0
            return Fraction(0), Fraction(0)
        e_lo, e_hi = exp_enclosure(d[i], digits)
        return e_lo / (1 + t_hi), e_hi / (1 + t_lo)
    return value


def cross_entropy_enclosure(rows: list[Row], labels: list[int], reduction: str):
    """Loss -log-softmax_(r, label_r) of each row, added ("sum", or "none" for one row) or
    averaged ("mean")."""
    def value(digits):
        low = high = Fraction(0)
        for row, label in zip(rows, labels):
            d, l_lo, l_hi = row.logs(digits)
            low, high = low + l_lo - d[label], high + l_hi - d[label]
        if reduction == "mean":
            low, high = low / len(rows), high / len(rows)
        return low, high
    return value
