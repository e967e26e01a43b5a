"""Exact row sums rounded to odd from Fractions, and rows padded into one array: the oracle and
the inputs of the row-sum tests (``test_sums_certificate.py``, ``test_fused_sums.py``)."""
from __future__ import annotations

from fractions import Fraction

import numpy as np


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
