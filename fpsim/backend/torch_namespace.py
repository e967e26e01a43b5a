"""``xp`` of the torch backend: every ``NAMESPACE`` name on torch CPU tensors, with NumPy's
semantics for the argument forms the engine passes (``torch_backend.py`` has the kernels).

Where torch's own function differs from NumPy's in bits or dtype, the function here is
written from operations that are exact in both libraries (``tests/test_torch_backend.py``
compares each with NumPy bit for bit):

- ``sqrt``: torch's CPU sqrt is not correctly rounded (off by one ulp on 1-17% of float32
  and float64 inputs) and gives +NaN for negative inputs; on the CPU NumPy's own sqrt runs on
  the tensor's memory (negative inputs give -NaN), on CUDA torch's sqrt is IEEE's, and on
  other devices an exact integer residual test corrects torch's (``emulated_sqrt``);
- ``maximum`` / ``minimum``: NumPy returns the first operand if it is NaN or strictly
  larger (smaller), else the second (so a +-0 tie gives the second); torch's SIMD path
  does not, so they are ``where`` on comparisons;
- ``ldexp``: torch multiplies by ``2.0 ** e``, which overflows or underflows before the
  product does; here the scaling is split so that only the last multiplication rounds;
- ``frexp`` keeps a signalling NaN as it is (torch quiets it), as NumPy does;
- ``divmod`` takes integers only (the engine's use): torch's float fmod is not exact;
- ``spacing`` and ``cumsum`` (floats, sequential as NumPy's
  ``add.accumulate``; torch accumulates float32 in float64) are built from exact steps;
- dtype inference follows NumPy: a Python float is float64 where NumPy says so (``zeros``,
  ``arange``, ``asarray``, ``where`` of two scalars), integer division gives float64, a
  Python scalar operand takes the dtype of the array it meets (NumPy 2's weak scalars);
- ``out=`` is written with ``copy_`` after the result is computed (torch resizes an ``out``
  of the wrong shape silently; this refuses it) and returns ``out``, as NumPy does.

Reductions ``max`` / ``min`` give NumPy's values and propagate NaN; which signed zero wins
a +-0 tie and which NaN payload comes back are not matched: NumPy's own answer depends on its
SIMD path and the array length (measured), so no engine result may depend on them.
"""
from __future__ import annotations

import math
from contextlib import nullcontext

import numpy as np
import torch

__all__ = ["PLACEMENT", "DTYPES", "torch_dtype", "as_tensor", "from_host", "host_dtype", "operands",
           "write_out", "elementwise", "reduction", "flatnonzero", "correctly_rounded_sqrt",
           "emulated_sqrt", "ldexp", "nextafter"]

class Placement:
    """The device every tensor the namespace makes from nothing (``zeros``, ``arange``, host
    data, Python scalars without an array beside them) is put on: the current torch
    backend's (``TorchBackend.activate``), process-wide as the backend choice is. A Python
    scalar meeting a tensor is put on that tensor's device, so no CPU scalar ever meets a CUDA
    tensor (CUDA divides by a CPU scalar as ``a * (1/b)``: two roundings)."""

    device = torch.device("cpu")


PLACEMENT = Placement()

_NUMPY_TO_TORCH = {np.dtype(n): getattr(torch, n) for n in (
    "bool", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
    "uint16", "uint32", "uint64")}
_PYTHON_TO_TORCH = {bool: torch.bool, int: torch.int64, float: torch.float64}


class _DtypeClass(type):
    """``xp.float32`` and kin: each equals its torch dtype (``x.dtype == xp.float32``,
    hashing alike) and is, as NumPy's scalar types are, a class for ``isinstance`` of host
    scalars (the engine asks ``isinstance(x, (xp.float32, xp.float64))`` and
    ``isinstance(flag, (bool, xp.bool_))``); a torch dtype is not a class."""

    def __eq__(cls, other):
        return other is cls.torch or other is cls

    def __ne__(cls, other):
        return not _DtypeClass.__eq__(cls, other)

    def __hash__(cls):
        return hash(cls.torch)

    def __instancecheck__(cls, obj):
        return isinstance(obj, cls.host)

    def __repr__(cls):
        return f"xp.{cls.__name__}"

    def __call__(cls, *args, **kwargs):
        # NumPy's float32(x) makes a scalar; a class of no instances would fail later, unseen
        raise TypeError(f"xp.{cls.__name__} is a dtype on the torch backend, not callable "
                        f"(torch.dtype is not): use fpsim.backend.scalar(value, dtype)")


