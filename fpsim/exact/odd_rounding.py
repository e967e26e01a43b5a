"""Rounding to odd at float64's 53 bits, written once for every exact path.

Why: a value rounded to odd at 53 bits and then rounded once more, in any rounding mode, to
a format of at most 51 bits gives the correctly rounded exact value: no double rounding
(Boldo & Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms using
rounding to odd", IEEE Transactions on Computers 57(4), 2008). Round to odd keeps an exact
value and otherwise takes, of the two float64 neighbours of x, the one with an odd last bit.

Users: the integer-limb sums (``sums``: the truncated 53 bits and a sticky flag), the
``sequential`` model's additions and the optimizers' fused multiply-add (``add_round_to_odd``).

>>> import numpy as np
>>> x, y = np.float64([1.0, 1.0, 3.0]), np.float64([2.0 ** -60, -(2.0 ** -60), 0.5])
>>> add_round_to_odd(x, y).tolist() == [1 + 2.0 ** -52, 1 - 2.0 ** -53, 3.5]
True
"""
from __future__ import annotations

from ..backend import astype, bitcast, xp

__all__ = ["round_to_odd", "add_round_to_odd"]


def round_to_odd(near, residual) -> xp.ndarray:
    """x rounded to odd at 53 bits, given ``near``, one of the two float64 neighbours of x (or
    x itself when it is a float64), and ``residual``, any number with the sign of x - near
    that is zero exactly when near == x. Non-finite ``near`` values are returned unchanged.

    The neighbour toward zero is x truncated to 53 bits; setting its last bit (the sticky
    bit) when x is inexact gives the odd neighbour, or keeps it when it already is odd.
    The pattern is read as int64 (two's complement: the same bits as unsigned arithmetic;
    torch has no arithmetic on unsigned integers).
    """
    near = xp.asarray(near, xp.float64)
    with xp.errstate(invalid="ignore"):
        inexact = (residual != 0) & xp.isfinite(near)
    if not xp.any(inexact):     # (NumPy stops at the first inexact element: arrays are large)
        return near
    # a fresh pattern array (near itself is not written)
    pattern = bitcast(near, xp.int64) - astype(
        inexact & (xp.signbit(residual) != xp.signbit(near)), xp.int64)
    pattern |= astype(inexact, xp.int64)
    return bitcast(pattern, xp.float64)


def add_round_to_odd(x, y) -> xp.ndarray:
    """x + y (float64, exact inputs) rounded to odd: the sum s and its rounding error e
    (s + e == x + y exactly, Knuth's TwoSum) give the residual's sign. Non-finite sums are
    returned as IEEE addition gives them."""
    with xp.errstate(over="ignore", invalid="ignore"):
        s = xp.add(x, y)
        y_virtual = s - x
        error = (x - (s - y_virtual)) + (y - y_virtual)
    return round_to_odd(s, error)
