"""Values to a format: ``round_to``, every rounding mode, one rounding, exact.

Where the rounding happens, and how:

- Input is a float32 or float64 container (array or scalar). Its values are rounded once,
  directly to the target format; a float64 input is never rounded through float32 first.
  A Python int or ``Fraction`` is exact too: rounded to odd into float64 first
  (``float64_round_to_odd``), it still rounds once, however many bits it has.
- Output has the input's container dtype and holds values exactly representable in the
  format (or inf/NaN), so ``round_to(round_to(x, f), f)`` is ``round_to(x, f)``.
- Round to nearest, ties to even, on float32 input is the hot path of every simulation; it runs
  the magic-number kernel in ``_kernels`` (or ml_dtypes' exact bfloat16 cast for plain bf16),
  chunk by chunk in cache, on up to two threads. Every other case takes the float64 kernel
  that handles every mode: NumPy passes, or, where Numba is installed (``fpsim[fast]``), the
  same arithmetic compiled into one loop with the Philox draw inside (``compiled``; stochastic
  rounding about ten times faster; ``use_compiled`` chooses). All give the same bits; the
  tests check them against each other, against MPFR, Berkeley TestFloat, numpy.float16 and
  ml_dtypes.
- Other array libraries: ``portable.round_to_portable`` and ``philox_uniforms_portable``
  compute the same bits from a backend's array namespace and kernels only (no unsigned
  arithmetic), so a new backend gets every mode by construction; these NumPy kernels are the
  NumPy backend's faster implementation of them.

Overflow follows IEEE 754: nearest modes go to infinity, directed modes go to infinity only in
their own direction and to the largest finite value otherwise; stochastic rounding overflows
like the nearest modes when it picks the neighbour above the largest finite value. Formats
without infinity (``fn``, ``fnuz``) give NaN where IEEE would give infinity, as ml_dtypes'
casts do (of PyTorch 2.13's float8 casts, ``float8_e4m3fn`` saturates instead, infinities
included: ``saturate=True``; ``float8_e5m2`` gives inf and the ``fnuz`` casts NaN, as here).
Saturation (the format's, or the ``saturate`` argument) clamps every overflow, infinite
inputs included, to the largest finite value; NaN stays NaN. Formats with neither infinity nor
NaN (``finite``: OCP FP4 E2M1, FP6 E2M3 and E3M2) always saturate, in every mode, as the OCP
MX spec's conversions and ml_dtypes' casts do (``saturate=False`` raises ``ValueError``); a
NaN input stays NaN (the quiet NaN with its sign) in the container, where ml_dtypes' cast
writes a zero of the other sign: no NaN turns into a number here.

Every call first checks that the thread's floating-point environment is IEEE's default
(``environment``): another rounding mode, flush-to-zero or denormals-are-zero would change
these bits silently, so they raise ``FloatingPointError`` instead.
"""
from __future__ import annotations

import enum
import functools
import os
from concurrent.futures import ThreadPoolExecutor
from numbers import Rational, Real

import numpy as np

from ..formats import BF16, FP16, Format, get
from ..options import check_choice, check_count_between, check_flag, check_instance
from ._kernels import (Rules, magic_applies, round_any_mode, round_nearest_even_magic,
                       thread_scratch)
from ._philox import SEED_MAX, philox4x32, philox_uniforms
from .compiled import available as compiled_available
from .compiled import nearest_even_compiled, round_compiled
from .environment import check_environment
from .rational import float64_round_to_odd

__all__ = ["round_to", "MODES", "RoundingMode", "philox_uniforms", "philox4x32",
           "float64_round_to_odd", "use_compiled", "compiled_enabled"]


class RoundingMode(str, enum.Enum):
    """The rounding modes, as names that are their strings too: ``RoundingMode.UP == "up"``,
    so either is accepted wherever a mode is, and a member compares, hashes and is written
    to JSON as its string.

    >>> RoundingMode.NEAREST_EVEN == "nearest_even", RoundingMode("toward_zero").name
    (True, 'TOWARD_ZERO')
    >>> round_to(70000.0, "fp16", RoundingMode.TOWARD_ZERO)
    65504.0
    """

    NEAREST_EVEN = "nearest_even"
    NEAREST_AWAY = "nearest_away"
    TOWARD_ZERO = "toward_zero"
    UP = "up"
    DOWN = "down"
    STOCHASTIC = "stochastic"

    def __str__(self) -> str:
        return self.value


