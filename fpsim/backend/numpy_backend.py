"""The NumPy backend: the reference implementation of the kernel interface, on the CPU.

Its speed tricks live here and in ``host_memory.py``, not in the engine: freed heap memory
kept for NumPy's temporaries, gradient buffers kept without a copy when reference counts
show nobody else holds them (``is_unshared``), and a namespace whose reshape and reductions
call the array's own methods (the same C code as ``numpy.reshape`` / ``numpy.sum``, without
their Python dispatch: 0.6 to 1.2 us a call, about a thousand calls per training step).
"""
from __future__ import annotations

import importlib
import sys
from types import SimpleNamespace

import numpy as np

from ..rounding import compiled_enabled, philox_uniforms, round_to, thread_scratch
from .host_memory import keep_freed_memory
from .interface import DTYPE_KINDS, FUSED_KERNELS, NAMESPACE, Backend

__all__ = ["NumpyBackend"]

#: where each fused kernel's Numba loop lives (modules imported on first use: Numba compiles
#: on the first call, then loads its cache)
_FUSED_SOURCES = {"exp": "numba_elementary", "normal_tail": "numba_elementary",
                  "certify_fp32_open": "numba_certificate",
                  "certified_row_sums": "numba_sums", "exact_dots": "numba_dots",
                  "softmax_row_terms": "numba_softmax", "softmax_proxy": "numba_softmax",
                  "unfold": "numba_im2col",
                  "widen_with_norms": "numba_widening"}
assert set(_FUSED_SOURCES) == FUSED_KERNELS

_KINDS = {"bool": "b", "signed integer": "i", "unsigned integer": "u", "integral": "iu",
          "real floating": "f", "numeric": "iuf"}
assert set(_KINDS) == DTYPE_KINDS


def _by_method(name: str):
    """``numpy.<name>(a, ...)`` as ``a.<name>(...)`` for ndarrays (same results: NumPy's
    function calls the method after its dispatch), the function itself for anything else."""
    function, method = getattr(np, name), getattr(np.ndarray, name)

    def call(a, *args, **kwargs):
        if type(a) is np.ndarray:
            return method(a, *args, **kwargs)
        return function(a, *args, **kwargs)
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"numpy.{name}, through ndarray.{name} for ndarrays"
    return call


def numpy_namespace() -> SimpleNamespace:
    """NumPy's ``NAMESPACE`` functions, with reshape and the reductions by method."""
    names = {attr: getattr(np, attr) for attr in NAMESPACE}
    names.update({attr: _by_method(attr) for attr in ("reshape", "sum", "max", "min", "any",
                                                      "all")})
    return SimpleNamespace(**names)


class NumpyBackend(Backend):
    name = "numpy"
    xp = numpy_namespace()
    container = np.float32
    bit_dtypes = {np.dtype(np.float32): np.dtype(np.uint32),
                  np.dtype(np.float64): np.dtype(np.uint64)}

    def __init__(self):
        keep_freed_memory()    # NumPy's temporaries live in the host heap (host_memory.py)
        self._sole_refs = None

    def asarray(self, data, dtype=None):
        return np.asarray(data, dtype=self.container if dtype is None else dtype)

    def to_numpy(self, array):
        return np.asarray(array)

    def is_array(self, obj) -> bool:
        return isinstance(obj, np.ndarray)

    def astype(self, array, dtype, copy: bool = True):
        return array.astype(dtype, copy=copy)

    def copy(self, array):
        return np.array(array, copy=True)

    def size(self, array) -> int:
        return array.size if type(array) is np.ndarray else int(np.size(array))

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

    def zero_where(self, mask, values):
        """As an AND with an all-zeros / all-ones mask on float32: five to ten times faster
        than ``numpy.where`` with a scalar, the same bits (+0 is the all-zero pattern)."""
        if values.dtype != np.float32 or values.shape != mask.shape:
            return super().zero_where(mask, values)
        keep = mask.astype(np.int32)
        keep -= 1                                    # 1 -> 0, 0 -> -1 (all 32 bits set)
        return np.bitwise_and(values.view(np.int32), keep, out=keep).view(np.float32)

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

    def fused(self, kernel: str):
        """The Numba loop of ``kernel`` where the compiled loops are on
        (``fpsim.rounding.use_compiled``, the default where Numba is installed), else None."""
        if not compiled_enabled():
            return None
        return _fused_kernel(kernel)

    def versions(self) -> dict:
        return {"numpy": np.__version__}


def _fused_kernel(kernel: str):
    """``kernel``'s function from its module (``_FUSED_SOURCES``), imported once."""
    found = _FUSED.get(kernel)
    if found is None:
        if kernel not in FUSED_KERNELS:
            raise ValueError(f"fused kernel {kernel!r} is not one of {sorted(FUSED_KERNELS)}")
        module = importlib.import_module(f"{__package__}.{_FUSED_SOURCES[kernel]}")
        found = _FUSED[kernel] = getattr(module, kernel)
    return found


_FUSED: dict = {}
