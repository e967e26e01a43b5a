"""Compiled rounding: every mode as one Numba loop per element, Philox inside (optional).

The NumPy kernels (``_kernels``) work in whole-chunk passes: the magic-number kernel about a
dozen of them, the every-mode kernel more, and Philox4x32-10 about eighty passes over
uint64 arrays, so stochastic rounding ran at 1/16 to 1/32 of round-to-nearest's speed and a
small array paid tens of microseconds of per-pass overhead. Here each element is drawn and
rounded in registers by ``round_any_mode``'s arithmetic, in float64, in the same order:

    u = philox_uniforms(seed, offset + i)             # stochastic only; same layout, same bits
    mag = |x|  (daz: 0 below the smallest normal)
    q = 2 ** (max(e(mag), emin) - man_bits)           # from the exponent field, as there
    r = rint(mag / q) * q                             # nearest_even
      = (floor(mag / q) + away) * q                   # the other modes (stochastic: u < fraction)
    r = overflow rule;  flush;  copysign(r, x);  +0.0 for unsigned zeros;  settle NaNs

Every step is exact or the one rounding, so the values are ``round_any_mode``'s, and so the
magic kernel's and ml_dtypes' (exact rounding has one answer); NaNs are settled by
``settle_nans``' rule (ieee: sign and the payload bits that fit; fn: the quiet NaN of the
result's sign; fnuz: the one NaN), computed on the float64 bits: a float32 NaN widened to
float64 keeps its payload in the top bits, so cutting the float64 bits below the format's
``man_bits`` cuts the same ones. ``tests/test_rounding_compiled.py`` forces this path and the
NumPy one on inputs built for every branch (ties and near-ties, overflow edges, subnormals,
infinities, NaN payloads, every mode and option, float32 and float64) and compares bits.

Numba is optional (``pip install 'fpsim[fast]'``): without it ``available()`` is False and
``round_to`` runs the NumPy kernels, which stay the reference. The loops are compiled without
fast-math (IEEE semantics, no contraction), release the GIL (``round_to``'s two threads
overlap), and are cached in ``__pycache__`` where it is writable.
"""
from __future__ import annotations

import functools
import importlib.util
from typing import NamedTuple

import numpy as np

from ._kernels import Rules, magic_applies

__all__ = ["available", "round_compiled", "nearest_even_compiled", "loop_rules", "LoopRules",
           "float32_loop"]