MODES = tuple(mode.value for mode in RoundingMode)     # the plain strings, as before

_CHUNK = 1 << 17          # elements per chunk: four 512 KiB work arrays stay in a 2 MiB L2
# From here on, two threads. Below it they cost more CPU time than they save wall time:
# measured on 2 cores, one thread 0.39 ms CPU for 256K fp16 roundings, two 0.48 ms (1M:
# 1.5 vs 1.7 ms), and in a training step the extra CPU time shows (matrix products run
# their own threads).
_PARALLEL_MIN = 1 << 21
_THREADS = max(1, min(2, os.cpu_count() or 1))
_pool: ThreadPoolExecutor | None = None


def round_to(x, fmt: "Format | str", mode: str = "nearest_even", *, seed=None, offset=None,
             rng=None, subnormals: bool | None = None, saturate: bool | None = None,
             daz: bool = False):
    """Round ``x`` to the format ``fmt``; return the same kind of container with exact values.

    Parameters
    ----------
    x : float32 or float64 ndarray (either byte order; the result is in the machine's),
        NumPy float32/float64 scalar, or a Python float, int or ``Fraction``: exact
        rationals are rounded once, whatever their size (``stochastic`` takes those that
        float64 holds)
    fmt : a ``Format`` or a name (``"fp16"``, ``"bf16"``, ``"e4m3"``, ``"e5m10"``, ...)
    mode : one of ``MODES`` (or its ``RoundingMode``):
        ``"nearest_even"`` (IEEE default), ``"nearest_away"`` (ties away from zero),
        ``"toward_zero"``, ``"up"`` (toward +inf), ``"down"`` (toward -inf), ``"stochastic"``
        (to the upper neighbour in magnitude with probability equal to the distance from the
        lower one, in units of the gap; never anything but one of the two neighbours).
    seed, offset : integers in [0, 2**64), for ``"stochastic"`` only. Element i (C order) is
        rounded with the uniform ``philox_uniforms(seed, offset + i)`` (Philox4x32-10, 53-bit
        uniforms, probabilities resolved to 2**-53), so the bits depend only on seed, offset
        and shape, never on threads or chunking; give successive calls fresh offsets (e.g.
        advance by ``x.size``) for fresh streams. ``offset`` defaults to 0.
    rng : ``numpy.random.Generator``, the older way to seed ``"stochastic"``: it draws one key,
        ``rng.integers(0, 2**64, dtype=uint64)``, and rounds as ``seed=key, offset=0``.
        (Before Philox, it drew ``x.size`` doubles with ``rng.random``: the bits changed.)
        ``"stochastic"`` takes exactly one of seed and rng; other modes refuse seed/offset/rng.
    subnormals : False flushes subnormal results to zero of the same sign (after rounding);
        None uses the format's own setting.
    saturate : True sends overflow (and infinite inputs) to the largest finite value of the same
        sign; None uses the format's own setting.
    daz : "denormals are zero": inputs below the format's smallest normal, in magnitude, are
        read as zero of the same sign before rounding.

    Algorithm (both kernels)::

        e = floor(log2(|x|));  q = 2 ** (max(e, emin) - man_bits)   # the quantum near x
        r = round_mode(|x| / q) * q                                  # exact scalings
        r = overflow_rule(r);  r = flush(r);  return copysign(r, x)

    >>> round_to(0.1, "fp16")
    0.0999755859375
    >>> round_to(2.0 ** -25, "fp16"), round_to(2.0 ** -25 * 1.0001, "fp16") == 2.0 ** -24
    (0.0, True)
    >>> round_to(70000.0, "fp16"), round_to(70000.0, "fp16", "toward_zero")
    (inf, 65504.0)
    """
    check_environment()
    if (type(x) is np.ndarray and isinstance(fmt, (Format, str)) and mode == "nearest_even"
            and subnormals is None
            and saturate is None and daz is False and seed is None and offset is None
            and rng is None and x.flags.c_contiguous):
        # the common call (format's own rules, native float32/float64 array), resolved once
        kernel = _default_kernel(fmt, x.dtype, _compiled_enabled)
        if kernel is not None and x.size < _PARALLEL_MIN:
            out = np.empty(x.shape, x.dtype)
            kernel(x.reshape(-1), out.reshape(-1))
            return out
    fmt = get(fmt)
    seed, offset = check_options(mode, seed, offset, rng, subnormals, saturate, daz)
    array, wrap = _as_container(x, mode)
    rules, kernel = _plan(fmt, fmt.subnormals if subnormals is None else bool(subnormals),
                          fmt.saturate if saturate is None else bool(saturate), bool(daz),
                          array.dtype, mode, _compiled_enabled)
    out = np.empty_like(array, order="C")
    flat_in = np.ascontiguousarray(array).reshape(-1)
    flat_out = out.reshape(-1)
    if mode == "stochastic" and offset + flat_in.size > 2**64:
        raise ValueError(f"offset + x.size must not pass 2**64 (offset={offset})")
    if kernel == "compiled":
        # threads get global element indices, so the bits do not depend on the split
        _run_parallel(lambda src, dst, start: round_compiled(
            src, dst, rules, mode, seed or 0, (offset or 0) + start), flat_in, flat_out)
    elif kernel == "bf16":
        _run_parallel(lambda src, dst, start: _bf16_via_ml_dtypes(src, dst), flat_in, flat_out)
    elif kernel == "magic":
        _run_parallel(lambda src, dst, start: _magic_chunks(src, dst, rules), flat_in, flat_out)
    elif kernel == "magic64":
        # 8-exponent-bit formats (tf32, fp32...) and 22-bit significands in float32: widen
        # each chunk (exact).
        _run_parallel(lambda src, dst, start: _magic_chunks(src, dst, rules, widen=True),
                      flat_in, flat_out)
    else:
        _run_parallel(lambda src, dst, start: _any_mode_chunks(
            src, dst, rules, mode, seed, None if offset is None else offset + start),
            flat_in, flat_out)
    return wrap(out)


