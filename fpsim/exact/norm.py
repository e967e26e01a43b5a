"""The exact global L2 norm in fp32, with a certified float64 fast path.

The value is ``fp32(sqrt(S))`` correctly rounded, ``S`` the exact sum of the squares (a
float32 value squared is exact in float64: 48 significant bits, exponent within range), with
``round_to``'s fp32 rounding (ties to even, subnormals, overflow to inf).

How, exactly: ``s = rodd53(S)`` (the exact sum rounded to odd at 53 bits) decides it. The
fp32 result changes only at a midpoint m (25 bits) between fp32 values; m*m has at most 50
significant bits, so it is a float64 whose 53-bit last bit is even, and round to odd never
moves S onto or across such a value: sqrt(s) and sqrt(S) lie on the same side of every m.
``_fp32_sqrt(s)`` is then fp32(sqrt(s)) correctly rounded: r = sqrt(s) rounded to float64
(one rounding, monotonic, every midpoint is a float64) rounds to fp32 like sqrt(s) unless r
is itself a midpoint; then r*r is exact in float64 and its comparison with s settles it
(rounding r to fp32 directly would round twice).

Fast path: ``s`` = the float64 sum of the squares in any order: ``tuning().norm_chunk``
elements at a time
are widened into a reused float64 array and dotted with themselves (``matmul``, BLAS on the
CPU: any order, with or without fused multiply-adds, since every product is exact), and the
partial sums are added. All terms are non-negative, so whatever the order,
|s - S| <= (n - 1) u S / (1 - (n - 1) u) with u = 2**-53 (Higham, Accuracy and Stability of
Numerical Algorithms, 2nd ed., eq. 4.4); additions that land in the subnormal range are
exact, so underflow adds nothing. ``[lo, hi] = s (1 -+ 2 n u)``,
widened by one float64 step each way, therefore encloses S for n u < 1/4. The map
S -> fp32(sqrt(S)) is non-decreasing, so when lo and hi give the same fp32 value, S gives it
too, and that is returned. Otherwise (S lies within about n u of a point where the fp32
result changes) the exact round-to-odd sum decides, so the result is the reference's bits in
every case, on every machine.
"""
from __future__ import annotations

import math

from ..backend import astype, scalar, scratch, size, tuning, xp
from .sums import round_to_odd_sum

__all__ = ["global_norm", "exact_global_norm"]

_U = 2.0 ** -53


def _fp32_sqrt(value: float) -> xp.float32:
    """fp32(sqrt(value)) correctly rounded, for a finite float64 value >= 0 (the IEEE cast
    of a float64 that is not NaN is ``round_to``'s fp32 rounding)."""
    root = math.sqrt(value)                      # math.sqrt: IEEE, correctly rounded
    # fp32 midpoints (and the overflow threshold) are the odd multiples of half an fp32 ulp
    half_ulp = 2.0 ** max(math.frexp(root)[1] - 25, -150)
    if (root / half_ulp) % 2 == 1 and value != root * root:
        # root is a midpoint (25 bits: root * root is exact) that sqrt(value) is not: casting
        # it would round twice; the fp32 neighbour on sqrt(value)'s side is the answer (at an
        # exact tie, root itself is cast: ties to even)
        root = root + half_ulp if value > root * root else root - half_ulp
    with xp.errstate(over="ignore"):
        return scalar(root, xp.float32)


def _squares(grads) -> list[xp.ndarray]:
    out = []
    for g in grads:
        flat = astype(xp.reshape(xp.asarray(g, xp.float32), (-1,)), xp.float64)
        xp.multiply(flat, flat, out=flat)
        out.append(flat)
    return out


def _nonfinite(squares) -> xp.float32 | None:
    """NaN if any gradient is NaN, else inf if any is inf (as the reference), else None."""
    bad = [sq for sq in squares if not xp.isfinite(xp.sum(sq))]
    if not bad:
        return None
    return scalar(xp.nan if any(xp.any(xp.isnan(sq)) for sq in bad) else xp.inf, xp.float32)


def exact_global_norm(grads) -> xp.float32:
    """The reference: the exact round-to-odd sum of all squares, no fast path."""
    squares = _squares(grads)
    special = _nonfinite(squares)
    if special is not None:
        return special
    flat = xp.concatenate(squares) if squares else xp.zeros(0)
    return _fp32_sqrt(round_to_odd_sum(xp.reshape(flat, (1, -1)))[0])


def _sum_of_squares(grads) -> tuple[float, int]:
    """The float64 sum of the squares of every gradient's fp32 values (in some order), and
    how many there are (``tuning().norm_chunk`` elements widened to float64 at a time: the
    work array stays in cache)."""
    chunk = tuning().norm_chunk
    total, n = 0.0, 0
    for g in grads:
        flat = xp.reshape(xp.asarray(g, xp.float32), (-1,))
        count = size(flat)
        n += count
        wide = scratch("norm.wide", xp.float64, min(count, chunk))
        for lo in range(0, count, chunk):
            part = wide[:min(chunk, count - lo)]
            xp.copyto(part, flat[lo:lo + chunk])
            total += float(xp.matmul(part, part))
    return total, n


def global_norm(grads) -> xp.float32:
    """fp32 L2 norm of all gradients, the same bits as ``exact_global_norm``: a float64 sum
    certified by an error bound when it decides the fp32 result, the exact sum otherwise."""
    total, n = _sum_of_squares(grads)
    if not math.isfinite(total):  # finite squares cannot overflow: n 2**256 < float64 max
        return _nonfinite(_squares(grads))
    if n * _U < 0.25:
        slack = 2.0 * n * _U * total
        lo = max(math.nextafter(total - slack, -math.inf), 0.0)
        hi = math.nextafter(total + slack, math.inf)
        low = _fp32_sqrt(lo)
        if low == _fp32_sqrt(hi):
            return low
    squares = _squares(grads)
    flat = xp.concatenate(squares) if squares else xp.zeros(0)
    return _fp32_sqrt(round_to_odd_sum(xp.reshape(flat, (1, -1)))[0])
