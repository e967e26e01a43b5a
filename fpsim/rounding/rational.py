"""Exact rationals (Python ints, ``Fraction``) to float64, rounded to odd: the one step that
lets ``round_to`` and the correctly rounded functions round an exact value once.

Why to odd: a value rounded to odd at float64's 53 bits and then rounded once more, in any
deterministic mode, to a format of at most 51 bits gives the exact value's correct rounding
(Boldo & Melquiond, IEEE Transactions on Computers 57(4), 2008; ``fpsim.exact.odd_rounding`` rounds
float64 sums the same way). Rounding to nearest float64 first instead would round twice:
1 + 2**-11 + 2**-60 becomes 1 + 2**-11, an fp16 tie that goes to 1.

>>> from fractions import Fraction
>>> float64_round_to_odd(1 + Fraction(1, 2**11) + Fraction(1, 2**60)) == 1 + 2**-11 + 2**-52
True
>>> float64_round_to_odd(Fraction(3, 4)), float64_round_to_odd(-10**400)
(0.75, -1.7976931348623157e+308)
>>> float64_round_to_odd(0, side=-1), float64_round_to_odd(0.75, side=1) == 0.75 + 2**-53
(-5e-324, True)
"""
from __future__ import annotations

import math
import struct
import sys
from fractions import Fraction
from numbers import Rational

__all__ = ["float64_round_to_odd"]


def float64_round_to_odd(value: Rational, side: int = 0) -> float:
    """``value`` itself when float64 holds it, else whichever of the two float64 around it
    has an odd last bit; beyond the largest float64, the largest (its last bit is odd) of
    the value's sign. ``side`` +1 or -1: the same for the numbers just above or just below
    ``value`` (what an open interval ending there rounds to, near that end)."""
    q = Fraction(value)
    try:
        near = float(q)          # the nearest float64 (CPython divides integers correctly)
    except OverflowError:        # past the largest float64 by more than half its spacing
        return sys.float_info.max if q > 0 else -sys.float_info.max
    if q == near:
        if side == 0 or _odd(near) or math.isinf(math.nextafter(near, side * math.inf)):
            return near
        return math.nextafter(near, side * math.inf)
    other = math.nextafter(near, math.inf if q > near else -math.inf)
    if math.isinf(other):        # between the largest float64 and the overflow threshold
        return near
    return near if _odd(near) else other


def _odd(x: float) -> bool:
    """Whether the last bit of float64 x's significand is 1 (subnormals included)."""
    return bool(struct.unpack("<Q", struct.pack("<d", x))[0] & 1)
