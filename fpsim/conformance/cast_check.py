"""Compare a framework's cast of an array with fpsim's ``round_to``, mismatches by class.

The source is a float32 or float64 array; the framework's result may come as

- the format's own NumPy dtype: ``float16``, or an ``ml_dtypes`` type (``bfloat16``,
  ``float8_e4m3fn``, ...). ``np.save`` writes those as raw void bytes (``|V2``, ``|V1``),
  or, for ``float8_e5m2``, as ``<f1``, which NumPy cannot read back; ``load_array`` reads
  that as raw bytes too, and a raw array whose item size is the format's width is read as
  bit patterns;
- float32/float64 values (``tensor.float().numpy()``);
- raw bit patterns, uint8/uint16 (or int8/int16, e.g. ``tensor.view(torch.int16)``), with
  ``bits=True``; decoded with ``fpsim.encoding.decode``.

Each element is classified by the source and by *our* rounded value, and the two values
are compared exactly (NaN meets NaN; zeros compare with their signs)::

    nan        the source is NaN
    infinity   the source is +-inf
    overflow   a finite source whose rounded value is inf or NaN (or, with saturation,
               the largest finite value where the unsaturated rounding overflows; a value
               above the largest finite that rounds down to it is normal)
    zero       our value is +-0
    subnormal  0 < |ours| < min_normal
    normal     the rest

>>> import numpy as np
>>> src = np.float32([1.0, 1e-6, 1e5, np.nan])
>>> theirs = np.float16([1.0, 0.0, np.inf, np.nan])     # a cast that flushes subnormals
>>> report = check_cast(src, theirs, "fp16")
>>> report.agree, report.mismatches["subnormal"], report.counts["overflow"]
(False, 1, 1)
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..encoding import decode
from ..formats import Format, get
from ..rounding import MODES, round_to
from ..train.checkpoint import load_npy

__all__ = ["check_cast", "CastReport", "CLASSES", "result_values", "load_array",
           "compare_values"]

CLASSES = ("normal", "subnormal", "zero", "overflow", "infinity", "nan")


class CastReport(NamedTuple):
    """Counts per class (``counts``), mismatches per class (``mismatches``) and the first
    mismatching elements (``examples``: index, class, source, ours, theirs)."""

    format: str
    mode: str
    total: int
    counts: dict
    mismatches: dict
    examples: tuple

    @property
    def agree(self) -> bool:
        return not any(self.mismatches.values())

    @property
    def mismatch_count(self) -> int:
        return sum(self.mismatches.values())

    def __str__(self) -> str:
        verdict = ("all match" if self.agree else
                   f"{self.mismatch_count} mismatch{'es' if self.mismatch_count != 1 else ''}")
        lines = [f"cast to {self.format} ({self.mode}): {self.total} values, {verdict}",
                 f"  {'class':<10} {'values':>10} {'mismatches':>11}"]
        for name in CLASSES:
            lines.append(f"  {name:<10} {self.counts[name]:>10} {self.mismatches[name]:>11}")
        if self.examples:
            lines.append("  first mismatches (index: source -> ours | theirs):")
            for index, cls, src, ours, theirs in self.examples:
                lines.append(f"    {index} [{cls}]: {_show(src)} -> {_show(ours)} | "
                             f"{_show(theirs)}")
        return "\n".join(lines)


def _show(value: float) -> str:
    value = float(value)
    return repr(value) if not math.isfinite(value) else f"{value!r} ({value.hex()})"


def _unsigned(dtype: np.dtype):
    return {1: np.uint8, 2: np.uint16, 4: np.uint32}.get(dtype.itemsize)


def result_values(result: np.ndarray, fmt: "Format | str", *, bits: bool = False) -> np.ndarray:
    """The framework's result as float64 values (see the module docstring for the dtypes)."""
    fmt = get(fmt)
    result = _native(np.asarray(result))
    kind, name = result.dtype.kind, result.dtype.name
    if result.dtype.fields is not None or result.dtype.subdtype is not None:
        raise TypeError(f"the result is a structured array ({result.dtype}); give plain values "
                        f"or bit patterns, one per source value")
    bit_width = 8 * result.dtype.itemsize
    ml_float = kind == "V" and result.dtype.type is not np.void and _is_ml_float(result.dtype)
    if bits and (kind == "f" or ml_float):
        raise TypeError(f"bits=True reads unsigned/signed integer bit patterns, got "
                        f"{name} values; drop --bits for float data")
    if ml_float or kind == "f":
        with np.errstate(invalid="ignore", over="ignore"):     # signalling NaNs, as above
            return result.astype(np.float64)
    if kind == "V":                                 # np.save of an ml_dtypes array: raw bytes
        if bit_width != _container_bits(fmt):
            raise TypeError(f"a raw {name} array ({bit_width}-bit items) cannot hold "
                            f"{fmt.name} ({fmt.bits} bits); save float32 values or bits")
        return decode(result.view(_unsigned(result.dtype)), fmt, np.float64)
    if kind in "ui":
        if not bits:
            raise TypeError(f"the result is an integer array ({name}); if it holds bit "
                            f"patterns pass bits=True (--bits), else save the cast values as "
                            f"floats")
        if _unsigned(result.dtype) is None or bit_width != _container_bits(fmt):
            raise TypeError(f"{fmt.name} bit patterns need {_container_bits(fmt)}-bit items "
                            f"({fmt.bit_dtype}), got {name}")
        return decode(result.view(_unsigned(result.dtype)), fmt, np.float64)
    raise TypeError(f"the result must be float16/bfloat16/float8 (ml_dtypes), float32, "
                    f"float64 or bit patterns; got {name}")


