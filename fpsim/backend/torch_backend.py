"""The torch backend: PyTorch tensors under the engine, on the CPU or a CUDA device, with
NumPy's bits.

``xp`` is ``TorchNamespace`` (``torch_namespace.py``: every ``NAMESPACE`` name, NumPy's
semantics for the argument forms the engine passes, torch's traps worked around there).
Rounding to a format is torch's own cast where that gives the same bits (float32 to fp16,
bf16 and e4m3fn, nearest even: ``torch_rounding.py``), else the portable reference
(``fpsim.rounding.portable``, the ``Backend`` default), as are stochastic rounding's Philox
draws; float64 is never cast to float16/bfloat16 by torch (it goes through float32: double
rounding).

Float32 is the container of every format. torch has no unsigned arithmetic, shifts or order
on uint32 / uint64: ``bits`` gives uint32 / uint64 views as the interface says, and the
engine uses only ``& | ^ ~ == !=`` on them (the ``numpy-strict`` backend enforces it). This
module holds the kernels and the namespace's shape, creation and indexing functions;
``torch_namespace.py`` the arithmetic.

Devices: ``"torch"`` is the CPU; ``"torch:cuda"`` and ``"torch:cuda:N"`` put every tensor
the engine makes on that GPU (``torch_namespace.PLACEMENT``, set by ``activate``). What the
CUDA path does about CUDA's own traps: divisors are never CPU scalars (a Python scalar takes
the device of the tensor it meets, and the ``numpy-strict`` backend refuses ``x / c`` and
``c / x`` with host scalars in engine code: CUDA computes ``x / c`` as ``x * (1/c)``, and
torch's ``c / x`` is ``reciprocal(x) * c`` everywhere); no fused op (``addcmul``, ``lerp``,
``add(alpha=)``) is in the namespace, so nothing contracts ``a*b+c`` into an FMA; TF32 is
switched off when a CUDA backend is chosen, and cuBLAS's GEMM emulation refused
(``cuda_problem``); float64 products may take any summation order (the exact layer certifies
them). NaN payloads of CUDA arithmetic are canonical; the engine's results do not depend on
payloads, and the parity tests that check payloads on the CPU are marked where CUDA differs.

Status (issue 24): registered as ``"torch"`` when PyTorch is installed. With NumPy's bits on
the CPU: every namespace function on special values, rounding to every format in every mode,
Philox, accumulation.matmul under every model, whole training runs, the engine's own test
files (``tests/test_strict_backend.py``'s list, run under ``FPSIM_BACKEND=torch`` by
``tests/test_torch_backend.py``) and ``fpsim reproduce --quick``. The same tests on
``torch:cuda`` are marked ``gpu`` (run with ``-m gpu`` on a machine with a CUDA device); they
are written but have not yet run on one (the GPU issue runs them). The reductions
``max``/``min`` do not reproduce which signed zero or NaN payload NumPy returns on ties
(NumPy's own answer depends on its SIMD path).
"""
from __future__ import annotations

import math
import os
import threading
from contextlib import nullcontext

import numpy as np
import torch

from ..formats import get
from . import torch_namespace as arithmetic
from .interface import DTYPE_KINDS, Backend
from .tuning import GPU_TUNING
from .torch_rounding import cast_round
from .torch_namespace import (DTYPES, PLACEMENT, as_tensor, flatnonzero, from_host, host_dtype,
                              operands, torch_dtype)

__all__ = ["TorchBackend", "cuda_problem"]

# ---- shape, creation and indexing functions of the namespace (NumPy's semantics) ----


def shape_tuple(shape):
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(n) for n in shape)


def creator(fill):
    def create(shape, dtype=None):
        return fill(shape_tuple(shape), dtype=torch_dtype(dtype) or torch.float64,
                    device=PLACEMENT.device)
    return create