@functools.lru_cache(maxsize=512)
def _plan(fmt: Format, subnormals: bool, saturate: bool, daz: bool, dtype, mode: str,
          compiled: bool):
    """(rules, kernel) for one kind of call, resolved once: the kernel is "compiled" (the
    Numba loops, every mode, where ``use_compiled`` is on), "bf16" (ml_dtypes' cast),
    "magic" (the branch-free kernel in the container), "magic64" (widened to float64
    first) or "any" (the every-mode kernel). A call costs a few microseconds of Python
    besides the kernels; this resolution used to cost more than that."""
    rules = Rules.of(fmt, subnormals=subnormals, saturate=saturate, daz=daz)
    if compiled:
        return rules, "compiled"
    if mode == "nearest_even" and _is_plain_bf16(fmt, rules, dtype):
        return rules, "bf16"
    if mode == "nearest_even" and magic_applies(rules, dtype):
        return rules, "magic"
    if mode == "nearest_even" and magic_applies(rules, np.float64):
        return rules, "magic64"
    return rules, "any"


@functools.lru_cache(maxsize=512)
def _default_kernel(fmt: "Format | str", dtype, compiled: bool):
    """The one-thread kernel ``round_to(x, fmt)`` runs on a native C-ordered ``dtype`` array
    with every option at its default, as ``kernel(flat_src, flat_dst)``; None where that
    call takes the general route (other dtypes, the every-mode kernel). Same plan as
    ``_plan``: the fast route only skips re-checking the arguments."""
    if dtype not in (np.float32, np.float64):
        return None
    fmt = get(fmt)
    rules, kernel = _plan(fmt, fmt.subnormals, fmt.saturate, False, dtype, "nearest_even",
                          compiled)
    if kernel == "compiled":
        return nearest_even_compiled(rules, dtype)
    if kernel == "bf16":
        return _bf16_via_ml_dtypes
    if kernel in ("magic", "magic64"):
        magic = functools.partial(_magic_chunks, rules=rules, widen=kernel == "magic64")
        return functools.partial(_small_by_float16_cast, magic=magic) if fmt == FP16 else magic
    return None


_FLOAT16_CAST_BELOW = 2048   # measured crossover with the magic kernel's fixed cost (~3000)


def _small_by_float16_cast(src: np.ndarray, dst: np.ndarray, magic) -> None:
    """``magic(src, dst)`` for IEEE fp16 with its own rules, through NumPy's float16 cast on
    small arrays: an IEEE nearest-even conversion with subnormals and overflow to inf (the
    same values), whose NaNs alone go through ``magic`` (round_to's payload rule)."""
    if src.size >= _FLOAT16_CAST_BELOW:
        magic(src, dst)
        return
    with np.errstate(over="ignore", invalid="ignore"):
        dst[...] = src.astype(np.float16)
    nans = np.flatnonzero(np.isnan(dst))
    if nans.size:
        settled = np.empty(nans.size, dst.dtype)
        magic(src[nans], settled)
        dst[nans] = settled


