"""``numpy-strict``: NumPy underneath, refusing what other array libraries refuse or do
differently, so that engine code proven on it is portable (scikit-learn and SciPy test their
array-API code on array-api-strict for the same reason).

Its arrays are ``StrictArray`` objects around NumPy arrays: the same values, the same bits,
but engine code (``interface.is_engine_module``) that does any of these gets a
``StrictError`` naming the rule:

- computes with unsigned integer arrays beyond ``& | ^ ~ == !=`` (arithmetic, shifts, order,
  reductions: torch has none of them on uint32 / uint64);
- reads an array attribute outside ``ARRAY_ATTRIBUTES`` (``x.astype``, ``x.view``,
  ``x.size``, ``x.copy()``, ``x.sum()``, ``x.flags``, ...): these are backend functions;
- mixes, in one arithmetic or comparison, a 0-d float array with an n-d float array of
  another dtype (NumPy 2 promotes to the wider one, torch keeps the n-d array's dtype), an
  integer array with a float array or a Python float (NumPy gives float64, torch float32),
  signed with unsigned integer arrays (NumPy gives float64), or does arithmetic on bools;
- assigns an array of another dtype into an indexed array (``a32[i] = b64``: NumPy casts
  silently, torch refuses);
- divides with an array operator and a Python or NumPy scalar operand (``x / 3.0``,
  ``3.0 / x``): torch on CUDA computes ``x / c`` as ``x * (1/c)`` and every torch device
  ``c / x`` as ``reciprocal(x) * c``, two roundings (``xp.divide`` and ``backend.scalar``
  operands divide once);
- converts an array to a host NumPy array implicitly (``numpy.asarray(x)``, the buffer
  protocol): only ``fpsim.backend.to_numpy`` / ``to_list`` / ``host_bytes`` transfer.

Code outside the engine (tests, host adapters) may use a ``StrictArray`` as a NumPy array:
the checks apply where the calling frame is engine code.
The kernels are NumpyBackend's on the arrays inside, so every result has NumPy's bits, except
rounding and Philox: those are the portable reference (``fpsim.rounding.portable``, the
``Backend`` default every new backend starts from), run on the strict namespace.
"""
from __future__ import annotations

import operator
import sys

import numpy as np

from .interface import ARRAY_ATTRIBUTES, NAMESPACE, Backend, is_engine_module
from .numpy_backend import NumpyBackend

__all__ = ["StrictArray", "StrictBackend", "StrictError"]


class StrictError(TypeError):
    """Engine code did something that another array library refuses or does differently."""


def _engine_caller(depth: int = 2) -> str:
    """Where the engine code asking is ("fpsim.exact.sums:117"), or "" for other code."""
    frame = sys._getframe(depth)
    module = frame.f_globals.get("__name__", "")
    return f"{module}:{frame.f_lineno}" if is_engine_module(module) else ""


def _unwrap(value, seen: dict):
    if isinstance(value, StrictArray):
        seen[id(value.array)] = value
        return value.array
    if isinstance(value, (tuple, list)):
        return type(value)(_unwrap(v, seen) for v in value)
    return value


def _wrap(value, seen: dict):
    """Results as StrictArrays (NumPy scalars as 0-d arrays); an input array comes back as
    the very object that was passed (``out=``, ``asarray`` of an array)."""
    if isinstance(value, np.ndarray):
        passed = seen.get(id(value))
        return StrictArray(value) if passed is None else passed
    if isinstance(value, np.generic):
        return StrictArray(np.asarray(value))
    if isinstance(value, tuple):
        return type(value)(_wrap(v, seen) for v in value) if not hasattr(value, "_fields") \
            else type(value)(*(_wrap(v, seen) for v in value))
    if isinstance(value, list):
        return [_wrap(v, seen) for v in value]
    return value


_ARITHMETIC = {"add", "subtract", "multiply", "divide", "power", "maximum", "minimum",
               "copysign", "nextafter", "divmod", "matmul", "einsum", "clip", "where",
               "floor_divide", "remainder", "true_divide"}