DTYPES = {name: _DtypeClass(name, (), {"torch": getattr(torch, name.rstrip("_")),
                                       "host": getattr(np, name)})
          for name in ("bool_", "float16", "float32", "float64", "int8", "int32", "int64",
                       "uint8", "uint16", "uint32", "uint64")}


def torch_dtype(dtype):
    """``dtype`` (a torch dtype, a NumPy dtype or type, Python's bool/int/float, ``xp.bool_``)
    as a torch dtype; None stays None."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, _DtypeClass):
        return dtype.torch
    if dtype in _PYTHON_TO_TORCH:
        return _PYTHON_TO_TORCH[dtype]
    return _NUMPY_TO_TORCH[np.dtype(dtype)]


def host_dtype(value) -> torch.dtype:
    """The dtype NumPy gives a host value (Python float: float64, int: int64, bool: bool)."""
    return _NUMPY_TO_TORCH[np.asarray(value).dtype]


def as_tensor(value, like=None):
    """``value`` as a tensor; a Python scalar meeting the tensor ``like`` takes like's dtype
    when NumPy 2 would (a weak scalar: an int with any array, a float with a float array)."""
    if isinstance(value, torch.Tensor):
        return value
    if like is not None and isinstance(value, (bool, int, float)) and not isinstance(value, bool):
        if isinstance(value, int) or like.dtype.is_floating_point:
            return torch.tensor(value, dtype=like.dtype, device=like.device)
    if isinstance(value, bool) and like is not None and like.dtype == torch.bool:
        return torch.tensor(value, device=like.device)
    return from_host(value)


def from_host(value, dtype=None):
    """Host data (NumPy array, lists, scalars) as a tensor on ``PLACEMENT.device``, NumPy's
    dtype inference. On the CPU, memory is shared only with an array that owns it, C-ordered,
    writeable and native-endian (torch.from_numpy refuses the others); views are copied
    (asking a broadcast view whether it is writeable is itself a NumPy FutureWarning)."""
    array = np.asarray(value, dtype=None if dtype is None else numpy_dtype(dtype))
    if array.dtype.kind not in "biuf":
        raise TypeError(f"torch tensors hold real numbers (bool, integer, float), not "
                        f"{array.dtype} data")
    if not (array.flags.owndata and array.flags.c_contiguous and array.flags.writeable
            and array.dtype.isnative):
        # np.array(order="C"), not ascontiguousarray: that makes a 0-d array 1-d
        array = np.array(array, dtype=array.dtype.newbyteorder("="), order="C", copy=True)
    return torch.from_numpy(array).to(PLACEMENT.device)       # no copy on the CPU


def numpy_dtype(dtype) -> np.dtype:
    wanted = torch_dtype(dtype)
    return next(n for n, t in _NUMPY_TO_TORCH.items() if t == wanted)


def operands(a, b):
    """Two operands as tensors, Python scalars converted as NumPy 2 converts them."""
    if isinstance(a, torch.Tensor):
        return a, as_tensor(b, a)
    b = as_tensor(b)
    return as_tensor(a, b), b


def write_out(result, out):
    """NumPy's ``out=``: the result written into ``out`` (same shape, else an error) and
    ``out`` returned."""
    if out is None:
        return result
    if tuple(out.shape) != tuple(result.shape):
        raise ValueError(f"out= has shape {tuple(out.shape)}, the result {tuple(result.shape)}")
    return out.copy_(result)


def elementwise(fn, arity: int):
    if arity == 1:
        def unary(a, out=None):
            return write_out(fn(as_tensor(a)), out)
        return unary

    def binary(a, b, out=None, dtype=None):
        a, b = operands(a, b)
        if dtype is not None:               # NumPy: the operands cast, then the operation
            a, b = a.to(torch_dtype(dtype)), b.to(torch_dtype(dtype))
        return write_out(fn(a, b), out)
    return binary


def _float_exact_sqrt(x):
    """Correctly rounded float64 sqrt of float64 x > 0 finite (subnormals included).

    x = m * 4**j with m in [1, 4) (exact scaling); r = torch.sqrt(m) in [1, 2] is within an
    ulp of the truth. With r = k * 2**-52 and m = X * 2**-52 (k, X integers), the midpoint
    above r is (2k + 1) * 2**-53, and sqrt(m) lies above it iff X * 2**54 > (2k + 1)**2:
    integers near 2**108, compared exactly in int64 pieces of 27 bits (no value passes
    2**58). sqrt(m) is never a midpoint (a 54-bit midpoint's square has too many bits)."""
    fraction, exponent = torch.frexp(x)             # x = fraction * 2**exponent
    odd = (exponent - 1) & 1
    m = ldexp(fraction, 1 + odd)                    # [1, 2) or [2, 4)
    half = torch.div(exponent - 1 - odd, 2, rounding_mode="floor")
    X = (m * 2.0 ** 52).to(torch.int64)             # exact: m has 53 bits, m < 4
    k = (torch.sqrt(m) * 2.0 ** 52).to(torch.int64)
    for _ in range(2):                              # one step suffices for a faithful sqrt
        k = torch.where(_above_midpoint(X, 2 * k + 1), k + 1, k)
        k = torch.where(_above_midpoint(X, 2 * k - 1), k, k - 1)
    return ldexp(k.to(torch.float64) * 2.0 ** -52, half)


def _above_midpoint(X, s):
    """X * 2**54 > s * s, exactly, for int64 X < 2**54 and odd 0 < s < 2**55 with s * s
    within a few parts in 2**52 of X * 2**54."""
    high, low = s >> 27, s & ((1 << 27) - 1)
    # X * 2**54 - s**2 = ((X - high**2) * 2**27 - 2 * high * low) * 2**27 - low**2
    c = (X - high * high) * (1 << 27) - 2 * high * low
    square = low * low
    return c - (square >> 27) >= 1


def correctly_rounded_sqrt(x):
    """IEEE sqrt of a float32 or float64 tensor, NumPy's bits: on the CPU NumPy's own sqrt
    on the tensor's memory (one pass, no copy; torch's CPU sqrt misrounds); on CUDA torch's
    sqrt, which is CUDA's IEEE round-to-nearest sqrt (0 ulp in CUDA's accuracy tables for
    sqrt and sqrtf, PyTorch being built without fast math; NaNs canonical, as all CUDA
    arithmetic's); elsewhere the exact emulation ``emulated_sqrt``. The tests compare all
    three with NumPy (CUDA's marked ``gpu``)."""
    if x.device.type == "cpu":
        with np.errstate(invalid="ignore"):          # x < 0 and signalling NaNs: as NumPy
            return torch.from_numpy(np.asarray(np.sqrt(x.numpy())))
    if x.device.type == "cuda":
        return torch.sqrt(x)
    return emulated_sqrt(x)


def emulated_sqrt(x):
    """IEEE sqrt of a float32 or float64 tensor from exact integer steps on any device:
    -0 for -0, -NaN (x86's default NaN) for x < 0, a NaN input quieted with its payload
    and sign kept (about 60 tensor operations a call)."""
    width_bits = {torch.float32: (torch.int32, 22), torch.float64: (torch.int64, 51)}
    signed, quiet_bit = width_bits[x.dtype]
    wide = x.to(torch.float64)
    positive = (wide > 0) & torch.isfinite(wide)
    root = _float_exact_sqrt(torch.where(positive, wide, 1.0))
    # float32: the float64 root is correctly rounded, and rounding it to float32 is too
    # (float64 has more than 2 * 24 + 2 bits, so no double rounding)
    root = torch.where(positive, root, wide).to(x.dtype)
    nan_bits = torch.where(torch.isnan(x), quiet(x).view(signed),
                           torch.tensor(-1 << quiet_bit, dtype=signed, device=x.device))
    special = torch.isnan(x) | (x < 0)
    return torch.where(special, nan_bits, root.view(signed)).view(x.dtype)


def _power_of_two(exponent):
    """2.0 ** exponent as float64 for an int64 tensor in [-1075, 1023]: bits, no rounding
    (0 below -1074)."""
    normal = ((exponent + 1023).clamp(min=0) << 52).view(torch.float64)
    subnormal = (torch.ones_like(exponent) << (exponent + 1074).clamp(0, 51)).view(torch.float64)
    tiny = torch.where(exponent < -1074, 0.0, subnormal)
    return torch.where(exponent >= -1022, normal, tiny)


def ldexp(x, exponent):
    """x * 2**exponent rounded once (NumPy's ldexp): the value's own exponent is taken out
    (frexp), so scaling to the target takes two exact multiplications and one rounding."""
    exponent = as_tensor(exponent).to(torch.int64)
    x = as_tensor(x)
    if not x.dtype.is_floating_point:          # NumPy: an integer mantissa gives float64
        x = x.to(torch.float64)
    wide = x.to(torch.float64)                      # exact; float32 rounds once at the end
    fraction, own = torch.frexp(wide)               # wide = fraction * 2**own, fraction < 1
    target = (own.to(torch.int64) + exponent).clamp(-1100, 1100)
    first = torch.where(target > 0, target // 2, torch.zeros_like(target))
    # fraction * 2**first is exact (first <= 550); the second factor rounds once
    value = (fraction * _power_of_two(first)) * _power_of_two((target - first).clamp(min=-1075))
    value = torch.where(torch.isfinite(wide) & (wide != 0), value, wide).to(x.dtype)
    return torch.where(torch.isnan(x), quiet(x), value)      # NumPy quiets a NaN input


def quiet(x):
    """x with every NaN's quiet bit set (payload and sign kept), as x86 arithmetic does."""
    signed, quiet = {torch.float32: (torch.int32, 22), torch.float64: (torch.int64, 51)}[x.dtype]
    return torch.where(torch.isnan(x), x.view(signed) | (1 << quiet), x.view(signed)).view(x.dtype)


def nextafter(x, y, out=None):
    """NumPy's nextafter: a NaN operand comes back quieted, y's when both are NaN (measured:
    C's ``x + y`` for NaNs); torch's NaN is canonical."""
    x, y = operands(x, y)
    step = torch.where(torch.isnan(x), quiet(x), torch.nextafter(x, y))
    return write_out(torch.where(torch.isnan(y), quiet(y), step), out)


def maximum(a, b, out=None):
    a, b = operands(a, b)
    if not a.dtype.is_floating_point:
        return write_out(torch.maximum(a, b), out)
    return write_out(torch.where(torch.isnan(a) | (a > b), a, b), out)   # NumPy's choice rule


def minimum(a, b, out=None):
    a, b = operands(a, b)
    if not a.dtype.is_floating_point:
        return write_out(torch.minimum(a, b), out)
    return write_out(torch.where(torch.isnan(a) | (a < b), a, b), out)


def divide(a, b, out=None):
    a, b = operands(a, b)
    if not (a.dtype.is_floating_point or b.dtype.is_floating_point):
        a, b = a.to(torch.float64), b.to(torch.float64)    # NumPy: int / int is float64
    return write_out(torch.div(a, b), out)


def spacing(x, out=None):
    """NumPy's spacing: the step to the next value away from zero, with x's sign."""
    x = as_tensor(x)
    away = torch.nextafter(x, torch.where(x < 0, -math.inf, math.inf))    # -0: upward
    return write_out(torch.where(torch.isinf(x), math.nan, away - x), out)


def divmod_(a, b):
    """NumPy's divmod on integers (floor division, remainder with the divisor's sign): the
    engine's only use. Floats are refused: torch's fmod is not exact (a - trunc(a / b) * b
    gives NaN where a / b overflows), so NumPy's float divmod would need an exact fmod."""
    a, b = operands(a, b)
    if a.dtype.is_floating_point or b.dtype.is_floating_point:
        raise TypeError("xp.divmod takes integer arrays on the torch backend (torch's fmod "
                        "is not exact)")
    return torch.div(a, b, rounding_mode="floor"), torch.remainder(a, b)


def cumsum(a, axis=None):
    a = as_tensor(a)
    if axis is None:
        a, axis = a.reshape(-1), 0
    if not a.dtype.is_floating_point:
        return torch.cumsum(a, axis)            # bool and int32 give int64, as in NumPy
    out = a.clone()                             # sequential float sums, in a's dtype
    moved = out.movedim(axis, 0)
    for i in range(1, moved.shape[0]):
        moved[i] += moved[i - 1]
    return out


def _axes(a, axis):
    if axis is None:
        return tuple(range(a.ndim))
    return tuple(sorted(d % a.ndim for d in ((axis,) if isinstance(axis, int) else axis)))


def reduction(fn, empty_axes_cast=None):
    def reduce(a, axis=None, keepdims=False, dtype=None, out=None):
        a = as_tensor(a)
        dims = _axes(a, axis)
        if dtype is not None:
            a = a.to(torch_dtype(dtype))
        if not dims:                                       # NumPy: axis=() reduces nothing
            result = a if empty_axes_cast is None else a.to(empty_axes_cast(a.dtype))
        else:
            result = fn(a, dims, keepdims)
        return write_out(result, out)
    return reduce


def sum_dtype(dtype):
    return torch.int64 if dtype == torch.bool or (not dtype.is_floating_point
                                                  and dtype.itemsize < 8) else dtype


def reduce_max(a, dims, keepdims):
    return torch.amax(a, dims, keepdim=keepdims)


def reduce_min(a, dims, keepdims):
    return torch.amin(a, dims, keepdim=keepdims)


def reduce_prod(a, dims, keepdims):
    for d in reversed(dims):
        a = torch.prod(a, d, keepdim=keepdims, dtype=sum_dtype(a.dtype))
    return a


def count_nonzero(a, axis=None):
    a = as_tensor(a)
    if axis is None:
        return int(torch.count_nonzero(a))                 # NumPy: a Python int
    return torch.count_nonzero(a, _axes(a, axis))


def argmax(a, axis=None):
    a = as_tensor(a)
    if a.dtype.is_floating_point:                  # NumPy: the first NaN is the maximum
        nan = torch.isnan(a)
        return torch.where(nan.any(axis) if axis is not None else nan.any(),
                           torch.argmax(nan.to(torch.uint8), axis), torch.argmax(a, axis))
    return torch.argmax(a.to(torch.int64) if a.dtype == torch.bool else a, axis)


def argsort(a, axis=-1, kind=None):
    """Stable, whatever ``kind``: a stable sort is one of the orders any kind may give."""
    a = as_tensor(a)
    if axis is None:
        a, axis = a.reshape(-1), 0
    return torch.argsort(a, dim=axis, stable=True)


def flatnonzero(a):
    return torch.nonzero(as_tensor(a).reshape(-1), as_tuple=True)[0]


def unique(a, return_index=False, return_inverse=False, return_counts=False):
    """NumPy's unique of the flattened array (NaNs as one value, NumPy 2's equal_nan)."""
    flat = as_tensor(a).reshape(-1)
    order = torch.argsort(flat, stable=True)
    ordered = flat[order]
    new = torch.ones(ordered.shape, dtype=torch.bool, device=ordered.device)
    if ordered.numel() > 1:
        same = ordered[1:] == ordered[:-1]
        if ordered.dtype.is_floating_point:
            same |= torch.isnan(ordered[1:]) & torch.isnan(ordered[:-1])
        new[1:] = ~same
    results = [ordered[new]]
    if return_index:
        results.append(order[new])
    if return_inverse:
        inverse = torch.empty_like(order)
        inverse[order] = torch.cumsum(new, 0) - 1
        results.append(inverse.reshape(as_tensor(a).shape))     # NumPy 2: the input's shape
    if return_counts:
        starts = flatnonzero(new)
        results.append(torch.diff(starts, append=torch.tensor([ordered.numel()],
                                                              device=ordered.device)))
    return results[0] if len(results) == 1 else tuple(results)


def bincount(x, weights=None, minlength=0):
    x = as_tensor(x)
    if weights is None:
        return torch.bincount(x, minlength=minlength)
    return torch.bincount(x, as_tensor(weights).to(torch.float64), minlength=minlength)


def where(condition, a=None, b=None):
    if a is None and b is None:
        return torch.nonzero(as_tensor(condition), as_tuple=True)
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        a, b = from_host(a), from_host(b)
        dtype = torch.promote_types(a.dtype, b.dtype)
        a, b = a.to(dtype), b.to(dtype)
    else:
        a, b = operands(a, b)
    return torch.where(as_tensor(condition), a, b)


def clip(a, low, high, out=None):
    a = as_tensor(a)
    if low is not None:
        a = maximum(a, low)
    if high is not None:
        a = minimum(a, high)
    return write_out(a, out)


def einsum(subscripts, *operands, out=None):
    return write_out(torch.einsum(subscripts, *(as_tensor(o) for o in operands)), out)


def matmul(a, b, out=None):
    return write_out(torch.matmul(*operands(a, b)), out)


def rint(x, out=None):
    x = as_tensor(x)
    return write_out(torch.round(x) if x.dtype.is_floating_point else x, out)


def round_(x, decimals=0):
    if decimals:
        raise ValueError("round: only decimals=0 (rint) is in the namespace")
    return rint(x)


def errstate(**settings):
    """torch raises no floating-point warnings: nothing to silence."""
    return nullcontext()


def sign(x, out=None):
    """NumPy's sign: NaN for NaN (torch gives 0), +0 for either zero."""
    x = as_tensor(x)
    one = torch.ones_like(x)
    signed = torch.where(x > 0, one, torch.where(x < 0, -one, torch.zeros_like(x)))
    return write_out(torch.where(torch.isnan(x), x, signed) if x.dtype.is_floating_point
                 else signed, out)


def frexp(x):
    """NumPy's frexp; torch quiets a signalling NaN's mantissa, NumPy returns it as it is."""
    x = as_tensor(x)
    mantissa, exponent = torch.frexp(x)
    return torch.where(torch.isnan(x), x, mantissa), exponent


def power(a, b, out=None):
    a, b = operands(a, b)
    return write_out(torch.pow(a, b), out)
