"""Rounding to a format and stochastic rounding's Philox uniforms, written once on a
backend's array namespace and kernels (issue 23): ``round_to_portable`` gives
``round_to``'s bits, every mode, stochastic rounding, subnormal flush, DAZ and saturation
included, and ``philox_uniforms_portable`` gives ``philox_uniforms``' bits, on any backend
(PyTorch tensors, CuPy arrays) that implements ``fpsim.backend``'s interface. The NumPy
functions of ``fpsim.rounding`` stay the NumPy backend's fast implementation; a backend may
replace either function with a faster one of its own only where a parity test shows the
same bits.

This module sits below ``fpsim.backend``: it takes the backend as an argument, ``ops``,
anything with an ``xp`` namespace (``fpsim.backend.NAMESPACE``) and the kernels ``astype``,
``bitcast``, ``size``, ``scalar`` and ``errstate``. Arrays are used only through operators,
``where`` and ``shape``/``dtype`` (tests/test_rounding_portable.py checks the source).

The scheme (``round_any_mode`` in ``_kernels``), in float64, which every target library
has: for |x| in the binade [2**e, 2**(e+1)) the format's quantum is
q = 2**(max(e, emin) - man_bits); y = |x| / q is exact (a power-of-two scaling), rounding y
to an integer in the chosen mode is rounding x to the format, and r = round(y) * q is exact
again. Then overflow (inf, NaN or the largest finite value, per mode and format), the
subnormal flush, x's sign, and NaN bits as ``settle_nans`` has them.

Integers: torch's uint32/uint64 have only ``& | ^ == !=`` (no +, -, *, shifts, <), so no
unsigned dtype appears here. Float bits are read as signed int32/int64 (``bitcast``), whose
``& | ^`` are the same bit operations; shifts and arithmetic act only on non-negative
values (masked first), where signed and unsigned agree. Philox's 32-bit words live in int64
arrays as values in [0, 2**32), and its 32 x 32 -> 64-bit products are split so that no
intermediate value reaches 2**49 (``_wide_product``): nothing overflows, so no library's
wrap-around (or C's undefined signed overflow) is relied on.
"""
from __future__ import annotations

from ..formats import get
from . import check_options, dtype_message
from ._kernels import Rules
from ._philox import ROUNDS, check_counters
from .environment import check_environment

__all__ = ["round_to_portable", "settle_nans_portable", "philox_uniforms_portable",
           "philox4x32_portable"]

WORD = 0xFFFFFFFF                               # a Philox word: 32 bits
PHILOX_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)   # Salmon et al. (SC11), Philox4x32
PHILOX_WEYL = (0x9E3779B9, 0xBB67AE85)          # the key schedule's increments
DIRECTED = ("toward_zero", "up", "down")


def round_to_portable(ops, x, fmt, mode: str = "nearest_even", *, seed=None, offset=None,
                      subnormals=None, saturate=None, daz=False):
    """``fpsim.rounding.round_to(x, fmt, mode, ...)`` for a float32 or float64 array ``x``
    of the backend ``ops`` (0-d included): an array of x's dtype and shape, the same bits
    (signed zeros and NaN payloads included), the same argument checks and messages.
    Element i (C order) of a stochastic rounding uses Philox counter ``offset + i``.

    >>> from fpsim import backend
    >>> ops = backend.current()
    >>> x = ops.asarray([0.1, 70000.0, -2.0 ** -26])
    >>> backend.to_list(round_to_portable(ops, x, "fp16"))
    [0.0999755859375, inf, -0.0]
    >>> backend.to_list(round_to_portable(ops, x, "fp16", "toward_zero"))
    [0.0999755859375, 65504.0, -0.0]
    """
    check_environment()
    xp = ops.xp
    fmt = get(fmt)
    seed, offset = check_options(mode, seed, offset, None, subnormals, saturate, daz)
    if x.dtype != xp.float32 and x.dtype != xp.float64:
        raise TypeError(dtype_message(x.dtype))
    rules = Rules.of(fmt, subnormals=fmt.subnormals if subnormals is None else bool(subnormals),
                     saturate=fmt.saturate if saturate is None else bool(saturate),
                     daz=bool(daz))
    uniforms = None
    if mode == "stochastic":
        count = ops.size(x)
        if offset + count > 2**64:
            raise ValueError(f"offset + x.size must not pass 2**64 (offset={offset})")
        uniforms = xp.reshape(philox_uniforms_portable(ops, seed, offset, count), x.shape)
    with ops.errstate(over="ignore", invalid="ignore"):   # inf and NaN are expected results
        value = _round_float64(ops, ops.astype(x, xp.float64, copy=False), rules, mode,
                               uniforms)
        # exact: every result but NaN is a format value, ±0 or ±inf, all float32 values
        result = ops.astype(value, x.dtype, copy=False)
    return settle_nans_portable(ops, result, x, fmt)


