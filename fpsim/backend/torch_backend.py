"""The torch backend: PyTorch CPU tensors under the engine, with NumPy's bits.

``xp`` is ``TorchNamespace`` (``torch_namespace.py``: every ``NAMESPACE`` name, NumPy's
semantics for the argument forms the engine passes, torch's traps worked around there).
Rounding to a format and stochastic rounding's Philox draws are the portable reference
(``fpsim.rounding.portable``, the ``Backend`` defaults): torch's own low-precision casts are
never used (float64 -> float16/bfloat16 goes through float32 in torch: double rounding).

Tensors live on the CPU (device "cpu"), float32 is the container of every format.
torch has no unsigned arithmetic, shifts or order on uint32 / uint64: ``bits`` gives
uint32 / uint64 views as the interface says, and the engine uses only ``& | ^ ~ == !=`` on
them (the ``numpy-strict`` backend enforces it).
"""
from __future__ import annotations

import threading
from contextlib import nullcontext

import numpy as np
import torch

from .interface import DTYPE_KINDS, Backend
from .torch_namespace import TorchNamespace, torch_dtype

__all__ = ["TorchBackend"]

_UINT_OF = {torch.float32: torch.uint32, torch.float64: torch.uint64}
_FLOAT_OF = {torch.uint32: torch.float32, torch.uint64: torch.float64}
_SIGNED = {torch.int8, torch.int16, torch.int32, torch.int64}
_UNSIGNED = {torch.uint8, torch.uint16, torch.uint32, torch.uint64}
_KINDS = {"bool": lambda d: d == torch.bool, "signed integer": lambda d: d in _SIGNED,
          "unsigned integer": lambda d: d in _UNSIGNED,
          "integral": lambda d: d in _SIGNED or d in _UNSIGNED,
          "real floating": lambda d: d.is_floating_point and not d.is_complex,
          "numeric": lambda d: d != torch.bool and not d.is_complex}
assert set(_KINDS) == DTYPE_KINDS


class TorchBackend(Backend):
    name = "torch"
    xp = TorchNamespace()
    container = torch.float32
    device = "cpu"

    def __init__(self):
        self._local = threading.local()

    def asarray(self, data, dtype=None):
        return self.xp.asarray(data, self.container if dtype is None else dtype)

    def to_numpy(self, array):
        if isinstance(array, torch.Tensor):
            return array.detach().cpu().numpy()
        return np.asarray(array)

    def is_array(self, obj) -> bool:
        return isinstance(obj, torch.Tensor)

    def to_list(self, array):
        return self.to_numpy(array).tolist()

    def host_bytes(self, array) -> bytes:
        return np.ascontiguousarray(self.to_numpy(array)).tobytes()

    def astype(self, array, dtype, copy: bool = True):
        # float -> float casts between float32 and float64 round to nearest even in torch as
        # in NumPy (tests/test_torch_backend.py); no float16 casts are made by the engine
        return array.to(torch_dtype(dtype), copy=copy)

    def copy(self, array):
        return array.clone()

    def size(self, array) -> int:
        return array.numel() if isinstance(array, torch.Tensor) else int(np.size(array))

    def scalar(self, value, dtype):
        # a 0-d tensor: torch promotes it like NumPy's scalar of the same dtype (the n-d
        # operand's dtype wins within a category; the engine mixes no others)
        return torch.tensor(value, dtype=torch_dtype(dtype))

    def isdtype(self, dtype, kind: str) -> bool:
        if kind not in _KINDS:
            raise ValueError(f"isdtype kind {kind!r} is not one of {sorted(DTYPE_KINDS)}")
        return _KINDS[kind](torch_dtype(dtype))

    def is_contiguous(self, array, order: str = "C") -> bool:
        if order == "C":
            return array.is_contiguous()
        return array.permute(*reversed(range(array.ndim))).is_contiguous()

    def bitcast(self, array, dtype):
        dtype = torch_dtype(dtype)
        if dtype.itemsize != array.dtype.itemsize:
            raise TypeError(f"bitcast keeps the width: {array.dtype} cannot be read as {dtype}")
        return array.view(dtype)

    def bits(self, array):
        uint = _UINT_OF.get(array.dtype)
        if uint is None:
            raise TypeError(f"bits() takes float32 or float64 arrays, got {array.dtype}")
        return array.view(uint)

    def from_bits(self, pattern):
        flt = _FLOAT_OF.get(pattern.dtype)
        if flt is None:
            raise TypeError(f"from_bits() takes uint32 or uint64 arrays, got {pattern.dtype}")
        return pattern.view(flt)

    def scratch(self, slot, dtype, n: int):
        """A per-thread buffer per (slot, dtype), grown to the largest n asked for."""
        buffers = self._local.__dict__.setdefault("buffers", {})
        key = (slot, torch_dtype(dtype))
        buffer = buffers.get(key)
        if buffer is None or buffer.numel() < n:
            buffer = buffers[key] = torch.empty(n, dtype=key[1])
        return buffer[:n]

    def errstate(self, **settings):
        """torch raises no floating-point warnings: nothing to silence."""
        return nullcontext()

    def versions(self) -> dict:
        return {"torch": torch.__version__, "numpy": np.__version__}
