"""Optimizer arithmetic in a chosen format, one rounding per operation, fused where real
kernels fuse.

Every operation rounds its exact result once to the format (round to nearest, ties to even).
Fused multiply-add, ``fma(a, b, c) = round(a * b + c)``, rounds once: that is what PyTorch's
CPU kernels do (``Vectorized::fmadd`` in ``add(x, alpha=a)``, ``lerp``, ``addcmul``; checked
bit for bit on an AVX-512 machine) and what CUDA compilers emit for ``a * b + c``.

How the float64 intermediate stays exact (operands are float32 values, e.g. fp32 gradients
under a bf16 or fp16 ``Arith``: not always values of the format itself). For fp32 the native
float32 NumPy operation is used directly; otherwise:
- ``mul``: the float64 product of two float32 values is exact, then rounded once.
- ``add``/``sub``: the float64 sum of two float32 values may be inexact (exponents far
  apart) and rounding it again could round twice; as in ``fma``, where it is a midpoint of
  the format's grid it is replaced by the sum rounded to odd (``add_round_to_odd``).
- ``div``/``sqrt``: a quotient or root of float32 values that is not itself a midpoint of a
  format of at most 24 bits lies farther than 2**-51 (relative) from every midpoint, beyond
  float64's half ulp 2**-53, so the float64 result lies on the same side of every midpoint
  and rounds to the format like the exact one.
- ``fma``: a*b is exact in float64 (two <= 24-bit significands); the sum is formed with
  TwoSum and rounded to odd (Boldo & Melquiond 2008), and rounding to odd at 53 bits then to
  p <= 51 bits is the correctly rounded result. ``fma`` reaches those bits faster (its
  docstring says how), ``fma_round_to_odd`` is the formulation itself.

>>> import numpy as np
>>> ops = Arith("fp32")
>>> a, b, c = np.float32([1 + 2**-23]), np.float32([1 - 2**-23]), np.float32([-1.0])
>>> float(ops.fma(a, b, c)[0]) == -2.0**-46, float(ops.add(ops.mul(a, b), c)[0])
(True, 0.0)
"""
from __future__ import annotations

import math
from functools import lru_cache

from ..backend import astype, bitcast, name, round_to, scalar, scratch, size, tuning, xp
from ..exact.odd_rounding import add_round_to_odd
from ..formats import FP32, Format, get

__all__ = ["Arith", "fma_round_to_odd"]


def fma_round_to_odd(a, b, c) -> xp.ndarray:
    """a * b + c for float32-representable inputs, rounded to odd at float64 precision."""
    with xp.errstate(over="ignore", invalid="ignore"):
        product = xp.asarray(a, xp.float64) * xp.asarray(b, xp.float64)   # exact
    return add_round_to_odd(product, xp.asarray(c, xp.float64))


@lru_cache(maxsize=4096)
def _format_scalar(backend_name: str, fmt: Format, value: float, sign: float):
    # ``sign`` keeps 0.0 and -0.0 apart (they are equal, so they would share a cache entry);
    # ``backend_name``: a scalar belongs to the backend that made it
    if fmt == FP32 and not math.isnan(value):
        with xp.errstate(over="ignore"):
            return scalar(value, xp.float32)   # the IEEE cast is round_to's fp32 rounding
    return scalar(float(round_to(value, fmt)), xp.float32)