def _round_float64(ops, x, rules: Rules, mode: str, uniforms):
    """x (float64) rounded to the format; NaN results carry any payload."""
    xp = ops.xp

    def f64(value):
        return ops.scalar(value, xp.float64)

    magnitude = xp.abs(x)
    if rules.daz:
        magnitude = xp.where(magnitude < rules.min_normal, f64(0.0), magnitude)
    # the binade's exponent field e + 1023 (masked: abs may leave a NaN's sign bit)
    field = (ops.bitcast(magnitude, xp.int64) >> 52) & 0x7FF
    quantum_field = xp.maximum(field, ops.scalar(rules.emin + 1023, xp.int64)) - rules.man_bits
    quantum = ops.bitcast(quantum_field << 52, xp.float64)
    scaled = magnitude / quantum                      # exact: a power-of-two scaling
    negative = xp.signbit(x)
    rounded = _round_integer(ops, scaled, negative, mode, uniforms) * quantum   # exact

    # IEEE 754 7.4: directed modes overflow to inf only in their own direction (infinite
    # inputs stay infinite), to the largest finite value otherwise; formats without inf
    # give NaN where IEEE gives inf; saturation clamps every overflow.
    inf_or_nan = f64(float("inf") if rules.has_inf else float("nan"))
    if rules.saturate:
        overflow = f64(rules.max_finite)
    elif mode in DIRECTED:
        to_inf = xp.isinf(magnitude)
        if mode == "up":
            to_inf = to_inf | ~negative
        elif mode == "down":
            to_inf = to_inf | negative
        overflow = xp.where(to_inf, inf_or_nan, f64(rules.max_finite))
    else:
        overflow = inf_or_nan
    rounded = xp.where(rounded > rules.max_finite, overflow, rounded)
    if not rules.subnormals:
        rounded = xp.where(rounded < rules.min_normal, f64(0.0), rounded)
    rounded = xp.copysign(rounded, x)
    if rules.unsigned_zero:
        rounded = rounded + 0.0          # -0 + 0 is +0 (round to nearest): fnuz has no -0
    return rounded


def _round_integer(ops, scaled, negative, mode: str, uniforms):
    """``scaled`` (>= 0 or NaN) rounded to an integer in ``mode``; the sign of the value it
    stands for is ``negative`` (up and down depend on it)."""
    xp = ops.xp
    if mode == "nearest_even":
        return xp.rint(scaled)
    below = xp.floor(scaled)
    if mode == "toward_zero":
        return below
    fraction = scaled - below        # exact; NaN for inf, which then never rounds up
    if mode == "nearest_away":
        away = fraction >= 0.5
    elif mode == "up":
        away = (fraction > 0.0) & ~negative
    elif mode == "down":
        away = (fraction > 0.0) & negative
    else:                            # stochastic: up with probability ``fraction``
        away = uniforms < fraction
    return xp.where(away, below + 1.0, below)


