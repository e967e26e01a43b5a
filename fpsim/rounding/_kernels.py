"""Rounding kernels. Each works on one contiguous chunk and writes into a caller's buffer.

Two kernels, both exact:

``round_any_mode`` (float64, every mode)
    For |x| with binade exponent e, the format's quantum is q = 2**(max(e, emin) - man_bits).
    y = |x| / q is exact (a power-of-two scaling), and rounding y to an integer is rounding x
    to the format; r = round(y) * q is exact again. float32 input is widened to float64 first
    (exact), so this is one rounding from the input value straight to the format.

``round_nearest_even_magic`` (float32 or float64, round-to-nearest-even only)
    For the same q, C = 1.5 * q * 2**t (t = the container's mantissa bits) lies in the binade
    [q 2**t, q 2**(t+1)), whose ulp is q, and so does x + C for every |x| < 2**(max(e, emin)+1)
    of either sign when t - man_bits >= 2 (|x| <= C / 3). So the hardware's own
    round-to-nearest-even addition x + C rounds x to a multiple of q (C / q is even: ties go
    to even multiples), and subtracting C back is exact (Sterbenz); no |x| is formed. C comes
    from the exponent bits of x with three integer ops (the exponent field clipped to
    [emin, emax + 1], then C's field and its top fraction bit added), so normals and
    subnormals take the same branch-free path. The clip keeps C finite; an |x| at or above
    2**(emax+1) then rounds (monotonically) to at least 2**(emax+1) in magnitude, and
    scaling by 2**(container_emax - emax) turns exactly those results into inf. A result that
    rounds to zero is +0 (x + C - C); OR-ing x's sign bit in gives it x's sign (every other
    result has it already; NaNs keep x's sign and payload, quietened by the addition).
    Saturating formats first clamp x to [-max_finite, max_finite] (NaN stays NaN) and take C
    from the clamped value. Each step after the additions changes only some elements (the
    clip, overflow, flush, zero signs, NaNs); the smallest and largest exponent field of the
    chunk say whether any element needs it, and otherwise it is skipped.

Both rely on IEEE arithmetic without flush-to-zero, which is NumPy's default on CPU.
"""
from __future__ import annotations

import functools
import threading
from typing import NamedTuple

import numpy as np

from ..formats import Format


class Rules(NamedTuple):
    """What a rounding call needs to know, resolved once from the format and the options."""

    man_bits: int
    emin: int
    emax: int
    max_finite: float
    min_normal: float
    has_inf: bool
    unsigned_zero: bool
    nan_payload: bool     # ieee formats carry NaN payloads; fn/fnuz have fixed NaN patterns
    subnormals: bool
    saturate: bool
    daz: bool

    @classmethod
    def of(cls, fmt: Format, *, subnormals: bool, saturate: bool, daz: bool) -> "Rules":
        if not saturate and not fmt.has_inf and not fmt.has_nan:
            raise ValueError(f"saturate=False: {fmt.name} has no infinity or NaN to overflow "
                             f"to, so it always saturates; pass saturate=True or None")
        return cls(fmt.man_bits, fmt.emin, fmt.emax, fmt.max_finite, fmt.min_normal,
                   fmt.has_inf, not fmt.has_negative_zero, fmt.encoding == "ieee",
                   subnormals, saturate, daz)


class _Container(NamedTuple):
    uint: type
    mant_bits: int
    bias: int
    sign_mask: int
    exp_mask: int


_CONTAINERS = {
    np.dtype(np.float32): _Container(np.uint32, 23, 127, 1 << 31, 0xFF << 23),
    np.dtype(np.float64): _Container(np.uint64, 52, 1023, 1 << 63, 0x7FF << 52),
}


def magic_applies(rules: Rules, dtype: np.typing.DTypeLike) -> bool:
    """Whether ``round_nearest_even_magic`` is exact for these rules in this container:
    C must stay finite for inputs up to 2**(emax+1), and x + C must stay in C's binade
    (man_bits <= t - 2, module doc)."""
    box = _CONTAINERS[np.dtype(dtype)]
    biggest_c_field = rules.emax + 1 + box.bias + box.mant_bits - rules.man_bits
    return (not rules.daz and rules.man_bits <= box.mant_bits - 2
            and biggest_c_field <= 2 * box.bias)