def full(shape, fill_value, dtype=None):
    dtype = torch_dtype(dtype) or host_dtype(fill_value)
    return torch.full(shape_tuple(shape), fill_value, dtype=dtype, device=PLACEMENT.device)


def like_creator(fill):
    def create(a, dtype=None):
        return fill(as_tensor(a), dtype=torch_dtype(dtype))
    return create


def full_like(a, fill_value, dtype=None):
    return torch.full_like(as_tensor(a), fill_value, dtype=torch_dtype(dtype))


def arange(start, stop=None, step=1, dtype=None):
    bounds = (start, stop, step) if stop is not None else (0, start, step)
    if dtype is None:                 # NumPy: int64 for integers, float64 once a float appears
        dtype = torch.float64 if any(isinstance(v, float) for v in bounds) else torch.int64
    return torch.arange(*bounds, dtype=torch_dtype(dtype), device=PLACEMENT.device)


def asarray(a, dtype=None):
    dtype = torch_dtype(dtype)
    if isinstance(a, torch.Tensor):     # a tensor from elsewhere (a user's CPU tensor) moves
        return a.to(device=PLACEMENT.device, dtype=dtype)       # itself when nothing changes
    return from_host(a, dtype)


def array(a, dtype=None):
    return asarray(a, dtype).clone() if isinstance(a, torch.Tensor) or dtype is None \
        else from_host(a, dtype).clone()


def ascontiguousarray(a, dtype=None):
    a = asarray(a, dtype)
    return (a.reshape(1) if a.ndim == 0 else a).contiguous()     # NumPy: at least 1-d


def copyto(dst, src, casting="same_kind"):
    src = as_tensor(src, dst)
    if src.dtype.is_floating_point and not dst.dtype.is_floating_point:
        raise TypeError(f"copyto: cannot cast {src.dtype} to {dst.dtype} (casting={casting!r})")
    dst.copy_(src)


def reshape(a, shape):
    a, shape = as_tensor(a), shape_tuple(shape)
    try:
        return torch.reshape(a, shape)
    except RuntimeError as err:     # NumPy raises ValueError, which the engine catches
        raise ValueError(f"cannot reshape array of shape {tuple(a.shape)} into shape "
                         f"{shape}: {err}") from None


def transpose(a, axes=None):
    a = as_tensor(a)        # a tuple: permute() of no dims (a 0-d tensor) is refused
    return a.permute(tuple(reversed(range(a.ndim))) if axes is None else tuple(axes))


def expand_dims(a, axis):
    a = as_tensor(a)
    axes = (axis,) if isinstance(axis, int) else axis
    ndim = a.ndim + len(axes)
    for d in sorted(d % ndim for d in axes):
        a = a.unsqueeze(d)
    return a


def squeeze(a, axis=None):
    a = as_tensor(a)
    return a.squeeze() if axis is None else a.squeeze(axis)


def broadcast_arrays(*arrays):
    return tuple(torch.broadcast_tensors(*(as_tensor(a) for a in arrays)))


def broadcast_shapes(*shapes):
    try:
        return tuple(torch.broadcast_shapes(*(shape_tuple(s) for s in shapes)))
    except RuntimeError as err:                 # NumPy raises ValueError
        raise ValueError(f"shape mismatch: {err}") from None


def shape(a):
    return tuple(a.shape) if isinstance(a, torch.Tensor) else np.shape(a)


def atleast_1d(a):
    a = as_tensor(a)
    return a.reshape(1) if a.ndim == 0 else a


def concatenate(arrays, axis=0):
    arrays = [as_tensor(a) for a in arrays]
    if axis is None:
        return torch.cat([a.reshape(-1) for a in arrays])
    return torch.cat(arrays, axis)


def stack(arrays, axis=0):
    return torch.stack([as_tensor(a) for a in arrays], axis)


