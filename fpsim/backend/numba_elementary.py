"""The fused kernels ``exp`` and ``normal_tail`` (``interface.FUSED_KERNELS``): Numba loops
that compute, element by element, what ``fpsim.exact.elementary``'s dozens of array passes
compute, with the same operations in the same order, so the same bits.

``exp`` is ``elementary.exp``: k = rint(y log2 e), r = (y - k LN2_HI) - k LN2_LO,
1 + (r + r*r q(r)) times 2**k built from its bits, y clamped to [-400, 400], inf -> inf,
-inf -> +0, NaN -> itself (its bits). ``normal_tail`` is the table path of ``elementary``'s
Phi: Q(a) = exp(-(a*a)/2) M(a), M the degree-15 Taylor polynomial around the centre j/4
nearest a = |x|, taken from the caller's (16, 81) coefficient table by Horner, and
Phi(x) = Q(a) for x < 0, 1 - Q(a) otherwise.

The loops are compiled without fast-math (IEEE semantics, no FMA contraction, no
reassociation) and release the GIL, as ``fpsim.rounding.numba_loop``. The constants are
``elementary``'s, written out again here (this layer is below ``fpsim.exact`` and must not
import it); ``tests/test_fused_elementary.py`` checks they are the same floats, and forces
both paths on inputs built for every branch.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import types

from ..rounding.numba_bits import scalar_bitcast

__all__ = ["exp", "exp_scalar", "normal_tail", "LOG2E", "LN2_HI", "LN2_LO", "EXPM1_Q", "CLAMP",
           "TABLE_SHAPE"]

_JIT = dict(nogil=True, cache=True, error_model="numpy")

LOG2E = float.fromhex("0x1.71547652b82fep+0")
LN2_HI = float.fromhex("0x1.62e42fee00000p-1")     # 32 significant bits
LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")    # ln 2 - LN2_HI to float64
CLAMP = 400.0


def _factorial(n: int) -> int:
    out = 1
    for i in range(2, n + 1):
        out *= i
    return out


# expm1(r) = r + r^2 q(r), q(r) = sum_{i=0}^{12} r^i / (i + 2)!, each the float64 nearest
# (Python's int division rounds correctly), as ``elementary._EXPM1_Q``
EXPM1_Q = tuple(1 / _factorial(i + 2) for i in range(13))
_Q = np.array(EXPM1_Q)     # a global array: Numba freezes it into the code as constants

#: the Taylor table ``normal_tail`` takes: (degree + 1, centres) = (16, 81), centres j / 4
TABLE_SHAPE = (16, 81)
_STEP = 4.0


_from_bits = scalar_bitcast(types.int64, types.float64)


@numba.njit(inline="always")
def _exp_finite(y):
    """``elementary.exp`` of one finite float64 y with |y| <= 400: ``exp_parts``, then
    p += 1 and p *= pow2(k), every operation in its order (Horner's first product r * c_12)."""
    k = np.rint(y * LOG2E)
    r = y - k * LN2_HI
    r -= k * LN2_LO
    acc = r * _Q[12]
    acc += _Q[11]
    for i in range(10, -1, -1):
        acc *= r
        acc += _Q[i]
    p = r * r
    p *= acc
    p += r
    p += 1.0
    return p * _from_bits((np.int64(k) + 1023) << 52)     # pow2(k): |k| <= 578, exact


@numba.njit(inline="always")
def exp_scalar(value):
    """``elementary.exp`` of one float64 ``value``, inf, -inf and NaN included: for other
    compiled loops that need exp's bits element by element (``numba_softmax``)."""
    finite = np.isfinite(value)
    # the clamp as maximum then minimum, on 0 where value is not finite (as the NumPy code)
    clamped = min(max(value if finite else 0.0, -CLAMP), CLAMP)
    p = _exp_finite(clamped)
    special = value if value != value else (np.inf if value > 0 else 0.0)
    return p if finite else special


@numba.njit(**_JIT)
def _exp_loop(y, out):
    """out = ``elementary.exp(y)``, both contiguous 1-D (a loop the compiler vectorises)."""
    for i in range(y.size):
        out[i] = exp_scalar(y[i])


@numba.njit(**_JIT)
def _normal_tail_loop(x, table, phi, gauss):
    """Three passes, each at its own best: the Gaussian factors (a loop the compiler
    vectorises), M by Horner eight elements at a time into ``phi`` (``_mills8``), then Phi
    from both (vectorised). Elements off the table (|x| > 20 or NaN, which the contract
    excludes) come out as NaN in both results and are looked up at centre 0: never outside
    the table. (One pass over all of it: 16 ns an element on a Zen 4; these three: 6.)"""
    by_centre = _by_centre(table)
    n = x.size
    for i in range(n):
        a = abs(x[i])
        on_table = a <= 20.0
        a = a if on_table else 0.0
        g = _exp_finite(-(a * a) * 0.5)      # a*a is x*x
        gauss[i] = g if on_table else np.nan
    whole = n - n % 8
    for i in range(0, whole, 8):
        _mills8(x, i, by_centre, phi)
    for i in range(whole, n):
        j, h = _centre(x[i])
        m = by_centre[j, 15]
        for degree in range(14, -1, -1):
            m = m * h + by_centre[j, degree]
        phi[i] = m
    for i in range(n):
        value = x[i]
        q = gauss[i] * phi[i]
        phi[i] = (q if value < 0 else 1.0 - q) if abs(value) <= 20.0 else np.nan


@numba.njit(inline="always")
def _by_centre(table):
    """The (16, 81) table as (81, 16): one centre's coefficients side by side, in two cache
    lines instead of sixteen (11 instead of 16 ns an element, one chain at a time)."""
    by_centre = np.empty((table.shape[1], table.shape[0]))
    for degree in range(table.shape[0]):
        for j in range(table.shape[1]):
            by_centre[j, degree] = table[degree, j]
    return by_centre


@numba.njit(inline="always")
def _centre(value):
    """(j, h): the index of the centre j/4 nearest a = |value| (0 for a value off the table)
    and a - j/4 (exact)."""
    a = abs(value)
    a = a if a <= 20.0 else 0.0
    centre = np.rint(a * _STEP)
    return np.uint64(centre), a - centre / _STEP


@numba.njit(inline="always")
def _mills8(x, i, c, out):
    """out[i .. i+7] = M at x[i .. i+7] by Horner from degree 15 down, m = m * h + c_degree
    (two roundings, as ``elementary``'s in-place steps), ``c`` the table by centre. Eight
    independent chains side by side: one chain is 15 dependent multiply-adds and the
    processor overlaps only a few elements' chains by itself; the table loads are a gather,
    which the compiler does not vectorise (Zen 4: 8.7 ns an element one at a time, 4.3
    eight at a time)."""
    j0, h0 = _centre(x[i])
    j1, h1 = _centre(x[i + 1])
    j2, h2 = _centre(x[i + 2])
    j3, h3 = _centre(x[i + 3])
    j4, h4 = _centre(x[i + 4])
    j5, h5 = _centre(x[i + 5])
    j6, h6 = _centre(x[i + 6])
    j7, h7 = _centre(x[i + 7])
    m0, m1, m2, m3 = c[j0, 15], c[j1, 15], c[j2, 15], c[j3, 15]
    m4, m5, m6, m7 = c[j4, 15], c[j5, 15], c[j6, 15], c[j7, 15]
    for d in range(14, -1, -1):
        m0, m1, m2, m3 = (m0 * h0 + c[j0, d], m1 * h1 + c[j1, d], m2 * h2 + c[j2, d],
                          m3 * h3 + c[j3, d])
        m4, m5, m6, m7 = (m4 * h4 + c[j4, d], m5 * h5 + c[j5, d], m6 * h6 + c[j6, d],
                          m7 * h7 + c[j7, d])
    out[i], out[i + 1], out[i + 2], out[i + 3] = m0, m1, m2, m3
    out[i + 4], out[i + 5], out[i + 6], out[i + 7] = m4, m5, m6, m7


def _flat(x) -> np.ndarray:
    """``x`` as a contiguous 1-D float64 array (a copy only where it is not one already)."""
    return np.ascontiguousarray(x, dtype=np.float64).reshape(-1)


def exp(y) -> np.ndarray:
    """``fpsim.exact.elementary.exp(y)``'s bits for a float64 array ``y`` of any shape and
    layout: a new float64 array of y's shape."""
    y = np.asarray(y, dtype=np.float64)
    flat = _flat(y)
    out = np.empty_like(flat)
    _exp_loop(flat, out)
    return out.reshape(y.shape)


def normal_tail(x, table) -> tuple:
    """(Phi(x), exp(-(x*x)/2)) with the bits of ``fpsim.exact.elementary``'s table path
    (``_phi_on_table`` and the Gaussian factor of Q) for a float64 array ``x`` with every
    |x| <= 20, any shape and layout; ``table`` is the (16, 81) float64 coefficient table
    (``elementary._gelu_table``). Two new float64 arrays of x's shape."""
    x = np.asarray(x, dtype=np.float64)
    table = np.ascontiguousarray(table, dtype=np.float64)
    if table.shape != TABLE_SHAPE:
        raise ValueError(f"normal_tail takes a {TABLE_SHAPE} table, got {table.shape}")
    flat = _flat(x)
    phi, gauss = np.empty_like(flat), np.empty_like(flat)
    _normal_tail_loop(flat, table, phi, gauss)
    return phi.reshape(x.shape), gauss.reshape(x.shape)
