"""The array library the engine computes with: the one place its differences live.

Today the backend is NumPy on the CPU, and this module is only the start of the seam: the
tensor class creates and exports its arrays through ``asarray`` / ``to_numpy`` and containers
come from ``CONTAINER``, but the exact-arithmetic kernels (``fpsim.exact``), the rounding
kernels, the ops, the optimizers and the scalers still call NumPy directly. A second array
library (CuPy, torch) needs those calls behind a kernel interface first; until then,
``name`` is always ``"numpy"``. What is already independent of the array library: stochastic
rounding's uniforms (Philox4x32-10 keyed by seed and element position,
``fpsim.rounding.philox_uniforms``), the transcendentals (no libm, ``fpsim.exact``), and the
gather gradient's scatter-add (exact totals, no order).

Containers: a value of any fpsim ``Format`` lives in a float32 array (every format fits one
exactly, see ``fpsim.formats``); the float64 reference mode of ``fpsim.autograd`` keeps float64
arrays. Integer arrays carry labels and indices.

>>> import numpy as np
>>> from fpsim import backend
>>> backend.name
'numpy'
>>> hex(int(backend.bits(backend.asarray([1.0]))[0]))
'0x3f800000'
>>> float(backend.from_bits(backend.xp.asarray([0x3F80], np.uint32) << 16)[0])  # bf16 1.0
1.0
"""
from __future__ import annotations

import numpy as np

__all__ = ["name", "xp", "asarray", "to_numpy", "is_array", "bits", "from_bits", "CONTAINER"]

name = "numpy"
xp = np
CONTAINER = np.float32  # the container of every fpsim Format

_UINT_OF = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}
_FLOAT_OF = {np.dtype(np.uint32): np.float32, np.dtype(np.uint64): np.float64}


def asarray(data, dtype=CONTAINER):
    """``data`` (array, nested lists, scalar) as a backend array of ``dtype``; no copy when it
    already is one. Converting float64 data to float32 rounds (to nearest even), so callers that
    need one exact rounding into a narrower format convert from float64 themselves."""
    return xp.asarray(data, dtype=dtype)


def to_numpy(array) -> np.ndarray:
    """A NumPy array with the same values (the identity for the NumPy backend)."""
    return np.asarray(array)


def is_array(obj) -> bool:
    return isinstance(obj, xp.ndarray)


def bits(array):
    """The IEEE bit patterns of a float32 (float64) array as uint32 (uint64), without a copy."""
    uint = _UINT_OF.get(np.dtype(array.dtype))
    if uint is None:
        raise TypeError(f"bits() takes float32 or float64 arrays, got {array.dtype}")
    return array.view(uint)


def from_bits(pattern):
    """Inverse of ``bits``: a uint32 (uint64) array read as float32 (float64), without a copy."""
    flt = _FLOAT_OF.get(np.dtype(pattern.dtype))
    if flt is None:
        raise TypeError(f"from_bits() takes uint32 or uint64 arrays, got {pattern.dtype}")
    return pattern.view(flt)