class Scratch:
    """Reusable work buffers, so chunks allocate nothing. One per thread (``thread_scratch``):
    a fresh buffer of a few hundred KiB is fresh pages, and on a virtual machine the page
    faults cost more than the arithmetic (measured: 96 faults, ~250 us, per 32K-element fp16
    rounding, against ~60-90 us with reused buffers)."""

    def __init__(self, size: int = 0):
        self.size = size
        self._buffers: dict[tuple, np.ndarray] = {}

    def get(self, slot: "int | str", dtype, n: int) -> np.ndarray:
        key = (slot, np.dtype(dtype))
        buf = self._buffers.get(key)
        if buf is None or buf.size < n:
            buf = self._buffers[key] = np.empty(max(n, self.size), dtype)
        return buf[:n]


_local = threading.local()


def thread_scratch() -> Scratch:
    """This thread's ``Scratch`` (buffers grow to the largest chunk seen, at most ``_CHUNK``
    elements per slot)."""
    scratch = getattr(_local, "scratch", None)
    if scratch is None:
        scratch = _local.scratch = Scratch()
    return scratch


class _MagicConstants(NamedTuple):
    """The magic kernel's constants for one (rules, container), as 0-d arrays (a ufunc takes
    a 0-d array operand faster than a NumPy scalar: no scalar conversion per call)."""

    uint: type
    exp_mask: np.ndarray
    low_field: np.ndarray        # C's exponent field at least emin's ...
    high_field: np.ndarray       # ... and at most emax+1's
    c_bits: np.ndarray           # from x's exponent field to C's: container minus format
    #                              bits, plus C's top fraction bit (the 1.5)
    low_clamp: np.ndarray        # saturating formats: -max_finite and max_finite
    high_clamp: np.ndarray
    up: np.ndarray | None        # overflow by scaling: 2**(container_emax - emax), its inverse
    down: np.ndarray | None
    max_finite: np.ndarray
    min_normal: np.ndarray
    nan_bits: np.ndarray         # ieee formats: the bits a NaN result keeps (settle_nans)
    sign_mask: np.ndarray
    zero: np.ndarray
    fields: tuple                # Python ints, for the tests on x's exponent fields: low and
    #                              high as above, emax's (from it a result may overflow),
    #                              the last at which a result may be zero, all ones


@functools.lru_cache(maxsize=256)
def _magic_constants(rules: Rules, dtype: np.dtype) -> _MagicConstants:
    box = _CONTAINERS[dtype]
    uint, real = box.uint, dtype.type

    def u(v):
        return np.array(v, uint)

    def r(v):
        return np.array(v, real)

    shift = box.bias - rules.emax  # the container's emax equals its bias
    scale = rules.has_inf and shift <= box.bias
    cut = (1 << (box.mant_bits - rules.man_bits)) - 1
    return _MagicConstants(
        uint, u(box.exp_mask),
        u((rules.emin + box.bias) << box.mant_bits),
        u((rules.emax + 1 + box.bias) << box.mant_bits),
        u(((box.mant_bits - rules.man_bits) << box.mant_bits) | (1 << (box.mant_bits - 1))),
        r(-rules.max_finite), r(rules.max_finite),
        r(2.0 ** shift) if scale else None, r(2.0 ** -shift) if scale else None,
        r(rules.max_finite), r(rules.min_normal), u(~cut & (box.sign_mask * 2 - 1)),
        u(box.sign_mask), r(0.0),
        ((rules.emin + box.bias) << box.mant_bits, (rules.emax + 1 + box.bias) << box.mant_bits,
         (rules.emax + box.bias) << box.mant_bits,
         max(rules.emin - rules.man_bits - 1 + box.bias, 0) << box.mant_bits, box.exp_mask))


_SMALL_CLIP = 1 << 13   # below this, maximum + minimum cost less than np.clip's Python wrapper
_SMALL_SCAN = 1 << 11   # below this, every step costs less than finding which ones to skip


def _clip(x: np.ndarray, low, high, out: np.ndarray) -> None:
    """out = min(max(x, low), high) (NaN stays NaN)."""
    if x.size < _SMALL_CLIP:
        np.maximum(x, low, out=out)
        np.minimum(out, high, out=out)
    else:
        np.clip(x, low, high, out=out)


