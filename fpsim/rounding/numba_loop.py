"""The loops behind ``compiled.round_compiled``, compiled by Numba on first call; imported
only where Numba is installed (``compiled.available()``). Every operation mirrors
``_kernels.round_any_mode``, ``_kernels.settle_nans`` and ``_philox.philox_uniforms``;
``compiled`` says why. The options arrive as the values their branches would pick (see
``compiled.LoopRules``), so the hot loops have no branch the compiler cannot turn into a
select, and vectorise."""
from __future__ import annotations

import numba
import numpy as np
from numba import types

from .numba_bits import scalar_bitcast

_JIT = dict(nogil=True, cache=True, error_model="numpy")

# Philox4x32-10's constants (``_philox``): multipliers and the key schedule's increments.
_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85


@numba.njit(**_JIT)
def nearest_even_loop(x, out, r):
    """Round to nearest, ties to even (``np.rint`` of the scaled magnitude)."""
    for i in range(x.size):
        value = np.float64(x[i])
        mag, quantum = _magnitude_and_quantum(value, r)
        out[i] = _finish(np.rint(mag / quantum) * quantum, value, r)


@numba.njit(**_JIT)
def nearest_even_loop32(x, out, r):
    """Nearest even on float32 data in float32 registers (twice the lanes of the float64 loop),
    by the magic-number addition of ``_kernels.round_nearest_even_magic``: C = 1.5 q 2**23
    from x's exponent field clipped to [emin, emax + 1], and (x + C) - C is x rounded to a
    multiple of q (ties to even; either sign); where ``magic_applies`` in float32 (the
    caller checks). Then ``_finish32``: the float64 loop's steps on float32 bits."""
    for i in range(x.size):
        value = x[i]
        bits = _bits32(value)
        field = min(max((bits & np.uint32(0x7FFFFFFF)) >> np.uint32(23), r.low_field32),
                    r.high_field32)
        magic = _from_bits32(((field + r.c_offset32) << np.uint32(23)) | np.uint32(0x400000))
        out[i] = _finish32((value + magic) - magic, bits, r)


@numba.njit(**_JIT)
def same_range_loop32(x, out, r):
    """Nearest even on float32 data for an ieee format with float32's exponent range, its
    subnormals and overflow to inf (bf16, tf32): an integer addition of half a quantum minus
    one, plus the kept bit, then the cut, rounds every finite pattern (subnormals share the
    format's quantum; the largest ones carry into inf; inf stays inf); NaNs keep their sign
    and the payload bits that fit, quietened."""
    for i in range(x.size):
        bits = _bits32(x[i])
        number = bits & np.uint32(0x7FFFFFFF) <= np.uint32(0x7F800000)   # not a NaN
        rounded = (bits + r.half32 + ((bits >> r.shift32) & np.uint32(1))) & r.keep32
        quiet = (bits & r.keep32) | np.uint32(0x400000)
        out[i] = _from_bits32(rounded if number else quiet)


@numba.njit(**_JIT)
def stochastic_loop(x, out, r, seed, offset):
    """Element i rounds away from zero when ``philox_uniforms(seed, offset + i)`` is below
    its fractional distance past the lower neighbour."""
    low = np.uint64(0xFFFFFFFF)
    key0, key1 = seed & low, seed >> np.uint64(32)
    for i in range(x.size):
        value = np.float64(x[i])
        mag, quantum = _magnitude_and_quantum(value, r)
        scaled = mag / quantum
        rounded = np.floor(scaled)
        away = _philox_uniform(offset + np.uint64(i), key0, key1) < scaled - rounded
        out[i] = _finish((rounded + (1.0 if away else 0.0)) * quantum, value, r)