def _container_bits(fmt: Format) -> int:
    return {"uint8": 8, "uint16": 16, "uint32": 32}[fmt.bit_dtype]


def _is_ml_float(dtype: np.dtype) -> bool:
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - ml_dtypes is a dependency
        return False
    try:
        ml_dtypes.finfo(dtype)
    except (TypeError, ValueError):
        return False
    return True


def _unsaturated(fmt: Format) -> Format:
    """``fmt`` rounding without saturation: its overflows become inf or NaN. A ``finite``
    format (FP4, FP6) always saturates; the IEEE format with one more exponent bit, the same
    bias and mantissa has the same values up to max_finite and rounds beyond it exactly where
    IEEE overflow would: what rounds beyond max_finite there (to 2**(emax+1) or more)."""
    if fmt.has_nan:
        return fmt.replace(saturate=False)
    return fmt.replace(exp_bits=fmt.exp_bits + 1, saturate=False, encoding="ieee")


def classify(source: np.ndarray, ours: np.ndarray, fmt: Format,
             mode: str = "nearest_even") -> np.ndarray:
    """Index into ``CLASSES`` for every element (see the module docstring)."""
    src, out = source.astype(np.float64), ours.astype(np.float64)
    cls = np.zeros(src.shape, np.int8)
    magnitude = np.abs(out)
    cls[(magnitude < fmt.min_normal)] = 1
    cls[out == 0] = 2
    finite = np.isfinite(src)
    overflow = finite & ~np.isfinite(out)
    if fmt.saturate:            # saturated where the format's own rounding would overflow
        unsaturated = round_to(source, _unsaturated(fmt), mode)
        overflow |= finite & ~(np.abs(unsaturated) <= fmt.max_finite)
    cls[overflow] = 3
    cls[np.isinf(src)] = 4
    cls[np.isnan(src)] = 5
    return cls


def check_cast(source, result, fmt: "Format | str", *, mode: str = "nearest_even",
               bits: bool = False, max_examples: int = 10) -> CastReport:
    """Round ``source`` to ``fmt`` with ``round_to(source, fmt, mode)`` and compare with the
    framework's ``result`` element by element; see the module docstring."""
    fmt = get(fmt)
    if mode not in MODES or mode == "stochastic":
        raise ValueError(f"mode must be a deterministic rounding mode: "
                         f"{', '.join(m for m in MODES if m != 'stochastic')}; got {mode!r}")
    source = _native(np.asarray(source))
    if source.dtype not in (np.float32, np.float64):
        raise TypeError(f"the source must be a float32 or float64 array (the values before the "
                        f"cast), got {source.dtype.name}")
    result = np.asarray(result)
    if result.shape != source.shape:
        raise ValueError(f"shapes differ: source {source.shape}, result {result.shape}; the "
                         f"result must be the element-by-element cast of the source")
    if source.size == 0:
        raise ValueError("the source is empty: nothing to compare (an empty comparison is "
                         "not an agreement)")
    theirs = result_values(result, fmt, bits=bits)
    with np.errstate(invalid="ignore"):     # signalling NaNs in float32 data
        ours = round_to(source, fmt, mode)
    return compare_values(source, ours, theirs, fmt, mode, max_examples)


def compare_values(source, ours, theirs, fmt: Format, mode: str, max_examples: int,
                   where=None) -> CastReport:
    """The ``CastReport`` of ``ours`` (fpsim's rounding of ``source`` to ``fmt``) against
    ``theirs`` (float64 values), by class; only the elements ``where`` is True (all if None)
    are counted. ``check_cast`` and the MX check share it."""
    ours = np.asarray(ours).astype(np.float64)
    with np.errstate(invalid="ignore"):
        cls = classify(source, ours, fmt, mode)
    nan_ours, nan_theirs = np.isnan(ours), np.isnan(theirs)
    same = (ours == theirs) & (np.signbit(ours) == np.signbit(theirs))
    same |= nan_ours & nan_theirs
    counted = np.ones(source.shape, bool) if where is None else where
    counts = {name: int(np.count_nonzero((cls == i) & counted))
              for i, name in enumerate(CLASSES)}
    mismatches = {name: int(np.count_nonzero((cls == i) & ~same & counted))
                  for i, name in enumerate(CLASSES)}
    examples = []
    for flat in np.flatnonzero(~same & counted)[:max_examples]:
        index = np.unravel_index(flat, source.shape)
        where = tuple(int(i) for i in index) if source.ndim != 1 else int(index[0])
        examples.append((where, CLASSES[cls.reshape(-1)[flat]], float(source.reshape(-1)[flat]),
                         float(ours.reshape(-1)[flat]), float(theirs.reshape(-1)[flat])))
    return CastReport(fmt.name, mode, int(np.count_nonzero(counted)), counts, mismatches,
                      tuple(examples))


def _native(array: np.ndarray) -> np.ndarray:
    """Numbers in the machine's byte order (big-endian files convert exactly)."""
    if array.dtype.kind in "biuf" and not array.dtype.isnative:
        return array.astype(array.dtype.newbyteorder("="))
    return array


def load_array(path, what: str) -> np.ndarray:
    """One ``.npy`` array (``fpsim.train.checkpoint.load_npy``: header and size checked before
    the data is read; ``<f1``, ml_dtypes' ``float8_e5m2``, read as raw bytes), with errors
    that say which file and why."""
    path = Path(path)
    if path.suffix == ".npz":
        raise ValueError(f"{what} file {str(path)!r} is an .npz archive of several arrays; "
                         f"give one .npy array")
    return load_npy(path, what, raw_float8=True)