def round_nearest_even_magic(x: np.ndarray, out: np.ndarray, rules: Rules,
                             scratch: Scratch) -> None:
    """``out`` = x rounded to nearest even (module doc). The smallest and largest exponent
    field of x (two reductions) say which steps can change anything: the clip of C's field,
    the overflow step, the subnormal flush, the sign of zero results and the NaN settling
    each run only where some element needs them (they leave every other element as it is),
    so data within the format's normal range, as weights and activations mostly are, takes
    four passes instead of ten."""
    if x.size == 0:
        return
    k = _magic_constants(rules, x.dtype)
    uint = k.uint
    result = out.view(x.dtype)
    magic = scratch.get(1, uint, x.size)
    np.bitwise_and(x.view(uint), k.exp_mask, out=magic)
    low_field, high_field, emax_field, zero_field, all_ones = k.fields
    if x.size < _SMALL_SCAN:    # every step: cheaper than the two reductions' fixed cost
        lowest, highest = 0, all_ones
    else:
        lowest, highest = int(magic.min()), int(magic.max())
    source = x
    if rules.saturate and highest >= emax_field:
        # only values from 2**emax up can exceed max_finite: clamp them (NaN stays NaN), and
        # take C from the clamped values
        _clip(x, k.low_clamp, k.high_clamp, result)
        source = result
        np.bitwise_and(result.view(uint), k.exp_mask, out=magic)
        if x.size >= _SMALL_SCAN:
            lowest, highest = int(magic.min()), int(magic.max())

    # C's exponent field: x's, at least emin's and at most emax+1's (one clip). The upper
    # bound only keeps C finite: an |x| from 2**(emax+1) up still rounds to at least
    # 2**(emax+1) in magnitude (monotonic), which the overflow step below turns into inf.
    if lowest < low_field or highest > high_field:
        _clip(magic, k.low_field, k.high_field, magic)
    np.add(magic, k.c_bits, out=magic)
    magic_f = magic.view(x.dtype)

    np.add(source, magic_f, out=result)
    np.subtract(result, magic_f, out=result)

    # below 2**emax every result is at most 2**emax <= max_finite: no overflow
    overflow = not rules.saturate and highest >= emax_field
    # formats without inf or NaN payloads (fn, fnuz): a result beyond max_finite becomes NaN,
    # as every NaN becomes the format's one, in the masked write at the end (_settle_fn_nans)
    fn_nans = not rules.has_inf and not rules.nan_payload
    if overflow and not fn_nans:
        if k.up is not None:
            np.multiply(result, k.up, out=result)  # [2**(emax+1), inf] -> inf, nothing else
            np.multiply(result, k.down, out=result)
        else:
            np.putmask(result, np.abs(result) > k.max_finite,
                       np.inf if rules.has_inf else np.nan)
    below_normal = lowest < low_field        # from 2**emin up every result is normal
    if not rules.subnormals and below_normal:
        np.putmask(result, np.abs(result) < k.min_normal, k.zero)

    # A nonzero result has x's sign (x + C - C is monotonic in x and odd); a zero one is +0:
    # x's sign bit is ORed in where some result may be zero (|x| <= half the smallest
    # subnormal, or flushed), or NaN (the all-ones field: inf or NaN inputs; overflow in a
    # format without inf).
    nan = highest == all_ones or (overflow and k.up is None)
    zeros = lowest <= zero_field or (not rules.subnormals and below_normal)
    if zeros or (nan and not fn_nans):      # fn formats: NaNs take x's sign as they settle
        sign = magic  # C is spent: its buffer takes x's sign bit
        np.bitwise_and(x.view(uint), k.sign_mask, out=sign)
        result_bits: np.ndarray = result.view(uint)
        np.bitwise_or(result_bits, sign, out=result_bits)
    if rules.unsigned_zero and zeros:
        np.add(result, k.zero, out=result)   # -0 + 0 == +0 under round-to-nearest
    if nan:
        if rules.nan_payload:   # settle_nans' rule: every non-NaN result has these bits zero
            result_bits = result.view(uint)
            np.bitwise_and(result_bits, k.nan_bits, out=result_bits)
        elif fn_nans:
            _settle_fn_nans(result, x, rules, k, scratch)
        else:
            settle_nans(result, rules)


def _settle_fn_nans(result: np.ndarray, x: np.ndarray, rules: Rules, k,
                    scratch: Scratch) -> None:
    """Formats without inf (fn, fnuz): every result beyond max_finite in magnitude (an
    overflow, an infinite input) and every NaN becomes the format's NaN N, as
    ``settle_nans`` gives it (the quiet NaN with x's sign, which such a result already has;
    fnuz: its one NaN, sign bit set). A NaN's bits exceed every finite value's, so the
    arithmetic shift of ``max_finite - magnitude`` (signed, no overflow) is a mask S of all
    ones exactly there; then ``bits ^= (bits ^ N) & S`` selects N without a branch or a
    masked write (numpy's masked copyto costs about fifteen of these passes). For fn,
    ``bits ^ N`` is the magnitude ^ quiet: six passes in all."""
    box = _CONTAINERS[result.dtype]
    uint = box.uint
    bits: np.ndarray = result.view(uint)
    sint = np.dtype(uint).str.replace("u", "i")
    quiet = uint(box.exp_mask | (1 << (box.mant_bits - 1)))
    magnitude = scratch.get(2, uint, result.size)
    np.bitwise_and(bits, uint(box.sign_mask - 1), out=magnitude)
    beyond = scratch.get(3, uint, result.size)
    beyond_signed = beyond.view(sint)
    np.subtract(np.asarray(k.max_finite).view(uint).astype(sint), magnitude.view(sint),
                out=beyond_signed)
    np.right_shift(beyond_signed, np.dtype(uint).itemsize * 8 - 1, out=beyond_signed)
    if rules.unsigned_zero:
        np.bitwise_xor(bits, uint(box.sign_mask) | quiet, out=magnitude)
    else:
        np.bitwise_xor(magnitude, quiet, out=magnitude)
    np.bitwise_and(magnitude, beyond, out=magnitude)
    np.bitwise_xor(bits, magnitude, out=bits)