def check_options(mode: str, seed=None, offset=None, rng=None, subnormals=None,
                  saturate=None, daz=False) -> tuple:
    """``round_to``'s checks of its options, shared with every other implementation of its
    contract (``fpsim.rounding.portable``), so that all refuse the same calls with the same
    messages: a mode of ``MODES``; for ``"stochastic"`` exactly one of seed and rng, else
    none of seed, offset, rng; flags True, False or None. Returns ``(seed, offset)``: the
    Philox key and first counter of a stochastic call (Python ints; rng draws the key), the
    arguments as given otherwise."""
    check_choice("rounding mode", mode, MODES)
    if mode == "stochastic":
        seed, offset = _stochastic_key(seed, offset, rng)
    elif seed is not None or offset is not None or rng is not None:
        raise ValueError(f"seed, offset and rng are only used by mode='stochastic', "
                         f"not by mode={mode!r}")
    for label, flag in (("subnormals", subnormals), ("saturate", saturate), ("daz", daz)):
        if flag is not None and not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{label} must be True, False or None (the format's own rule), got "
                            f"{flag!r}")
    return seed, offset


def _stochastic_key(seed, offset, rng) -> tuple[int, int]:
    if (seed is None) == (rng is None):
        raise ValueError("mode='stochastic' needs exactly one of seed=int (with optional "
                         "offset=) or rng=numpy.random.Generator, so that runs repeat")
    if rng is not None:
        check_instance("rng", rng, np.random.Generator, "a numpy.random.Generator")
        if offset is not None:
            raise ValueError("offset goes with seed=, not with rng=")
        return int(rng.integers(0, 2**64, dtype=np.uint64)), 0
    return (check_count_between("seed", seed, 0, SEED_MAX),
            check_count_between("offset", 0 if offset is None else offset, 0, SEED_MAX))


def _as_container(x, mode):
    """Turn the input into a float32/float64 ndarray and a function giving the output back in
    the input's own kind (Python float, NumPy scalar or array). Another library's array
    that converts itself to NumPy (``__array__``) is taken as that NumPy array."""
    if not isinstance(x, (np.ndarray, np.generic)) and hasattr(x, "__array__"):
        x = np.asarray(x)
    if isinstance(x, np.ndarray):
        if x.dtype.kind == "f" and x.dtype.itemsize in (4, 8) and not x.dtype.isnative:
            x = x.astype(x.dtype.newbyteorder("="))   # big-endian data: same values, our order
        if x.dtype not in (np.float32, np.float64):
            raise TypeError(dtype_message(x.dtype))
        return x, lambda out: out
    if isinstance(x, (np.float32, np.float64)):
        return np.asarray(x), lambda out: out[()]
    if isinstance(x, np.generic):
        raise TypeError(dtype_message(x.dtype))
    if isinstance(x, Rational) and not isinstance(x, bool):
        # int, Fraction: float64 may not hold them; rounded to odd, they still round once
        # (``rational``), in every deterministic mode
        proxy = float64_round_to_odd(x)
        if mode == "stochastic" and proxy != x:
            raise ValueError(f"stochastic rounding takes values that float64 holds exactly; "
                             f"{x!r} is not one (its probabilities would be a proxy's)")
        return np.asarray(proxy, np.float64), lambda out: float(out[()])
    if isinstance(x, Real) and not isinstance(x, bool):
        return np.asarray(float(x), np.float64), lambda out: float(out[()])
    raise TypeError(f"round_to takes float32/float64 arrays or real scalars, "
                    f"got {type(x).__name__}")


def dtype_message(dtype) -> str:
    """What ``round_to`` (and ``fpsim.rounding.portable``) says of data neither float32 nor
    float64; ``dtype`` may be another array library's (``torch.float16``)."""
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = str(dtype)
    return (f"round_to takes float32 or float64 data, got {name}; convert first "
            f"(float16/bfloat16/float8 to float32 is exact)")


def _is_plain_bf16(fmt: Format, rules: Rules, dtype) -> bool:
    # ml_dtypes' float32 -> bfloat16 cast is exact round-to-nearest-even with subnormals,
    # overflow to inf and NaN kept: the same bits as ours (tests check it), and faster.
    return (dtype == np.float32 and rules.subnormals and not rules.saturate and not rules.daz
            and fmt.replace(subnormals=True, saturate=False) == BF16)


