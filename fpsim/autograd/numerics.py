"""Where the engine rounds: one rounding into a format, format inclusion, promotion.

Every rounding the engine does goes through ``round_array``: values in a float32 or float64
array, rounded once (to nearest, ties to even) to a format, returned in the format's container.

The float64 reference mode
--------------------------
``FP64`` is not an fpsim ``Format`` (no float64 value fits a float32 container); it marks the
*reference mode* the finite-difference tests use: data lives in float64 arrays and no rounding
happens at all beyond float64's own. It exists to check the calculus of every backward formula,
not to simulate any hardware.

>>> import numpy as np
>>> from fpsim.formats import FP16, BF16, FP32
>>> round_array(np.array([0.1, 70000.0, 2.0 ** -26]), FP16)
array([0.09997559,        inf, 0.        ], dtype=float32)
>>> widest(FP16, FP32).name, widest(FP16, BF16).name, contains(FP32, BF16)
('fp32', 'fp32', True)
"""
from __future__ import annotations

from functools import lru_cache

from ..backend import xp

from .. import backend
from ..exact import observers
from ..formats import FP32, Format, get
from ..backend import round_to

__all__ = ["FP64", "Float64Reference", "resolve", "round_array", "contains", "widest",
           "container_of"]


class Float64Reference:
    """The float64 reference "format": no rounding, float64 containers (see module doc)."""

    name = "fp64"
    precision = 53

    def __repr__(self) -> str:
        return "FP64"

    def __str__(self) -> str:
        return "fp64"

    def __reduce__(self):
        return "FP64"


FP64 = Float64Reference()


def resolve(fmt) -> "Format | Float64Reference":
    """A ``Format``, a format name, or ``FP64`` / ``"fp64"`` / ``"float64"``."""
    if fmt is FP64 or (isinstance(fmt, str) and fmt.strip().lower() in ("fp64", "float64",
                                                                           "double")):
        return FP64
    return get(fmt)


def container_of(fmt):
    return xp.float64 if fmt is FP64 else backend.CONTAINER


def round_array(x, fmt):
    """``x`` (float32 or float64 array) rounded once to ``fmt``, in ``fmt``'s container.

    Fast paths that give the same bits as ``round_to``: FP32 from float32 is the identity and
    from float64 is the IEEE cast (``round_to`` itself takes NumPy's float16 cast for small
    fp16 roundings). The tests compare every path with ``round_to``. Each rounding is
    reported to the observers (``fpsim.exact.observers.rounded``: the underflow counts).
    """
    if fmt is FP64:
        return backend.astype(x, xp.float64, copy=False)
    if x.dtype == xp.float32:
        if fmt is FP32 or fmt == FP32:
            return x
    elif x.dtype == xp.float64:
        if fmt is FP32 or fmt == FP32:
            with xp.errstate(over="ignore"):
                out = backend.astype(x, xp.float32)
            observers.rounded(x, out)
            return out
    else:
        raise TypeError(f"round_array takes float32/float64 arrays, got {x.dtype}")
    out = round_to(x, fmt)
    out = out if out.dtype == xp.float32 else backend.astype(out, xp.float32)
    observers.rounded(x, out)
    return out


@lru_cache(maxsize=None)
def contains(big, small) -> bool:
    """Whether every value of ``small`` is a value of ``big`` (so widening needs no rounding).

    Overflow rules (``saturate``) do not matter for the values themselves; subnormal flushing
    does: a format that flushes holds no subnormals.
    """
    if big is FP64:
        return True
    if small is FP64:
        return False
    if big == small:
        return True
    lowest_small = small.smallest_subnormal if small.subnormals else small.min_normal
    lowest_big = big.smallest_subnormal if big.subnormals else big.min_normal
    if not big.subnormals and small.subnormals and small.smallest_subnormal < big.min_normal:
        return False
    return (small.man_bits <= big.man_bits and small.max_finite <= big.max_finite
            and lowest_small >= lowest_big
            and small.emin - small.man_bits >= big.emin - big.man_bits
            and (small.has_negative_zero <= big.has_negative_zero))


@lru_cache(maxsize=None)
def _widest_pair(a, b):
    if contains(a, b):
        return a
    if contains(b, a):
        return b
    return FP64 if FP64 in (a, b) else FP32  # like torch: float16 with bfloat16 gives float32


def widest(*fmts):
    """The narrowest of ``fmts`` that holds all the others, or FP32 when none does (every
    format fits FP32; FP64 holds everything). This is the "promote" rule of elementwise ops."""
    result = fmts[0]
    for fmt in fmts[1:]:
        if fmt is not result:
            result = _widest_pair(result, fmt)
    return result