_COMPARISON = {"equal", "not_equal", "less", "less_equal", "greater", "greater_equal"}
_BITWISE = {"bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift",
            "logical_and", "logical_or"}
# torch has only & | ^ ~ == != on uint32 / uint64: no arithmetic, shifts, order or reductions
_UNSIGNED_OK = {"bitwise_and", "bitwise_or", "bitwise_xor", "equal", "not_equal", "where",
                "logical_and", "logical_or"}
_REDUCTIONS = {"sum", "prod", "cumsum", "max", "min", "argmax", "argsort", "unique", "bincount",
               "count_nonzero"}
_CHECKED = _ARITHMETIC | _COMPARISON | _BITWISE | _REDUCTIONS


def _check_mix(op: str, operands) -> None:
    """Refuse the operand mixes whose result dtype or value differs between libraries."""
    arrays = [v for v in operands if isinstance(v, (np.ndarray, np.generic))]
    floats = [a for a in arrays if a.dtype.kind == "f"]
    ints = [a for a in arrays if a.dtype.kind in "iu"]
    bools = [a for a in arrays if a.dtype.kind == "b"]
    unsigned = [a for a in arrays if a.dtype.kind == "u"]
    if unsigned and op not in _UNSIGNED_OK:
        raise StrictError(f"{op} on {unsigned[0].dtype} arrays (torch has only & | ^ ~ == != on "
                          f"unsigned integers); work on a signed view (backend.bitcast)")
    if bools and op in _ARITHMETIC - {"where"}:
        raise StrictError(f"{op} on bool arrays (torch refuses bool arithmetic; use where "
                          f"or a cast)")
    if floats and ints and op not in _BITWISE:
        raise StrictError(f"{op} mixes integer {ints[0].dtype} and float {floats[0].dtype} "
                          f"arrays (NumPy promotes to float64, torch to float32); cast first")
    if ints and op not in _BITWISE and any(isinstance(v, float) for v in operands):
        raise StrictError(f"{op} mixes an integer {ints[0].dtype} array with a Python float "
                          f"(NumPy gives float64, torch float32); cast first")
    if len({a.dtype for a in floats}) > 1 and {a.ndim == 0 for a in floats} == {True, False}:
        raise StrictError(f"{op} mixes a 0-d {[a.dtype for a in floats if a.ndim == 0][0]} "
                          f"with an n-d {[a.dtype for a in floats if a.ndim][0]} array "
                          f"(NumPy 2 promotes to the wider, torch keeps the n-d dtype)")
    if len({a.dtype.kind for a in ints}) > 1 and op not in _COMPARISON:
        raise StrictError(f"{op} mixes signed and unsigned integer arrays (NumPy gives "
                          f"float64; torch has no such promotion)")


def _is_host_scalar(value) -> bool:
    return isinstance(value, (int, float, np.generic)) and not isinstance(value, bool)


def _call(name: str, fn, args, kwargs):
    seen: dict = {}
    args, kwargs = _unwrap(args, seen), {k: _unwrap(v, seen) for k, v in kwargs.items()}
    if name in _CHECKED and _engine_caller(3):
        operands = args[1:] if name == "where" else \
            [a for a in args if not isinstance(a, str)] if name == "einsum" else args
        try:
            _check_mix(name, operands)
            if name == "where" and getattr(args[0], "dtype", np.dtype(bool)).kind != "b":
                raise StrictError("where's condition is not a bool array")
        except StrictError as err:
            raise StrictError(f"{_engine_caller(3)}: {err}") from None
    return _wrap(fn(*args, **kwargs), seen)


class StrictNamespace:
    """``xp`` of the strict backend: NumPy's ``NAMESPACE`` functions on StrictArrays."""

    def __init__(self):
        for attr in NAMESPACE:
            value = getattr(np, attr)
            if attr in ("ndarray", "generic"):
                value = StrictArray
            elif callable(value) and not isinstance(value, type) and attr != "errstate":
                value = self._strict(attr, value)
            setattr(self, attr, value)

    @staticmethod
    def _strict(name, fn):
        def call(*args, **kwargs):
            return _call(name, fn, args, kwargs)
        call.__name__ = name
        return call


