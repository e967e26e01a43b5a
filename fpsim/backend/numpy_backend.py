"""The NumPy backend: the reference implementation of the kernel interface, on the CPU."""
from __future__ import annotations

import numpy as np

from ..rounding import philox_uniforms, round_to, thread_scratch
from .host_memory import keep_freed_memory
from .interface import Backend

__all__ = ["NumpyBackend"]

_UINT_OF = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}
_FLOAT_OF = {np.dtype(np.uint32): np.float32, np.dtype(np.uint64): np.float64}


class NumpyBackend(Backend):
    name = "numpy"
    xp = np
    container = np.float32

    def __init__(self):
        keep_freed_memory()    # NumPy's temporaries live in the host heap (host_memory.py)

    def asarray(self, data, dtype=None):
        return np.asarray(data, dtype=self.container if dtype is None else dtype)

    def to_numpy(self, array):
        return np.asarray(array)

    def is_array(self, obj) -> bool:
        return isinstance(obj, np.ndarray)

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