def _chunks(n: int):
    for start in range(0, n, _CHUNK):
        yield start, min(start + _CHUNK, n)


def _magic_chunks(src: np.ndarray, dst: np.ndarray, rules: Rules, widen: bool = False) -> None:
    scratch = thread_scratch()
    with np.errstate(over="ignore", invalid="ignore"):
        if not widen and src.size <= _CHUNK:
            round_nearest_even_magic(src, dst, rules, scratch)
            return
        for lo, hi in _chunks(src.size):
            if widen:
                wide_out = scratch.get(3, np.float64, hi - lo)
                round_nearest_even_magic(src[lo:hi].astype(np.float64), wide_out, rules,
                                         scratch)
                dst[lo:hi] = wide_out
            else:
                round_nearest_even_magic(src[lo:hi], dst[lo:hi], rules, scratch)


def _bf16_via_ml_dtypes(src: np.ndarray, dst: np.ndarray) -> None:
    import ml_dtypes

    staging = np.empty(max(1, min(1 << 16, src.size)), ml_dtypes.bfloat16)
    with np.errstate(over="ignore", invalid="ignore"):  # per thread: NaN and inf are expected
        for start in range(0, src.size, staging.size):
            stop = min(start + staging.size, src.size)
            part = staging[: stop - start]
            np.copyto(part, src[start:stop], casting="unsafe")
            np.copyto(dst[start:stop], part, casting="unsafe")
            _keep_bf16_nan_payloads(src[start:stop], dst[start:stop])


def _keep_bf16_nan_payloads(src: np.ndarray, dst: np.ndarray) -> None:
    # ml_dtypes writes the canonical NaN; our rule (settle_nans) keeps sign and top payload.
    # np.max propagates NaN: one read-only pass answers "any NaN?" without writing a mask.
    if src.size and np.isnan(np.max(src)):
        nans = np.isnan(src)
        kept = (src.view(np.uint32)[nans] & np.uint32(0xFFFF0000)) | np.uint32(0x00400000)
        dst.view(np.uint32)[nans] = kept


def _any_mode_chunks(src, dst, rules: Rules, mode: str, seed, offset) -> None:
    with np.errstate(over="ignore", invalid="ignore"):
        for lo, hi in _chunks(src.size):
            # global element indices: the bits do not depend on the chunking
            uniforms = (philox_uniforms(seed, offset + lo, hi - lo) if mode == "stochastic"
                        else None)
            round_any_mode(src[lo:hi].astype(np.float64), dst[lo:hi], rules, mode, uniforms)


_compiled_enabled = compiled_available()


def use_compiled(enabled: bool) -> bool:
    """Choose the every-mode kernel ``round_to`` runs (stochastic and directed modes, and
    nearest-even where the magic kernel does not apply): the compiled loop (``compiled``,
    the default where Numba is installed) or the NumPy passes (the reference; the default
    without Numba). Both give the same bits; the tests force each. Returns the previous
    choice, so that a caller can restore it."""
    global _compiled_enabled
    enabled = check_flag("enabled", enabled)
    if enabled and not compiled_available():
        raise ValueError("use_compiled(True) needs Numba, which is not installed; "
                         "pip install 'fpsim[fast]'")
    previous, _compiled_enabled = _compiled_enabled, enabled
    return previous


def compiled_enabled() -> bool:
    """Whether the compiled loops run (``use_compiled``): ``round_to``'s every-mode kernel and
    the NumPy backend's fused kernels (``fpsim.backend.fused``) read this one switch."""
    return _compiled_enabled


def _run_parallel(kernel, src: np.ndarray, dst: np.ndarray) -> None:
    """Split an elementwise kernel over threads; the bits do not depend on the split.
    ``kernel(src, dst, start)`` gets its slices and the global index of their first element."""
    global _pool
    if _THREADS == 1 or src.size < _PARALLEL_MIN:
        kernel(src, dst, 0)
        return
    if _pool is None:
        _pool = ThreadPoolExecutor(_THREADS, thread_name_prefix="fpsim-round")
    bounds = [src.size * i // _THREADS for i in range(_THREADS + 1)]
    futures = [_pool.submit(kernel, src[lo:hi], dst[lo:hi], lo)
               for lo, hi in zip(bounds[:-1], bounds[1:])]
    for future in futures:
        future.result()