def _binary(name: str, ufunc: str, reflected: bool = False, inplace: bool = False):
    def method(self, other):
        seen: dict = {}
        mine, theirs = self.array, _unwrap(other, seen)
        where = _engine_caller()
        if where:
            try:
                _check_mix(ufunc, (mine, theirs))
                if ufunc == "divide" and _is_host_scalar(theirs) and mine.dtype.kind == "f":
                    raise StrictError(
                        "an array operator divides with a Python or NumPy scalar operand "
                        "(torch on CUDA computes x / c as x * (1/c), and c / x is "
                        "reciprocal(x) * c on every device): use xp.divide or an operand "
                        "made by backend.scalar(c, dtype)")
            except StrictError as err:
                raise StrictError(f"{where}: {err}") from None
        if inplace:
            _INPLACE[ufunc](mine, theirs)
            return self
        left, right = (theirs, mine) if reflected else (mine, theirs)
        return _wrap(np.asarray(_OPERATORS[ufunc](left, right)), seen)
    method.__name__ = name
    return method


_OPERATORS = {"add": operator.add, "subtract": operator.sub, "multiply": operator.mul,
              "divide": operator.truediv, "floor_divide": operator.floordiv,
              "remainder": operator.mod, "power": operator.pow, "matmul": operator.matmul,
              "bitwise_and": operator.and_, "bitwise_or": operator.or_,
              "bitwise_xor": operator.xor, "left_shift": operator.lshift,
              "right_shift": operator.rshift, "equal": operator.eq, "not_equal": operator.ne,
              "less": operator.lt, "less_equal": operator.le, "greater": operator.gt,
              "greater_equal": operator.ge}
_INPLACE = {"add": operator.iadd, "subtract": operator.isub, "multiply": operator.imul,
            "divide": operator.itruediv, "floor_divide": operator.ifloordiv,
            "remainder": operator.imod, "power": operator.ipow, "matmul": operator.imatmul,
            "bitwise_and": operator.iand, "bitwise_or": operator.ior,
            "bitwise_xor": operator.ixor, "left_shift": operator.ilshift,
            "right_shift": operator.irshift}
_DUNDERS = {"add": "add", "sub": "subtract", "mul": "multiply", "truediv": "divide",
            "floordiv": "floor_divide", "mod": "remainder", "pow": "power",
            "matmul": "matmul", "and": "bitwise_and", "or": "bitwise_or",
            "xor": "bitwise_xor", "lshift": "left_shift", "rshift": "right_shift"}
_COMPARES = {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal",
             "gt": "greater", "ge": "greater_equal"}