_DIRECTED_CODES = {"nearest_away": 1, "toward_zero": 2, "up": 3, "down": 4}
_SIGN = 1 << 63
_QUIET_NAN = 0x7FF8 << 48


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether Numba is installed, so that the compiled loops can run (asked without importing
    it: Numba's import takes a good part of a second, paid on first use only)."""
    return importlib.util.find_spec("numba") is not None


class LoopRules(NamedTuple):
    """``Rules`` as the loops take them: each option as the value its branch would pick."""

    min_field: np.uint64     # float64 exponent field of the format's smallest binade (emin)
    man_bits: np.uint64
    max_finite: float
    overflow_to: float       # max_finite when saturating, else inf (ieee) or NaN (fn, fnuz)
    saturate: bool
    daz_below: float         # min_normal under DAZ, else 0 (nothing is below it)
    flush_below: float       # min_normal without subnormals, else 0
    zero_add: float          # +0.0 makes -0 into +0 (unsigned zeros); -0.0 changes nothing
    keep: np.uint64          # bits a result keeps (ieee: all but the payload cut off)
    nan_keep: np.uint64      # of a NaN's bits: ieee as keep, fn the sign, fnuz none
    nan_set: np.uint64       # then set: fn and fnuz the quiet NaN (fnuz with its sign bit)
    # the same for the float32 loops (meaningful where they apply: ``float32_loop``)
    low_field32: np.uint32   # float32 exponent fields of emin and emax + 1: C's clip
    high_field32: np.uint32
    c_offset32: np.uint32    # C's field is x's (clipped) plus 23 - man_bits
    max_finite32: np.float32
    overflow_to32: np.float32
    flush_below32: np.float32
    zero_add32: np.float32
    keep32: np.uint32
    nan_keep32: np.uint32
    nan_set32: np.uint32
    half32: np.uint32        # same_range_loop32: half a quantum minus one, in float32 bits
    shift32: np.uint32       # the quantum's bit position in float32 bits: 23 - man_bits


@functools.lru_cache(maxsize=512)
def loop_rules(rules: Rules) -> LoopRules:
    """The loops' form of ``rules`` (resolved once per kind of call)."""
    u = np.uint64
    if rules.nan_payload:
        keep = u((1 << 64) - (1 << (52 - rules.man_bits)))
        nan_keep, nan_set = keep, u(0)
    else:
        keep = u((1 << 64) - 1)
        nan_keep = u(0) if rules.unsigned_zero else u(_SIGN)
        nan_set = u(_QUIET_NAN | _SIGN) if rules.unsigned_zero else u(_QUIET_NAN)
    overflow_to = (rules.max_finite if rules.saturate
                   else np.inf if rules.has_inf else np.nan)
    flush_below = 0.0 if rules.subnormals else rules.min_normal
    zero_add = 0.0 if rules.unsigned_zero else -0.0
    wide = (u(rules.emin + 1023), u(rules.man_bits), rules.max_finite, overflow_to,
            rules.saturate, rules.min_normal if rules.daz else 0.0, flush_below, zero_add,
            keep, nan_keep, nan_set)
    return LoopRules(*wide, *_float32_fields(rules, overflow_to, flush_below, zero_add))


def _float32_fields(rules: Rules, overflow_to, flush_below, zero_add) -> tuple:
    """LoopRules' float32 fields (a format beyond float32's range gets meaningless ones: the
    float32 loops never run for it)."""
    u, f = np.uint32, np.float32
    shift = max(23 - rules.man_bits, 1)
    cut = (1 << shift) - 1 if rules.nan_payload else 0
    keep = u(0xFFFFFFFF - cut)
    if rules.nan_payload:
        nan_keep, nan_set = keep, u(0)
    else:
        nan_keep = u(0) if rules.unsigned_zero else u(0x80000000)
        nan_set = u(0xFFC00000) if rules.unsigned_zero else u(0x7FC00000)

    def clip(field):
        return u(min(max(field, 0), 255))

    with np.errstate(over="ignore"):
        values = f(rules.max_finite), f(overflow_to), f(flush_below), f(zero_add)
    return (clip(rules.emin + 127), clip(rules.emax + 128), u(max(23 - rules.man_bits, 0)),
            *values, keep, nan_keep, nan_set, u((1 << (shift - 1)) - 1), u(shift))


def float32_loop(rules: Rules) -> str | None:
    """Which float32 loop rounds float32 data to nearest even under ``rules``:
    "same_range" (an ieee format with float32's exponent range, subnormals, overflow to inf:
    bf16, tf32), "magic" (where ``magic_applies`` in float32: fp16, the FP8 formats, ...),
    or None (the float64 loop)."""
    if (rules.emin == -126 and rules.emax == 127 and rules.has_inf and rules.nan_payload
            and rules.subnormals and not rules.saturate and not rules.daz
            and 1 <= rules.man_bits <= 22):
        return "same_range"
    if magic_applies(rules, np.float32):
        return "magic"
    return None


def round_compiled(x: np.ndarray, out: np.ndarray, rules: Rules, mode: str = "nearest_even",
                   seed: int = 0, offset: int = 0) -> None:
    """Round ``x`` into ``out`` (contiguous 1-D float32 or float64 arrays of one size and
    dtype): the bits of ``round_any_mode(x.astype(float64), out, rules, mode, uniforms)``
    with ``uniforms = philox_uniforms(seed, offset, x.size)`` for ``"stochastic"``."""
    loops, loop = _loops(), loop_rules(rules)
    if mode == "nearest_even":
        kind = float32_loop(rules) if x.dtype == np.float32 else None
        if kind == "same_range":
            loops.same_range_loop32(x, out, loop)
        elif kind == "magic":
            loops.nearest_even_loop32(x, out, loop)
        else:
            loops.nearest_even_loop(x, out, loop)
    elif mode == "stochastic":
        loops.stochastic_loop(x, out, loop, np.uint64(seed), np.uint64(offset))
    else:
        loops.directed_loop(x, out, loop, _DIRECTED_CODES[mode])


def nearest_even_compiled(rules: Rules, dtype):
    """``round_compiled(x, out, rules)`` for nearest even on contiguous 1-D ``dtype`` arrays,
    with the loop and its ``LoopRules`` chosen once (``round_to``'s common call resolves it
    per kind of call: the same loop, without choosing it again on every call)."""
    loops, loop = _loops(), loop_rules(rules)
    kind = float32_loop(rules) if np.dtype(dtype) == np.float32 else None
    if kind == "same_range":
        chosen = loops.same_range_loop32
    elif kind == "magic":
        chosen = loops.nearest_even_loop32
    else:
        chosen = loops.nearest_even_loop
    return functools.partial(chosen, r=loop)


def _loops():
    """The compiled loops' module, imported on first use (compiling costs seconds once)."""
    if not available():
        raise RuntimeError("the compiled rounding loops need Numba: pip install "
                           "'fpsim[fast]' (round_to uses the NumPy kernels without it)")
    from . import numba_loop
    return numba_loop