def split(a, indices_or_sections, axis=0):
    a = as_tensor(a)
    if isinstance(indices_or_sections, int) and a.shape[axis] % indices_or_sections:
        raise ValueError("array split does not result in an equal division")
    return list(torch.tensor_split(a, indices_or_sections if isinstance(
        indices_or_sections, int) else [int(i) for i in indices_or_sections], axis))


def delete(a, obj, axis=None):
    a = as_tensor(a)
    if axis is None:
        a, axis = a.reshape(-1), 0
    keep = torch.ones(a.shape[axis], dtype=torch.bool, device=a.device)
    keep[obj if isinstance(obj, (int, slice)) else as_tensor(obj)] = False
    return a[(slice(None),) * (axis % a.ndim) + (keep,)]


def ix_(*sequences):
    out = []
    for i, seq in enumerate(sequences):
        seq = as_tensor(seq)
        if seq.dtype == torch.bool:
            seq = flatnonzero(seq)
        out.append(seq.reshape((1,) * i + (-1,) + (1,) * (len(sequences) - i - 1)))
    return tuple(out)


def take(a, indices, axis=None):
    a, indices = as_tensor(a), as_tensor(indices)
    if axis is None:
        return torch.take(a, indices)
    axis %= a.ndim
    picked = torch.index_select(a, axis, indices.reshape(-1))
    return picked.reshape(a.shape[:axis] + indices.shape + a.shape[axis + 1:])


def take_along_axis(a, indices, axis):
    return torch.take_along_dim(as_tensor(a), as_tensor(indices), axis)


def put_along_axis(a, indices, values, axis):
    indices = as_tensor(indices)
    values = torch.broadcast_to(as_tensor(values, a).to(a.dtype), indices.shape)
    a.scatter_(axis, indices, values)


def array_equal(a, b, equal_nan=False):
    a, b = operands(a, b)
    if a.shape != b.shape:
        return False
    same = a == b
    if equal_nan and a.dtype.is_floating_point:
        same |= torch.isnan(a) & torch.isnan(b)
    return bool(torch.all(same))