def settle_nans(result: np.ndarray, rules: Rules) -> None:
    """Make NaN results NaNs the format can hold, as ``decode(encode(.))`` gives them.

    ieee formats: keep the sign and the payload bits that fit; the arithmetic before has set
    the quiet bit (IEEE 754 6.2: operations on a signalling NaN deliver a quiet one). Every
    non-NaN result already has zeros in the bits cut off, so one AND serves all elements.
    fn formats: the quiet NaN of the same sign; fnuz formats: their single NaN (sign bit set,
    as ml_dtypes decodes it).
    """
    box = _CONTAINERS[result.dtype]
    bits: np.ndarray = result.view(box.uint)
    if rules.nan_payload:
        cut = (1 << (box.mant_bits - rules.man_bits)) - 1
        np.bitwise_and(bits, box.uint(~cut & (box.sign_mask * 2 - 1)), out=bits)
        return
    nans = np.isnan(result)
    if nans.any():
        quiet = box.exp_mask | (1 << (box.mant_bits - 1))
        signs = bits & box.uint(box.sign_mask)
        if rules.unsigned_zero:  # fnuz: the one NaN, 0x80..., decodes with its sign bit set
            signs = np.full_like(signs, box.sign_mask)
        bits[nans] = (signs | box.uint(quiet))[nans]


def round_any_mode(x: np.ndarray, out: np.ndarray, rules: Rules, mode: str,
                   uniforms: np.ndarray | None) -> None:
    """Round a float64 chunk ``x`` into ``out`` (float64 or float32) in any mode.

    ``uniforms``: for mode "stochastic", one float64 in [0, 1) per element; x rounds away from
    zero when its uniform is below the fractional distance past the lower neighbour.
    """
    mag = np.abs(x)
    if rules.daz:
        mag[mag < rules.min_normal] = 0.0
    exponent_field = mag.view(np.uint64) >> np.uint64(52)
    quantum_field = np.maximum(exponent_field, np.uint64(rules.emin + 1023))
    quantum_field -= np.uint64(rules.man_bits)
    quantum = (quantum_field << np.uint64(52)).view(np.float64)
    scaled = mag / quantum

    negative = np.signbit(x)
    if mode == "nearest_even":
        rounded = np.rint(scaled)
    elif mode == "toward_zero":
        rounded = np.floor(scaled)
    else:
        rounded = np.floor(scaled)
        fraction = scaled - rounded  # exact; NaN for inf input, which then never rounds up
        if mode == "nearest_away":
            away = fraction >= 0.5
        elif mode == "up":
            away = (fraction > 0) & ~negative
        elif mode == "down":
            away = (fraction > 0) & negative
        elif mode == "stochastic":
            away = uniforms < fraction
        else:  # pragma: no cover - the caller validates modes
            raise AssertionError(mode)
        rounded += away
    rounded *= quantum

    too_big = rounded > rules.max_finite  # overflowed finite values and inf inputs
    if too_big.any():
        inf_or_nan = np.inf if rules.has_inf else np.nan
        if rules.saturate:
            rounded[too_big] = rules.max_finite
        elif mode in ("toward_zero", "up", "down"):
            # IEEE 754 7.4: directed roundings overflow to inf only in their own direction;
            # infinite inputs stay infinite (NaN where the format has no inf).
            to_inf = np.isinf(mag)
            if mode == "up":
                to_inf |= ~negative
            elif mode == "down":
                to_inf |= negative
            rounded[too_big] = np.where(to_inf, inf_or_nan, rules.max_finite)[too_big]
        else:
            rounded[too_big] = inf_or_nan
    if not rules.subnormals:
        rounded[rounded < rules.min_normal] = 0.0
    np.copysign(rounded, x, out=rounded)
    if rules.unsigned_zero:
        rounded += 0.0
    out[...] = rounded
    settle_nans(out, rules)