@numba.njit(**_JIT)
def directed_loop(x, out, r, mode):
    """``nearest_away`` (1), ``toward_zero`` (2), ``up`` (3), ``down`` (4): floor, then one
    quantum more where the mode rounds away from zero; directed modes overflow to inf only
    in their own direction (IEEE 754 7.4), else to the largest finite value."""
    for i in range(x.size):
        value = np.float64(x[i])
        mag, quantum = _magnitude_and_quantum(value, r)
        scaled = mag / quantum
        rounded = np.floor(scaled)
        fraction = scaled - rounded
        negative = _bits(value) >> np.uint64(63) == 1
        if mode == 1:
            away = fraction >= 0.5
        elif mode == 3:
            away = fraction > 0 and not negative
        elif mode == 4:
            away = fraction > 0 and negative
        else:
            away = False
        rounded = (rounded + (1.0 if away else 0.0)) * quantum
        if mode != 1 and rounded > r.max_finite and not r.saturate:
            to_inf = (np.isinf(mag) or (mode == 3 and not negative)
                      or (mode == 4 and negative))
            rounded = r.overflow_to if to_inf else r.max_finite
        out[i] = _finish(rounded, value, r)


@numba.njit(inline="always")
def _magnitude_and_quantum(value, r):
    """|x| (0 below the smallest normal under DAZ) and the format's quantum in its binade."""
    mag = 0.0 if abs(value) < r.daz_below else abs(value)
    field = max(_bits(mag) >> np.uint64(52), r.min_field)
    return mag, _from_bits((field - r.man_bits) << np.uint64(52))


@numba.njit(inline="always")
def _finish(rounded, value, r):
    """Overflow, flush, x's sign, unsigned zero, then NaNs the format can hold: ieee keeps the
    sign and the payload bits that fit (``keep`` cuts the rest; finite results have none
    there), fn formats get the quiet NaN of the result's sign, fnuz their one NaN."""
    rounded = r.overflow_to if rounded > r.max_finite else rounded
    rounded = 0.0 if rounded < r.flush_below else rounded
    rounded = np.copysign(rounded, value) + r.zero_add
    bits = _bits(rounded)
    settled = (bits & r.nan_keep) | r.nan_set if rounded != rounded else bits & r.keep
    return _from_bits(settled)


@numba.njit(inline="always")
def _finish32(rounded, bits, r):
    """``_finish`` on float32: overflow, flush, x's sign (from its ``bits``), unsigned zero,
    NaNs settled with the float32 masks."""
    magnitude = abs(rounded)
    magnitude = r.overflow_to32 if magnitude > r.max_finite32 else magnitude
    magnitude = np.float32(0.0) if magnitude < r.flush_below32 else magnitude
    signed = _bits32(magnitude) | (bits & np.uint32(0x80000000))
    result = _from_bits32(signed) + r.zero_add32
    settled = _bits32(result)
    settled = ((settled & r.nan_keep32) | r.nan_set32 if result != result
               else settled & r.keep32)
    return _from_bits32(settled)


@numba.njit(inline="always")
def _philox_uniform(counter, key0, key1):
    """``philox_uniforms``' draw for one counter: Philox4x32-10 of (low, high, 0, 0), the
    first two words' top 53 bits as a float64 in [0, 1)."""
    low = np.uint64(0xFFFFFFFF)
    shift = np.uint64(32)
    c0, c1, c2, c3 = counter & low, counter >> shift, np.uint64(0), np.uint64(0)
    k0, k1 = key0, key1
    for step in range(10):
        if step:
            k0 = (k0 + np.uint64(_W0)) & low
            k1 = (k1 + np.uint64(_W1)) & low
        product0 = c0 * np.uint64(_M0)
        product1 = c2 * np.uint64(_M1)
        c0, c1, c2, c3 = ((product1 >> shift) ^ c1 ^ k0, product1 & low,
                          (product0 >> shift) ^ c3 ^ k1, product0 & low)
    return np.float64(((c0 << shift) | c1) >> np.uint64(11)) * 2.0 ** -53


_bits = scalar_bitcast(types.float64, types.uint64)
_from_bits = scalar_bitcast(types.uint64, types.float64)
_bits32 = scalar_bitcast(types.float32, types.uint32)
_from_bits32 = scalar_bitcast(types.uint32, types.float32)