def shares_memory(a, b):
    """Whether the memory spans of a and b overlap (NumPy's exact answer for the dense
    arrays and slices the engine compares; a larger answer only costs a copy)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or \
            a.numel() == 0 or b.numel() == 0:
        return False

    def span(t):
        start = t.data_ptr()
        extent = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride())) + 1
        return start, start + extent * t.element_size()
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


class TorchNamespace:
    """Every name of ``fpsim.backend.NAMESPACE`` for torch CPU tensors."""

    ndarray = torch.Tensor
    generic = np.generic            # host scalars: no tensor is one (as the engine assumes)
    integer = np.integer
    dtype = staticmethod(torch_dtype)
    inf, nan = math.inf, math.nan
    intp = DTYPES["int64"]

    def __init__(self):
        a = arithmetic
        unary = {"negative": torch.neg, "abs": torch.abs, "trunc": torch.trunc,
                 "floor": torch.floor, "ceil": torch.ceil, "signbit": torch.signbit,
                 "logical_not": torch.logical_not, "isfinite": torch.isfinite,
                 "isnan": torch.isnan, "isinf": torch.isinf, "invert": torch.bitwise_not,
                 "sqrt": a.correctly_rounded_sqrt}
        binary = {"add": torch.add, "subtract": torch.sub, "multiply": torch.mul,
                  "copysign": torch.copysign, "equal": torch.eq, "not_equal": torch.ne,
                  "less": torch.lt, "less_equal": torch.le, "greater": torch.gt,
                  "greater_equal": torch.ge, "logical_and": torch.logical_and,
                  "logical_or": torch.logical_or, "bitwise_and": torch.bitwise_and,
                  "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
                  "left_shift": torch.bitwise_left_shift,
                  "right_shift": torch.bitwise_right_shift, "ldexp": a.ldexp}
        functions = {name: a.elementwise(fn, 1) for name, fn in unary.items()}
        functions.update({name: a.elementwise(fn, 2) for name, fn in binary.items()})
        functions.update({name: getattr(a, name) for name in (
            "maximum", "minimum", "nextafter", "divide", "spacing", "power", "sign", "frexp",
            "rint", "where", "clip", "cumsum", "count_nonzero", "argmax", "argsort", "unique",
            "bincount", "matmul", "einsum", "flatnonzero", "errstate")})
        functions.update(
            divmod=a.divmod_, round=a.round_,
            sum=a.reduction(lambda x, d, k: torch.sum(x, d, keepdim=k, dtype=a.sum_dtype(x.dtype)),
                            a.sum_dtype),
            prod=a.reduction(a.reduce_prod, a.sum_dtype), max=a.reduction(a.reduce_max),
            min=a.reduction(a.reduce_min),
            all=a.reduction(lambda x, d, k: torch.all(x, d, keepdim=k), lambda d: torch.bool),
            any=a.reduction(lambda x, d, k: torch.any(x, d, keepdim=k), lambda d: torch.bool),
            nonzero=lambda x: torch.nonzero(as_tensor(x), as_tuple=True),
            zeros=creator(torch.zeros), ones=creator(torch.ones), empty=creator(torch.empty),
            zeros_like=like_creator(torch.zeros_like), ones_like=like_creator(torch.ones_like),
            empty_like=like_creator(torch.empty_like),
            moveaxis=lambda x, source, target: torch.movedim(as_tensor(x), source, target),
            swapaxes=lambda x, one, other: torch.swapaxes(as_tensor(x), one, other),
            broadcast_to=lambda x, shape: torch.broadcast_to(as_tensor(x), shape_tuple(shape)))
        functions.update({name: globals()[name] for name in (
            "full", "full_like", "arange", "asarray", "array", "ascontiguousarray", "copyto",
            "reshape", "transpose", "expand_dims", "squeeze", "broadcast_arrays",
            "broadcast_shapes", "shape", "atleast_1d", "concatenate", "stack", "split", "delete",
            "ix_", "take_along_axis", "put_along_axis", "take", "array_equal",
            "shares_memory")})
        for name, value in {**functions, **DTYPES}.items():
            setattr(self, name, value)


_SIGNED = {torch.int8, torch.int16, torch.int32, torch.int64}
_UNSIGNED = {torch.uint8, torch.uint16, torch.uint32, torch.uint64}
_KINDS = {"bool": lambda d: d == torch.bool, "signed integer": lambda d: d in _SIGNED,
          "unsigned integer": lambda d: d in _UNSIGNED,
          "integral": lambda d: d in _SIGNED or d in _UNSIGNED,
          "real floating": lambda d: d.is_floating_point and not d.is_complex,
          "numeric": lambda d: d != torch.bool and not d.is_complex}
assert set(_KINDS) == DTYPE_KINDS


# cuBLAS's Ozaki-scheme emulation of FP64 (and FP32) GEMMs, switched on by these variables,
# is not IEEE arithmetic in some summation order, which the exact layer's certificate assumes
_EMULATION_VARIABLES = ("CUBLAS_EMULATE_DOUBLE_PRECISION", "CUBLAS_EMULATE_SINGLE_PRECISION")


def cuda_problem(device: str) -> "str | None":
    """Why tensors cannot live on CUDA ``device`` ("cuda", "cuda:N") here, or None."""
    if not torch.cuda.is_available():
        build = torch.version.cuda and f"CUDA {torch.version.cuda}" or "a CPU-only build"
        return (f"needs a CUDA device, and PyTorch {torch.__version__} ({build}) sees none "
                f"here: run it on a machine with an NVIDIA GPU and a CUDA build of PyTorch, "
                f"or choose torch (CPU) or numpy")
    count, index = torch.cuda.device_count(), torch.device(device).index or 0
    if index >= count:
        return f"names CUDA device {index}; this machine has {count} (cuda:0 to cuda:{count - 1})"
    emulating = [n for n in _EMULATION_VARIABLES if os.environ.get(n, "0").strip() not in ("", "0")]
    if emulating:
        return (f"cannot run with {emulating[0]} set: cuBLAS's emulated GEMMs are not the IEEE "
                f"arithmetic fpsim's certificates assume; unset it")
    return None


class TorchBackend(Backend):
    """PyTorch tensors on ``device``: "cpu" (the backend named "torch") or "cuda" / "cuda:N"
    ("torch:cuda", "torch:cuda:N"). Choosing a CUDA one switches off TF32 in torch's
    matmuls and convolutions, process-wide (fpsim's float64 products never use it; float32
    ones must not either)."""

    xp = TorchNamespace()
    container = torch.float32
    bit_dtypes = {torch.float32: torch.uint32, torch.float64: torch.uint64}

    def __init__(self, device: str = "cpu"):
        self.device = torch.device(device)
        self.name = "torch" if self.device.type == "cpu" else f"torch:{device}"
        self._local = threading.local()
        if self.device.type == "cuda":
            self.tuning = GPU_TUNING

    def activate(self) -> None:
        PLACEMENT.device = self.device
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            torch.cuda.set_device(self.device)

    def asarray(self, data, dtype=None):
        return self.xp.asarray(data, self.container if dtype is None else dtype)

    def to_numpy(self, array):
        if isinstance(array, torch.Tensor):
            return array.detach().cpu().numpy()
        return np.asarray(array)

    def is_array(self, obj) -> bool:
        return isinstance(obj, torch.Tensor)

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
        return torch.tensor(value, dtype=torch_dtype(dtype), device=self.device)

    def isdtype(self, dtype, kind: str) -> bool:
        if kind not in _KINDS:
            raise ValueError(f"isdtype kind {kind!r} is not one of {sorted(DTYPE_KINDS)}")
        return _KINDS[kind](torch_dtype(dtype))

    def is_contiguous(self, array, order: str = "C") -> bool:
        if order == "C":
            return array.is_contiguous()
        return array.permute(tuple(reversed(range(array.ndim)))).is_contiguous()

    def bitcast(self, array, dtype):
        dtype = torch_dtype(dtype)
        if dtype.itemsize != array.dtype.itemsize:
            raise TypeError(f"bitcast keeps the width: {array.dtype} cannot be read as {dtype}")
        return array.view(dtype)

    def round_to(self, x, fmt, mode="nearest_even", *, seed=None, offset=None,
                 subnormals=None, saturate=None, daz=False):
        """A torch cast there and back where it gives the same bits (``torch_rounding``:
        float32 to fp16, bf16 and e4m3fn, nearest even), else the portable scheme."""
        if self.is_array(x) and seed is None and offset is None:
            fast = cast_round(self, x, get(fmt), mode, subnormals=subnormals,
                              saturate=saturate, daz=daz,
                              look_for_nans=self.device.type == "cpu")
            if fast is not None:
                return fast
        return super().round_to(x, fmt, mode, seed=seed, offset=offset,
                                subnormals=subnormals, saturate=saturate, daz=daz)

    def scratch(self, slot, dtype, n: int):
        """A per-thread buffer per (slot, dtype), grown to the largest n asked for."""
        buffers = self._local.__dict__.setdefault("buffers", {})
        key = (slot, torch_dtype(dtype))
        buffer = buffers.get(key)
        if buffer is None or buffer.numel() < n:
            buffer = buffers[key] = torch.empty(n, dtype=key[1], device=self.device)
        return buffer[:n]

    def errstate(self, **settings):
        """torch raises no floating-point warnings: nothing to silence."""
        return nullcontext()

    def versions(self) -> dict:
        found: dict[str, str | None] = {"torch": torch.__version__, "numpy": np.__version__}
        if self.device.type == "cuda":
            found.update(cuda=torch.version.cuda, device=torch.cuda.get_device_name(self.device))
        return found