class Arith:
    """Elementwise operations rounded to ``fmt``; arrays in, float32 arrays out."""

    def __init__(self, fmt: "Format | str" = FP32):
        self.fmt = get(fmt)
        self.native = self.fmt == FP32
        # a float64 value at a midpoint of the format's grid has its low 51 - man_bits
        # significand bits zero, one on its grid (normal range) also the next (see ``fma``);
        # the bit patterns are read as int64 (the masks are positive; torch counts and
        # compares signed integers only)
        self._low_bits = scalar((1 << (51 - self.fmt.man_bits)) - 1, xp.int64)
        self._grid_bits = scalar((1 << (52 - self.fmt.man_bits)) - 1, xp.int64)

    def round(self, x) -> xp.ndarray:
        x = xp.asarray(x)
        if self.native and x.dtype == xp.float32:
            return x
        out = xp.empty(x.shape, xp.float32)
        with xp.errstate(over="ignore", invalid="ignore"):
            self._round_into(x, out)
        return out

    def _round_into(self, x, out) -> None:
        """``out[...] = round(x)``: x float32 or float64, out a float32 array of x's shape."""
        if self.native and x.dtype == xp.float64:
            # the IEEE cast is round_to's fp32 rounding, except for NaN payloads
            xp.copyto(out, x, casting="same_kind")
            if size(out) == 0 or not math.isnan(xp.min(out)):
                return
        # the rounded float64 values are the format's, so the cast into float32 is exact
        xp.copyto(out, round_to(astype(x, xp.float64, copy=False), self.fmt), casting="same_kind")

    def scalar(self, value: float):
        """A Python scalar as the kernels see it: rounded once to the format (a 0-d float32
        value, ``fpsim.backend.scalar``)."""
        value = float(value)
        return _format_scalar(name(), self.fmt, value, math.copysign(1.0, value))

    def _binary(self, op, a, b) -> xp.ndarray:
        with xp.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            if self.native:
                return op(xp.asarray(a, xp.float32), xp.asarray(b, xp.float32))
            return self.round(op(xp.asarray(a, xp.float64), xp.asarray(b, xp.float64)))

    def _sum(self, op, a, b) -> xp.ndarray:
        """round(a + b) or round(a - b), one rounding. The float64 sum of two float32 values
        can be inexact, and rounding it again then rounds twice where it lands on a midpoint
        of the format's grid: there it is replaced by the sum rounded to odd, as in ``fma``
        (a * 1 + b, or b * -1 + a: the product is exact; the IEEE result elsewhere, NaN
        signs included)."""
        if self.native:
            return self._binary(op, a, b)
        a64, b64 = xp.broadcast_arrays(xp.asarray(a, xp.float64), xp.asarray(b, xp.float64))
        shape, a64, b64 = a64.shape, xp.reshape(a64, (-1,)), xp.reshape(b64, (-1,))
        with xp.errstate(over="ignore", invalid="ignore"):
            total = op(a64, b64)
            low = bitcast(total, xp.int64) & self._low_bits
            if xp.count_nonzero(low) < low.shape[0]:
                first, factor, second = (a64, 1.0, b64) if op is xp.add else (b64, -1.0, a64)
                self._settle_ties(first, xp.asarray(factor, xp.float64), second, total,
                                  xp.flatnonzero(low == 0))
        return self.round(xp.reshape(total, shape))

    def add(self, a, b):
        return self._sum(xp.add, a, b)

    def sub(self, a, b):
        return self._sum(xp.subtract, a, b)

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
        """round(a * b + c), one rounding; a, b, c arrays of one broadcast shape, or scalars.

        Fast path: t = a*b + c in float64 (the product is exact) rounds once more to the
        same value as the exact sum unless t is a midpoint of the format's grid (or its
        overflow threshold): no midpoint lies strictly between the exact sum and its nearest
        float64 t, so both fall between the same two midpoints. Every midpoint has its
        float64 significand's low 51 - man_bits bits zero, and in the normal range its next
        bit set; so only elements with that pattern, or below the smallest normal, take the
        round-to-odd sum. The work runs ``fpsim.backend.tuning().arith_chunk`` elements at a
        time in reused float64 arrays (``fpsim.backend.scratch``: in the CPU cache); every
        step is elementwise, so the bits are those of one pass over the whole arrays as long
        as the chunk is a power of two of at least 64: NumPy's loops can give NaN + NaN
        another sign in their tail than in their vector body, and such chunks keep the tail
        where it is."""
        return self._fma(a, b, c, None)

    def fma_counted(self, a, b, c) -> tuple[xp.ndarray, int, int]:
        """(``fma(a, b, c)``, moved, kept): moved counts the elements whose float64 product
        a * b is nonzero (NaN counts), kept those of them whose result equals c. For
        float32-representable a and b the product is exact, so for an update
        ``c + factor * direction`` these are ``Update.moved`` and the optimizer's lost
        updates, counted while each chunk is in cache instead of in three more passes over
        the whole arrays."""
        counts = [0, 0]
        out = self._fma(a, b, c, counts)
        return out, counts[0], counts[1]

    def _fma(self, a, b, c, counts) -> xp.ndarray:
        a, b, c = xp.asarray(a), xp.asarray(b), xp.asarray(c)
        shape = _common_shape(a, b, c)
        out = xp.empty(shape, xp.float32)
        flat_out = xp.reshape(out, (-1,))
        n = flat_out.shape[0]
        chunk = tuning().arith_chunk
        width = min(n, chunk)
        work = scratch("arith.fma", xp.float64, 2 * width)   # the sums, then their low bits
        with xp.errstate(over="ignore", invalid="ignore"):
            a, b, c = _flat(a, shape), _flat(b, shape), _flat(c, shape)
            if n == width:                  # one chunk: the loop's only pass, without it
                self._fma_chunk(a, b, c, flat_out, work[:n], bitcast(work[n:], xp.int64),
                                counts)
                return out
            for lo in range(0, n, chunk):
                part = min(chunk, n - lo)
                hi = lo + part
                self._fma_chunk(a if a.ndim == 0 else a[lo:hi], b if b.ndim == 0 else b[lo:hi],
                                c if c.ndim == 0 else c[lo:hi], flat_out[lo:hi], work[:part],
                                bitcast(work[width:width + part], xp.int64), counts)
        return out

    def _fma_chunk(self, a, b, c, out, total, low, counts) -> None:
        """``out`` = round(a * b + c) for one chunk (0-d operands broadcast); ``total`` and
        ``low`` are work arrays of out's size; ``counts`` (or None): ``fma_counted``'s two
        counts, added to."""
        if a.ndim:                      # total = a, then a * b, in this operand order
            xp.copyto(total, a)
            xp.multiply(total, b, out=total)
        elif b.ndim:
            xp.copyto(total, b)
            xp.multiply(a, total, out=total)
        else:
            total[...] = a * b
        if counts is not None:
            moved = xp.not_equal(total, 0)
            counts[0] += int(xp.count_nonzero(moved))
        xp.add(total, c, out=total)
        xp.bitwise_and(bitcast(total, xp.int64), self._low_bits, out=low)
        if xp.count_nonzero(low) < low.shape[0]:
            self._settle_ties(a, b, c, total, xp.flatnonzero(low == 0))
        self._round_into(total, out)
        if counts is not None:
            # a 0-d c is float64 (``_flat``): compared as NumPy compares them, in float64
            kept = xp.equal(out, c) if c.ndim else xp.equal(xp.asarray(out, xp.float64), c)
            counts[1] += int(xp.count_nonzero(xp.logical_and(moved, kept, out=kept)))

    def _settle_ties(self, a, b, c, total, at) -> None:
        """Replace ``total[at]`` by the round-to-odd sum where it is a midpoint or below the
        smallest normal: at or above it, a grid point (e.g. c itself, where a * b = 0) has one
        more low bit zero and rounds right. inf and NaN stay as the whole sum made them (the
        reference returns that sum too; recomputing an element alone may give a NaN another
        sign bit)."""
        found = total[at]
        tie = (bitcast(found, xp.int64) & self._grid_bits) != 0
        tie |= xp.abs(found) < self.fmt.min_normal
        at = at[tie & xp.isfinite(found)]
        if at.shape[0]:
            total[at] = fma_round_to_odd(a if a.ndim == 0 else a[at], b if b.ndim == 0 else b[at],
                                         c if c.ndim == 0 else c[at])

    def lerp(self, start, end, weight: float):
        """PyTorch's ``start.lerp_(end, weight)``: ``fma(w, end - start, start)`` for w < 0.5,
        ``fma(-(end - start), 1 - w, end)`` otherwise, with w and 1 - w in the format."""
        w = self.scalar(weight)
        diff = self.sub(end, start)
        if w < 0.5:
            return self.fma(w, diff, start)
        return self.fma(-diff, self.sub(scalar(1.0, xp.float32), w), end)


def _common_shape(*arrays) -> tuple:
    shapes = {v.shape for v in arrays if v.ndim}
    if len(shapes) == 1:
        return shapes.pop()
    return xp.broadcast_shapes(*(v.shape for v in arrays))


def _flat(v, shape) -> xp.ndarray:
    """A 0-d operand as float64 (it broadcasts); any other as a flat C-ordered array of
    ``shape``'s size (float32 or float64, as given)."""
    if v.ndim == 0:
        return astype(v, xp.float64)
    if v.dtype not in (xp.float32, xp.float64):
        v = astype(v, xp.float64)
    if v.shape != shape:
        v = xp.broadcast_to(v, shape)
    v = xp.ascontiguousarray(v)
    return v if v.ndim == 1 else xp.reshape(v, (-1,))
