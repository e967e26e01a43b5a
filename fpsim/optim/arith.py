"""Optimizer arithmetic in a chosen format, one rounding per operation, fused where real
kernels fuse.

Every operation rounds its exact result once to the format (round to nearest, ties to even).
Fused multiply-add, ``fma(a, b, c) = round(a * b + c)``, rounds once: that is what PyTorch's
CPU kernels do (``Vectorized::fmadd`` in ``add(x, alpha=a)``, ``lerp``, ``addcmul``; checked
bit for bit on an AVX-512 machine) and what CUDA compilers emit for ``a * b + c``.

How the float64 intermediate stays exact:
- ``add``/``mul``/``div``/``sqrt``: the float64 result rounded again to a format of at most 24
  bits is the correctly rounded result (double rounding is innocuous when 53 >= 2p + 2;
  Figueroa 1995). For fp32 the native float32 NumPy operation is used directly.
- ``fma``: a*b is exact in float64 (two <= 24-bit significands); the sum is formed with
  TwoSum and rounded to odd (Boldo & Melquiond 2008), and rounding to odd at 53 bits then to
  p <= 51 bits is the correctly rounded result.

>>> import numpy as np
>>> ops = Arith("fp32")
>>> a, b, c = np.float32([1 + 2**-23]), np.float32([1 - 2**-23]), np.float32([-1.0])
>>> float(ops.fma(a, b, c)[0]) == -2.0**-46, float(ops.add(ops.mul(a, b), c)[0])
(True, 0.0)
"""
from __future__ import annotations

from ..backend import xp

from ..formats import FP32, Format, get
from ..exact.odd import add_round_to_odd
from ..backend import round_to

__all__ = ["Arith", "fma_round_to_odd"]


def fma_round_to_odd(a, b, c) -> xp.ndarray:
    """a * b + c for float32-representable inputs, rounded to odd at float64 precision."""
    with xp.errstate(over="ignore", invalid="ignore"):
        product = xp.asarray(a, xp.float64) * xp.asarray(b, xp.float64)   # exact
    return add_round_to_odd(product, xp.asarray(c, xp.float64))


class Arith:
    """Elementwise operations rounded to ``fmt``; arrays in, float32 arrays out."""

    def __init__(self, fmt: "Format | str" = FP32):
        self.fmt = get(fmt)
        self.native = self.fmt == FP32

    def round(self, x) -> xp.ndarray:
        x = xp.asarray(x)
        if self.native and x.dtype == xp.float32:
            return x
        if self.native and x.dtype == xp.float64:   # the IEEE cast is round_to's fp32 rounding
            with xp.errstate(over="ignore", invalid="ignore"):
                y = x.astype(xp.float32)
            if y.size == 0 or not xp.isnan(y.min()):   # NaN payloads: round_to's rule below
                return y
        with xp.errstate(over="ignore", invalid="ignore"):
            return round_to(x.astype(xp.float64, copy=False), self.fmt).astype(xp.float32)

    def scalar(self, value: float) -> xp.float32:
        """A Python scalar as the kernels see it: rounded once to the format."""
        return xp.float32(round_to(float(value), self.fmt))

    def _binary(self, op, a, b) -> xp.ndarray:
        with xp.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            if self.native:
                return op(xp.asarray(a, xp.float32), xp.asarray(b, xp.float32))
            return self.round(op(xp.asarray(a, xp.float64), xp.asarray(b, xp.float64)))

    def add(self, a, b):
        return self._binary(xp.add, a, b)

    def sub(self, a, b):
        return self._binary(xp.subtract, a, b)

    def mul(self, a, b):
        return self._binary(xp.multiply, a, b)

    def div(self, a, b):
        return self._binary(xp.divide, a, b)

    def sqrt(self, a):
        with xp.errstate(invalid="ignore"):
            if self.native:
                return xp.sqrt(xp.asarray(a, xp.float32))
            return self.round(xp.sqrt(xp.asarray(a, xp.float64)))

    def fma(self, a, b, c):
        """round(a * b + c), one rounding.

        Fast path: t = a*b + c in float64 (the product is exact) rounds once more to the
        same value as the exact sum unless t is a midpoint of the format's grid (or its
        overflow threshold); every such point has its float64 significand's low
        51 - man_bits bits zero, so only elements with that pattern, rare on real data,
        take the round-to-odd sum."""
        a64, b64, c64 = xp.broadcast_arrays(xp.asarray(a, xp.float64), xp.asarray(b, xp.float64),
                                            xp.asarray(c, xp.float64))
        with xp.errstate(over="ignore", invalid="ignore"):
            total = xp.asarray(a64 * b64 + c64, xp.float64)
        mask = xp.uint64((1 << (51 - self.fmt.man_bits)) - 1)
        # inf and NaN stay as the full-array sum made them (the reference returns that sum
        # too; recomputing a subarray may give a NaN another sign bit)
        suspect = ((total.view(xp.uint64) & mask) == 0) & xp.isfinite(total)
        if suspect.any():
            total[suspect] = fma_round_to_odd(a64[suspect], b64[suspect], c64[suspect])
        return self.round(total)

    def lerp(self, start, end, weight: float):
        """PyTorch's ``start.lerp_(end, weight)``: ``fma(w, end - start, start)`` for w < 0.5,
        ``fma(-(end - start), 1 - w, end)`` otherwise, with w and 1 - w in the format."""
        w = self.scalar(weight)
        diff = self.sub(end, start)
        if w < 0.5:
            return self.fma(w, diff, start)
        return self.fma(-diff, self.sub(xp.float32(1.0), w), end)