def settle_nans_portable(ops, result, x, fmt):
    """``result`` (x's dtype), a rounding of ``x`` to ``fmt``, with NaNs as ``settle_nans``
    makes them, from x's bits: ieee formats keep x's sign and the payload bits that fit,
    quiet bit set (IEEE 754 6.2); fn formats give the container's quiet NaN with x's sign
    (NaN in, or overflow); fnuz formats their one NaN, sign bit set. Built in bits: casts
    need not keep payloads."""
    xp = ops.xp
    fmt = get(fmt)
    if x.dtype == xp.float32:
        signed, fraction_bits, width = xp.int32, 23, 32
    else:
        signed, fraction_bits, width = xp.int64, 52, 64
    sign = -(1 << (width - 1))                     # the sign bit, as the signed type reads it
    quiet_bit = 1 << (fraction_bits - 1)
    quiet_nan = (((1 << (width - 1 - fraction_bits)) - 1) << fraction_bits) | quiet_bit
    x_bits = ops.bitcast(x, signed)
    if fmt.encoding == "ieee":
        cut = (1 << (fraction_bits - fmt.man_bits)) - 1        # fraction bits below the format's
        nan_bits = (x_bits | quiet_bit) & ~cut                # ~cut < 0: keeps the sign bit
    elif not fmt.has_negative_zero:
        nan_bits = ops.scalar(sign | quiet_nan, signed)
    else:
        nan_bits = (x_bits & sign) | quiet_nan
    settled = xp.where(xp.isnan(result), nan_bits, ops.bitcast(result, signed))
    return ops.bitcast(settled, x.dtype)


def philox_uniforms_portable(ops, seed: int, offset: int, n: int):
    """``fpsim.rounding.philox_uniforms(seed, offset, n)`` as a float64 array of the backend
    ``ops``, the same bits: element i is drawn from counter ``offset + i`` (a 64-bit value
    split into words c0 = low, c1 = high, c2 = c3 = 0) under key (seed low, seed high).

    >>> from fpsim import backend
    >>> from fpsim.rounding import philox_uniforms
    >>> draws = philox_uniforms_portable(backend.current(), 7, 2**32 - 1, 3)
    >>> backend.to_list(draws) == philox_uniforms(7, 2**32 - 1, 3).tolist()
    True
    """
    seed, offset, n = check_counters(seed, offset, n)
    xp = ops.xp
    index = xp.arange(n, dtype=xp.int64)       # element indices, below 2**63 (no array is longer)
    low = (index & WORD) + (offset & WORD)             # below 2**33: the carry is bit 32
    counter_low = low & WORD
    counter_high = ((index >> 32) + (offset >> 32) + (low >> 32)) & WORD
    zero = xp.zeros_like(index)
    w0, w1, _, _ = philox4x32_portable(ops, (counter_low, counter_high, zero, zero),
                                       (seed & WORD, seed >> 32))
    top53 = (w0 << 21) | (w1 >> 11)      # (w0 * 2**32 + w1) >> 11, below 2**53: exact float64
    return ops.astype(top53, xp.float64) * 2.0 ** -53


def philox4x32_portable(ops, counter, key, rounds: int = ROUNDS):
    """``fpsim.rounding.philox4x32``'s rounds on four int64 counter arrays holding 32-bit
    words (values in [0, 2**32)) under two Python-int key words; the four output words are
    int64 arrays of the same kind (``fpsim.rounding.philox4x32`` gives them as uint32)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key[0] & WORD, key[1] & WORD
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + PHILOX_WEYL[0]) & WORD, (k1 + PHILOX_WEYL[1]) & WORD
        high0, low0 = _wide_product(c0, PHILOX_MULTIPLIERS[0])
        high1, low1 = _wide_product(c2, PHILOX_MULTIPLIERS[1])
        c0, c1, c2, c3 = high1 ^ c1 ^ k0, low1, high0 ^ c3 ^ k1, low0
    return c0, c1, c2, c3


def _wide_product(word, multiplier: int):
    """(high, low) 32-bit halves of word * multiplier, for an int64 array of words in
    [0, 2**32) and a Python int multiplier below 2**32, with no value above 2**49.

    With multiplier = m1 * 2**16 + m0 (m0, m1 < 2**16), the partial products
    below = word * m0 and above = word * m1 are below 2**48, and
    word * multiplier = (above >> 16) * 2**32 + t, t = below + (above & 0xFFFF) * 2**16
    < 2**49; so low = t & 0xFFFFFFFF and high = (above >> 16) + (t >> 32) (< 2**32, as the
    product is below 2**64)."""
    below = word * (multiplier & 0xFFFF)
    above = word * (multiplier >> 16)
    t = below + ((above & 0xFFFF) << 16)
    return (above >> 16) + (t >> 32), t & WORD