class StrictArray:
    """A NumPy array that engine code may use only as every array library allows."""

    __slots__ = ("array",)
    __array_priority__ = 1000      # ndarray's operators defer to ours
    __hash__ = None

    def __init__(self, array: np.ndarray):
        self.array = array

    shape = property(lambda self: self.array.shape)
    ndim = property(lambda self: self.array.ndim)
    dtype = property(lambda self: self.array.dtype)
    T = property(lambda self: StrictArray(self.array.T))

    def __getattr__(self, attr):
        if attr.startswith("__"):      # __array_interface__ and kin: NumPy then asks __array__
            raise AttributeError(attr)
        where = _engine_caller()
        if not where:
            value = getattr(self.array, attr)
            if callable(value):
                return lambda *a, **k: _call(attr, value, a, k)
            return _wrap(value, {})
        raise StrictError(f"{where}: engine code reads array attribute .{attr}; arrays offer only "
                          f"{', '.join(sorted(ARRAY_ATTRIBUTES))} (use fpsim.backend's "
                          f"functions: astype, copy, size, bitcast, ...)")

    def __array__(self, dtype=None, copy=None):
        where = _engine_caller()
        if where:
            raise StrictError(f"{where}: engine code converts an array to a host NumPy array "
                              f"implicitly; use fpsim.backend.to_numpy")
        return self.array if dtype is None else self.array.astype(dtype, copy=False)

    def __getitem__(self, index):
        seen: dict = {}
        return _wrap(self.array[_unwrap(index, seen)], seen)

    def __setitem__(self, index, value):
        seen: dict = {}
        value = _unwrap(value, seen)
        where = _engine_caller()
        if (isinstance(value, (np.ndarray, np.generic)) and value.dtype != self.array.dtype
                and where):
            raise StrictError(f"{where}: assigns {value.dtype} values into a {self.array.dtype} "
                              f"array (NumPy casts silently, torch refuses); cast first")
        self.array[_unwrap(index, seen)] = value

    def __neg__(self):
        where = _engine_caller()
        if self.array.dtype.kind in "bu" and where:
            raise StrictError(f"{where}: negative of a {self.array.dtype} array (torch refuses "
                              f"it)")
        return StrictArray(np.asarray(-self.array))

    def __pos__(self):
        return self

    def __abs__(self):
        return StrictArray(np.asarray(abs(self.array)))

    def __invert__(self):
        return StrictArray(np.asarray(~self.array))

    def __bool__(self):
        return bool(self.array)

    def __float__(self):
        return float(self.array)

    def __int__(self):
        return int(self.array)

    def __index__(self):
        return operator.index(self.array)

    def __len__(self):
        return len(self.array)

    def __iter__(self):
        return (StrictArray(np.asarray(v)) for v in self.array)

    def __repr__(self):
        return f"strict({self.array!r})"

    def __reduce__(self):
        return StrictArray, (self.array,)


for _short, _ufunc in _DUNDERS.items():
    setattr(StrictArray, f"__{_short}__", _binary(f"__{_short}__", _ufunc))
    setattr(StrictArray, f"__r{_short}__", _binary(f"__r{_short}__", _ufunc, reflected=True))
    setattr(StrictArray, f"__i{_short}__", _binary(f"__i{_short}__", _ufunc, inplace=True))
for _short, _ufunc in _COMPARES.items():
    setattr(StrictArray, f"__{_short}__", _binary(f"__{_short}__", _ufunc))


def _plain(value):
    return value.array if isinstance(value, StrictArray) else value


class StrictBackend(NumpyBackend):
    """NumPy's kernels on the arrays inside StrictArrays; results wrapped again."""

    name = "numpy-strict"
    xp = StrictNamespace()

    def asarray(self, data, dtype=None):
        if isinstance(data, StrictArray) and (dtype is None and data.dtype == self.container
                                              or data.dtype == dtype):
            return data
        return StrictArray(super().asarray(_unwrap(data, {}), dtype))

    def to_numpy(self, array):
        return np.asarray(_plain(array))

    def is_array(self, obj) -> bool:
        return isinstance(obj, StrictArray)

    def astype(self, array, dtype, copy: bool = True):
        result = _plain(array).astype(dtype, copy=copy)
        return array if result is _plain(array) else StrictArray(result)

    def copy(self, array):
        return StrictArray(super().copy(_plain(array)))

    def size(self, array) -> int:
        return super().size(_plain(array))

    def scalar(self, value, dtype):
        return StrictArray(np.asarray(value, dtype))

    def is_contiguous(self, array, order: str = "C") -> bool:
        return super().is_contiguous(_plain(array), order)

    def is_unshared(self, array) -> bool:
        return False

    def fused(self, kernel: str):
        """None: the exact layer's own code runs here, checked like all engine code."""
        return None

    def bitcast(self, array, dtype):
        return StrictArray(super().bitcast(_plain(array), dtype))

    # rounding and Philox: the portable reference (Backend's), checked like engine code,
    # not NumPy's kernels
    round_to = Backend.round_to
    uniforms = Backend.uniforms
    zero_where = Backend.zero_where

    def scratch(self, slot, dtype, n: int):
        return StrictArray(super().scratch(slot, dtype, n))
