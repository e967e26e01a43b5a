"""Exact row sums rounded to odd from Fractions, and rows padded into one array: the oracle and
the inputs of the row-sum tests (``test_sums_certificate.py``, ``test_fused_sums.py``)."""
from __future__ import annotations

from fractions import Fraction

import numpy as np

P = 2.0                                   # P ** k reads as a power of two below

#: rows that the split, compensated and cascade tiers of the fused row sums all leave to the
#: expansion: three layers of cancelling pairs below a lone tiny term, and cancelling pairs
#: whose errors cancel in the cascade's second error sum too (a cascade that took |t| > |c2|
#: as enough, without c2's error bound, gets these wrong); the last sums to -1.5 * 2**-11
CANCELLING_LAYERS = (
    [1.5 * P ** -21, P ** -8, P ** -154, -1.5 * P ** -21, -P ** -8, 1.5 * P ** -240,
     -P ** -154],
    [1.25 * P ** -36, 1.25 * P ** -121, -1.5 * P ** -200, -P ** -61, -1.25 * P ** -36,
     -1.25 * P ** -121, P ** -61],
    [P ** -87, 1.75 * P ** -165, 1.5 * P ** -263, -1.75 * P ** -165, -P ** -146, -P ** -87,
     P ** -146],
    [-1.5 * P ** -174, 1.5 * P ** -14, -1.5 * P ** -57, 3.0, 1.25 * P ** -110,
     -1.25 * P ** -110, 1.5 * P ** -57, 1.5 * P ** -174, -1.5 * P ** -14],
    [P ** -105, P ** -140, -1.5 * P ** -11, P ** -200, -P ** -84, -P ** -105, -P ** -140,
     P ** -84, -P ** -200],
)


def rodd(row) -> float:
    """The exact sum of ``row`` rounded to odd at 53 bits (normal results), from Fractions."""
    exact = sum((Fraction(float(t)) for t in row), Fraction(0))
    near = float(exact)                                    # nearest even
    if Fraction(near) == exact:
        return near
    other = np.nextafter(near, np.inf if Fraction(near) < exact else -np.inf)
    return near if np.float64(near).view(np.int64) & 1 else float(other)


def rows_of(*rows) -> np.ndarray:
    """float64 rows of different lengths, padded with +0 to the longest."""
    width = max(len(r) for r in rows)
    return np.array([list(r) + [0.0] * (width - len(r)) for r in rows], np.float64)
