"""Values to bit patterns and back, for every format.

``encode`` takes values that are already exactly representable (round them with ``round_to``
first) and refuses anything else, so no value is silently changed on the way to bits.
``decode`` turns patterns (uint8/uint16/uint32 or plain ints) into float32 or float64 values.

NaN payloads travel: an IEEE-style NaN keeps its sign and the top mantissa bits of its
payload both ways (a payload that would become zero keeps the quiet bit instead, so NaN stays
NaN); ``fn`` formats have one NaN per sign; ``fnuz`` formats have the single NaN ``0b1000...``;
``finite`` formats (FP4, FP6) have none: every pattern decodes to a number and ``encode``
refuses NaN and infinities, as any value the format does not hold.

>>> import numpy as np
>>> from fpsim.encoding import encode, decode
>>> hex(int(encode(1.0, "fp16"))), float(decode(0x3C00, "fp16"))
('0x3c00', 1.0)
>>> decode(np.array([0x7F, 0x80], np.uint8), "e4m3fnuz")
array([240., nan], dtype=float32)
"""
from __future__ import annotations

import numpy as np

from .formats import Format, get

__all__ = ["encode", "decode"]

_WIDE = {np.dtype(np.float32): (np.uint32, 23, 8), np.dtype(np.float64): (np.uint64, 52, 11)}


def decode(bits, fmt: "Format | str", dtype=np.float32):
    """Values of the bit patterns ``bits`` in ``fmt``, as ``dtype`` (float32 or float64).

    Bits above the format's width raise ``ValueError`` rather than being masked off.
    """
    fmt = get(fmt)
    dtype = np.dtype(dtype)
    if dtype not in _WIDE:
        raise TypeError(f"decode returns float32 or float64, not {dtype.name}")
    scalar = np.ndim(bits) == 0
    raw = np.asarray(bits)
    if raw.dtype.kind not in "ui":
        raise TypeError(f"bit patterns must be unsigned integers, got {raw.dtype.name}")
    outside = raw[(raw < 0) | (raw >= 1 << fmt.bits)] if raw.size else raw
    if outside.size:       # named as given: a negative number in decimal, not as -0x1
        first = int(outside.reshape(-1)[0])
        more = f" (and {outside.size - 1} more outside)" if outside.size > 1 else ""
        raise ValueError(f"bit patterns for {fmt.name} are 0..{(1 << fmt.bits) - 1:#x}; got "
                         f"{first if first < 0 else hex(first)}{more}")
    raw = raw.astype(np.int64)
    man_mask = (1 << fmt.man_bits) - 1
    exp_all_ones = (1 << fmt.exp_bits) - 1
    negative = (raw >> (fmt.bits - 1)) & 1 == 1
    exponent_field = (raw >> fmt.man_bits) & exp_all_ones
    mantissa = raw & man_mask

    subnormal = exponent_field == 0
    significand = np.where(subnormal, mantissa, mantissa + (1 << fmt.man_bits))
    exponent = np.where(subnormal, fmt.emin, exponent_field - fmt.bias) - fmt.man_bits
    values = np.ldexp(significand.astype(np.float64), exponent.astype(np.int32))
    values = np.where(negative, -values, values)

    if fmt.encoding == "ieee":
        special = exponent_field == exp_all_ones
        is_nan = special & (mantissa != 0)
        values = np.where(special & (mantissa == 0), np.where(negative, -np.inf, np.inf), values)
    elif fmt.encoding == "fn":
        is_nan = (exponent_field == exp_all_ones) & (mantissa == man_mask)
    elif fmt.encoding == "fnuz":
        is_nan = raw == 1 << (fmt.bits - 1)
    else:                  # finite: every pattern is a number
        is_nan = np.zeros(raw.shape, bool)
    with np.errstate(over="ignore"):  # the NaN slots of 8-exponent-bit formats hold 2**128
        values = values.astype(dtype)
    if is_nan.any():
        uint, wide_man, wide_exp = _WIDE[dtype]
        payload = np.where(fmt.encoding == "ieee", mantissa, 0).astype(np.uint64)
        payload <<= np.uint64(wide_man - fmt.man_bits)
        quiet = np.uint64(1 << (wide_man - 1))
        payload = np.where(payload == 0, quiet, payload)
        nan_bits = (np.uint64(((1 << wide_exp) - 1) << wide_man) | payload
                    | np.where(negative, np.uint64(1 << (wide_man + wide_exp)), np.uint64(0)))
        values.view(uint)[is_nan] = nan_bits.astype(uint)[is_nan]
    return values[()] if scalar else values


