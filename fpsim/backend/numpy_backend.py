"""The NumPy backend: the reference implementation of the kernel interface, on the CPU.

Its speed tricks live here and in ``host_memory.py``, not in the engine: freed heap memory
kept for NumPy's temporaries, and gradient buffers kept without a copy when reference counts
show nobody else holds them (``is_unshared``).
"""
from __future__ import annotations

import sys

import numpy as np

from ..rounding import philox_uniforms, round_to, thread_scratch
from .host_memory import keep_freed_memory
from .interface import DTYPE_KINDS, Backend

__all__ = ["NumpyBackend"]

_UINT_OF = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}
_FLOAT_OF = {np.dtype(np.uint32): np.float32, np.dtype(np.uint64): np.float64}
_KINDS = {"bool": "b", "signed integer": "i", "unsigned integer": "u", "integral": "iu",
          "real floating": "f", "numeric": "iuf"}
assert set(_KINDS) == DTYPE_KINDS


class NumpyBackend(Backend):
    name = "numpy"
    xp = np
    container = np.float32

    def __init__(self):
        keep_freed_memory()    # NumPy's temporaries live in the host heap (host_memory.py)
        self._sole_refs = None

    def asarray(self, data, dtype=None):
        return np.asarray(data, dtype=self.container if dtype is None else dtype)

    def to_numpy(self, array):
        return np.asarray(array)

    def is_array(self, obj) -> bool:
        return isinstance(obj, np.ndarray)

    def to_list(self, array):
        return np.asarray(array).tolist()

    def host_bytes(self, array) -> bytes:
        return np.ascontiguousarray(array).tobytes()

    def astype(self, array, dtype, copy: bool = True):
        return array.astype(dtype, copy=copy)

    def copy(self, array):
        return np.array(array, copy=True)

    def size(self, array) -> int:
        return int(np.size(array))

    def scalar(self, value, dtype):
        return np.dtype(dtype).type(value)

    def isdtype(self, dtype, kind: str) -> bool:
        if kind not in _KINDS:
            raise ValueError(f"isdtype kind {kind!r} is not one of {sorted(DTYPE_KINDS)}")
        return np.dtype(dtype).kind in _KINDS[kind]

    def is_contiguous(self, array, order: str = "C") -> bool:
        flags = array.flags
        return flags.c_contiguous if order == "C" else flags.f_contiguous

    def bitcast(self, array, dtype):
        if np.dtype(dtype).itemsize != array.dtype.itemsize:
            raise TypeError(f"bitcast keeps the width: {array.dtype} cannot be read as {dtype}")
        return array.view(dtype)

    def bits(self, array):
        uint = _UINT_OF.get(np.dtype(array.dtype))
        if uint is None:
            raise TypeError(f"bits() takes float32 or float64 arrays, got {array.dtype}")
        return array.view(uint)

    def from_bits(self, pattern):
        flt = _FLOAT_OF.get(np.dtype(pattern.dtype))
        if flt is None:
            raise TypeError(f"from_bits() takes uint32 or uint64 arrays, got {pattern.dtype}")
        return pattern.view(flt)

    def is_unshared(self, array) -> bool:
        """C-ordered, and no dict, tuple, tensor or other view refers to its memory: its
        memory is its own, or a base array of the same size that only ``array`` refers to (a
        reshaped fresh result). Reference counts depend on how many frames pass the array
        along, so the count of "the caller's one local variable" is measured once, through
        the same path ``fpsim.backend.is_unshared`` takes, and checked: a fresh array alone is
        unshared, the same array also held by a list is not (else nothing is ever kept)."""
        refs = sys.getrefcount(array)
        if self._sole_refs == 0:              # calibrating: report the count seen
            self._seen = refs
            return False
        if self._sole_refs is None:
            self._calibrate()
        if not (array.flags.c_contiguous and refs == self._sole_refs):
            return False
        base = array.base
        if base is None:
            return array.flags.owndata
        # 3: the local name ``base``, array's reference to it, getrefcount's argument
        return (type(base) is np.ndarray and base.base is None and base.flags.owndata
                and base.nbytes == array.nbytes and sys.getrefcount(base) == 3)

    def _calibrate(self) -> None:
        from . import current, is_unshared   # the engine's path to this kernel
        if current() is not self:
            return
        self._sole_refs = 0
        fresh = np.empty(2)                   # held by this one local variable, as in the engine
        is_unshared(fresh)
        alone = self._seen
        holder = [fresh]
        is_unshared(fresh)
        shared = self._seen
        # -1: never matches, so every gradient is copied (always correct, only slower)
        self._sole_refs = alone if shared == alone + 1 and len(holder) == 1 else -1

    def round_to(self, x, fmt, mode="nearest_even", *, seed=None, offset=None,
                 subnormals=None, saturate=None, daz=False):
        return round_to(x, fmt, mode, seed=seed, offset=offset, subnormals=subnormals,
                        saturate=saturate, daz=daz)

    def uniforms(self, seed: int, offset: int, n: int):
        return philox_uniforms(seed, offset, n)

    def scratch(self, slot, dtype, n: int):
        return thread_scratch().get(slot, dtype, n)

    def errstate(self, **settings):
        return np.errstate(**settings)

    def versions(self) -> dict:
        return {"numpy": np.__version__}