def _as_float(data: np.ndarray) -> np.ndarray:
    """float32/float64 as they are; narrower floats (float16, ml_dtypes types) widen exactly to
    float32; integers go to float64 only when that is exact."""
    if data.dtype in _WIDE:
        return data
    if data.dtype.kind == "f" or type(data.dtype.type).__module__.startswith("ml_dtypes") \
            or data.dtype.type.__module__.startswith("ml_dtypes"):
        return data.astype(np.float32)
    if data.dtype.kind in "iu":
        wide = data.astype(np.float64)
        if not np.array_equal(wide.astype(data.dtype), data):
            raise ValueError("integers beyond 2**53 are not exact in float64; pass floats")
        return wide
    raise TypeError(f"encode takes real numbers, got {data.dtype.name}")


def encode(values, fmt: "Format | str"):
    """Bit patterns of ``values`` in ``fmt``, as the format's unsigned dtype.

    Every value must be exactly representable in ``fmt`` (zeros, NaN, and infinities where the
    format has them included); otherwise ``ValueError`` names the first offending value.
    """
    fmt = get(fmt)
    scalar = np.ndim(values) == 0
    data = _as_float(np.asarray(values))
    uint, wide_man, wide_exp = _WIDE[data.dtype]
    wide_bits = data.view(uint).astype(np.uint64)
    negative = (wide_bits >> np.uint64(wide_man + wide_exp)) == 1

    with np.errstate(invalid="ignore"):  # signalling NaNs quieten on the way; payload kept above
        magnitude = np.abs(data.astype(np.float64))
    is_nan = np.isnan(magnitude)
    is_inf = np.isinf(magnitude)
    finite = ~(is_nan | is_inf)
    fraction, exponent = np.frexp(np.where(finite, magnitude, 0.0))
    exponent = exponent - 1  # magnitude = (2 * fraction) * 2**exponent, 2*fraction in [1, 2)
    normal = finite & (magnitude >= fmt.min_normal)
    quantum_exp = np.where(normal, exponent, fmt.emin) - fmt.man_bits
    significand = np.ldexp(np.where(finite, magnitude, 0.0), -quantum_exp)
    exact = (significand == np.floor(significand)) & (magnitude <= fmt.max_finite)
    bad = finite & ~exact
    if not fmt.has_inf:
        bad |= is_inf
    if not fmt.has_nan:     # finite formats: no pattern for NaN (round_to keeps NaN as NaN)
        bad |= is_nan
    if bad.any():
        first = float(data.reshape(-1)[np.flatnonzero(bad.reshape(-1))[0]])
        if first != first:
            raise ValueError(f"NaN has no bit pattern in {fmt.name}, which has no NaN "
                             f"({bad.sum()} value(s) NaN or otherwise not representable)")
        raise ValueError(f"{first!r} is not exactly representable in {fmt.name} "
                         f"({bad.sum()} such value(s)); round it first with round_to(x, fmt)")

    significand = significand.astype(np.int64)
    exponent_field = np.where(normal, exponent + fmt.bias, 0)
    mantissa = np.where(normal, significand - (1 << fmt.man_bits), significand)
    pattern = (exponent_field << fmt.man_bits) | mantissa
    sign = np.int64(1 << (fmt.bits - 1))
    exp_all_ones = (1 << fmt.exp_bits) - 1
    if fmt.encoding == "ieee":
        pattern = np.where(is_inf, exp_all_ones << fmt.man_bits, pattern)
        payload = ((wide_bits >> np.uint64(wide_man - fmt.man_bits))
                   & np.uint64((1 << fmt.man_bits) - 1)).astype(np.int64)
        payload = np.where(payload == 0, 1 << (fmt.man_bits - 1), payload)
        pattern = np.where(is_nan, (exp_all_ones << fmt.man_bits) | payload, pattern)
    elif fmt.encoding == "fn":
        pattern = np.where(is_nan, (exp_all_ones << fmt.man_bits) | ((1 << fmt.man_bits) - 1),
                           pattern)
    pattern = np.where(negative & (fmt.has_negative_zero | (pattern != 0)), pattern | sign,
                       pattern)
    if fmt.encoding == "fnuz":
        pattern = np.where(is_nan, sign, pattern)
    result = pattern.astype(fmt.bit_dtype)
    return result[()] if scalar else result
