"""The kernel interface: what an array library must provide for fpsim to run on it.

Three levels, all closed (``tests/test_backend_seam.py`` reads every call site above this
layer and checks them against these lists; the ``numpy-strict`` backend checks them again at
run time):

1. ``NAMESPACE``: the array functions, dtypes and constants the engine may call through
   ``fpsim.backend.xp``, with NumPy's semantics for the argument forms used. All of them are
   exact or exactly defined on the values the engine passes (elementwise IEEE +, -, *, /,
   sqrt, comparisons, ``where``, integer and bit operations, shape and index operations,
   float64 matrix products whose rounding the exact layer certifies for any summation order).
   None of them is libm (no exp, log, tanh): those are computed from these primitives in
   ``fpsim.exact.elementary``, so every backend gets the same float64 numbers. The one
   exception is ``power``, which is libm's ``pow`` for non-integer exponents; only
   ``fpsim.autograd``'s ``pow`` uses it, and its docstring says it is not portable. Unsigned
   integers take only ``& | ^ ~ == !=`` (all torch has on uint32/uint64): bit work on
   patterns uses signed views (``bitcast``).
2. ``ARRAY_ATTRIBUTES``: the only attributes the engine reads from an array (``shape``,
   ``ndim``, ``dtype``, ``T``), besides indexing and the arithmetic, comparison and bit
   operators. Every array library has these with one meaning; methods such as ``astype``,
   ``view``, ``copy``, ``reshape``, ``sum``, or ``size`` (an attribute in NumPy, a method
   in torch) are not used on arrays: they are functions of the namespace or kernels below.
3. ``Backend``: the kernels that differ between array libraries and cannot be written once
   on the namespace: rounding to a format (``round_to``, every mode), the counter-based
   uniforms of stochastic rounding (``uniforms``), casts and copies (``astype``, ``copy``),
   element counts (``size``), 0-d values of a dtype (``scalar``), dtype tests
   (``isdtype``), bit views (``bits`` / ``from_bits`` / ``bitcast``), memory layout
   (``is_contiguous``), host transfer (``asarray`` / ``to_numpy`` / ``to_list`` /
   ``host_bytes``), per-thread work buffers (``scratch``), reuse of a buffer nothing else
   refers to (``is_unshared``), +0 where a mask holds (``zero_where``, relu) and the
   library's floating-point error state (``errstate``);
   and its speed settings, ``tuning`` (``tuning.py``: chunk sizes and path thresholds, never
   a value).

Where the array API standard (data-apis.org) names the operation, the kernel takes its name
and semantics (``astype(x, dtype, copy=True)``, ``isdtype(dtype, kind)``).

Everything else the engine needs, exact dot products under every accumulation model, exact
fixed-order sums, scatter-adds without atomics and the correctly rounded transcendentals, is
written once in ``fpsim.exact`` on these levels, so a new backend gets it with the same bits
by construction; rounding and Philox are written once too (``fpsim.rounding.portable``, the
default ``round_to`` and ``uniforms`` below). A backend may implement a kernel faster in its
own way (NumPy's threaded rounding kernels, a fused CUDA kernel) only with the same bits,
which the parity tests check: ``tests/test_rounding_portable.py`` (every format, mode and
special value against the portable reference), ``tests/test_strict_backend.py`` (the engine's
tests on a second backend, same bits as NumPy) and ``tests/test_backend_seam.py`` (a training
run on a registered backend gives NumPy's bits).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..rounding import round_to as host_round_to
from ..rounding.portable import philox_uniforms_portable, round_to_portable
from .tuning import Tuning

__all__ = ["NAMESPACE", "FUSED_KERNELS", "ARRAY_ATTRIBUTES", "DTYPE_KINDS", "ENGINE_PACKAGES",
           "HOST_PACKAGES", "HOST_MODULES", "PORTABLE_MODULES", "is_engine_module", "Backend"]

NAMESPACE = frozenset("""
    ndarray generic integer bool_ float16 float32 float64 int8 int32 int64 intp uint8 uint16
    uint32 uint64 dtype inf nan
    asarray array ascontiguousarray zeros ones empty full zeros_like ones_like empty_like
    full_like arange copyto
    add subtract multiply divide negative abs sqrt maximum minimum power divmod trunc rint round
    copysign nextafter spacing frexp ldexp signbit sign floor ceil
    equal not_equal less less_equal greater greater_equal logical_not logical_and logical_or
    isfinite isnan isinf where clip
    bitwise_and bitwise_or bitwise_xor invert left_shift right_shift
    sum prod cumsum all any count_nonzero argmax argsort nonzero flatnonzero unique bincount
    max min
    matmul einsum
    reshape moveaxis swapaxes transpose expand_dims squeeze broadcast_to broadcast_arrays
    broadcast_shapes shape atleast_1d concatenate stack split delete ix_ take_along_axis
    put_along_axis take array_equal shares_memory errstate
""".split())

#: the fused kernels a backend may offer (``Backend.fused``): each one computes what the exact
#: layer's own code computes on the namespace, the same bits for every input it accepts, in
#: one compiled pass instead of dozens of array passes (the exact layer runs its own code
#: where a backend offers none, and the parity tests force both). A kernel may decline an
#: input by returning None (``certify_fp32_open``: widths not all > 0, arrays of another
#: library); the exact layer's code then runs:
#:
#: - ``exp(y)``: ``fpsim.exact.elementary.exp`` of a float64 array (any shape), inf, -inf
#:   and NaN included: a new array of y's shape;
#: - ``normal_tail(x, table)``: (Phi(x), exp(-(x*x)/2)) of a float64 array (any shape) with
#:   every |x| <= 20, ``fpsim.exact.elementary``'s table path (``_phi_on_table`` and its
#:   Gaussian factor), ``table`` its (16, 81) float64 Taylor coefficients of the Mills ratio
#:   (``elementary._gelu_table``, the caller's: the kernel does not rebuild them);
#: - ``certify_fp32_open(approx, width_rows, width_cols, high, row_blocks)``:
#:   ``fpsim.exact.certificate.certify_fp32_open``, the same open elements and ends;
#: - ``certified_row_sums(terms)``: ``fpsim.exact.sums``' row certificate on a 2-D float64
#:   array of finite terms: (values, decided), each decided row's value its exact sum
#:   rounded to odd at 53 bits (the other rows are summed in limbs by the caller).
#: - ``unfold(source, kernel, stride, dilation, offset, spread, batch_start, batch_stop,
#:   row_start, row_stop, width, first, stop, column_major)``: ``fpsim.autograd.im2col``'s
#:   ``unfold`` of a 4-D float32 or float64 source (any strides), the ``Unfolding``'s fields
#:   as tuples, the batch and rows as ints: the same array (shape, dtype, bits, layout).
#: - ``softmax_row_terms(x)``: ``fpsim.exact.softmax.row_terms`` of a 2-D float64 array of
#:   rows: the tuple (s, err, e, t, eps_e, eps_t, top), every array the same bits; None for
#:   rows the exact layer sums with NumPy (wider than 4096, a non-finite e beside the first
#:   maximum) or whose maximum is a zero present with both signs (NumPy's pick unknown);
#: - ``softmax_proxy(x)``: ``fpsim.exact.softmax.cr_softmax``'s (v, bound) from those terms,
#:   v = e / (top + t) and bound = eps_e + eps_t + 2 * 2**-53, the same bits; None where
#:   ``softmax_row_terms`` declines (so t is finite in the rows it takes).
#: - ``widen_with_norms(x, out, axis, quanta)``: ``fpsim.exact.widening.widen_with_norms``'s
#:   passes over a 2-D float32 array x: its values copied into ``out`` (float64, x's shape,
#:   C- or F-ordered), and (squares, patterns), each line's (along ``axis``) sum of squares
#:   of those values in any order (the norms' bound holds for every order) and, with
#:   ``quanta``, its ``certificate.lowest_bit_patterns`` (the same bits), else None.
#: - ``exact_dots(a, b, rows, cols)``: ``fpsim.exact.open_elements.exact_elements``' exact
#:   step: a (R, K) and b (K, C) float32 or float64 arrays (any layout), integer rows and cols
#:   of one length: (values, decided), float32 values each decided element's exact dot
#:   product rounded once to fp32 (nearest even, IEEE zero sign; the caller sums the others).
FUSED_KERNELS = frozenset({"exp", "normal_tail", "certify_fp32_open", "certified_row_sums",
                           "unfold", "widen_with_norms", "softmax_row_terms", "softmax_proxy",
                           "exact_dots"})

#: what the engine may read from an array object itself (indexing and operators aside)
ARRAY_ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "T"})

#: ``isdtype``'s kinds, as the array API standard names them
DTYPE_KINDS = frozenset({"bool", "signed integer", "unsigned integer", "integral",
                         "real floating", "numeric"})

#: the packages above the seam that compute on backend arrays (the engine) ...
ENGINE_PACKAGES = frozenset({"exact", "quant", "autograd", "nn", "optim", "scaling", "train"})
#: ... and the host adapters above it that read and write files, draw figures and talk to
#: frameworks: engine data reaches them as host arrays (``to_numpy``), and they may use NumPy
HOST_PACKAGES = frozenset({"experiments", "plots", "conformance", "cli", "__main__", "sweep"})
HOST_MODULES = frozenset({"fpsim.train.checkpoint", "fpsim.train.trace", "fpsim.train.data",
                          "fpsim.train.cli", "fpsim.train.factories", "fpsim.train.runs",
                          "fpsim.train.run_records",
                          # read a torch model's graph (torch.fx, torch.export) when converting
                          # it: torch is their input there, as a framework is a conformance
                          # adapter's; the converted model runs autograd ops only
                          "fpsim.nn.traced", "fpsim.nn.exported"})
#: below the seam but written on the namespace and kernels for every backend, so bound to the
#: same rules: the reference rounding and Philox that ``Backend`` runs by default
PORTABLE_MODULES = frozenset({"fpsim.rounding.portable"})


def is_engine_module(module: str) -> bool:
    """Whether the module named ``module`` is engine code, bound to the seam's rules."""
    parts = module.split(".")
    return (len(parts) > 1 and parts[0] == "fpsim" and parts[1] in ENGINE_PACKAGES
            and module not in HOST_MODULES) or module in PORTABLE_MODULES


class Backend:
    """One array library behind the engine. Subclasses set ``name`` and ``xp`` (a module or
    object with every name of ``NAMESPACE``) and implement the kernels below; see
    ``fpsim.backend.numpy_backend`` for the reference implementation. ``tuning`` holds its
    speed settings (``tuning.py``), which never change a value."""

    name: str = ""
    xp: Any = None          # each library's own namespace type
    tuning: Tuning = Tuning()
    #: the container of every fpsim Format (every format's values fit a float32 exactly)
    container: Any = None   # each library's own dtype type

    def activate(self) -> None:
        """Called when this backend becomes the current one (``set_backend``, ``use_backend``,
        leaving a ``use_backend`` block): a backend whose namespace makes arrays on a device
        points it at its own (torch, ``torch_namespace.PLACEMENT``). Nothing by default."""

    def asarray(self, data, dtype=None):
        """Host data (array, nested lists, scalar) or an array of this backend as an array of
        ``dtype`` (default: the container) on this backend; no copy when it already is one."""
        raise NotImplementedError

    def to_numpy(self, array):
        """The same values as a host NumPy array."""
        raise NotImplementedError

    def is_array(self, obj) -> bool:
        raise NotImplementedError

    def to_list(self, array):
        """The values as (nested) Python floats, ints and bools on the host: a transfer."""
        return self.to_numpy(array).tolist()

    def host_bytes(self, array) -> bytes:
        """The values' bytes in C order, on the host (for hashing a run's data)."""
        return np.ascontiguousarray(self.to_numpy(array)).tobytes()

    def astype(self, array, dtype, copy: bool = True):
        """``array`` converted to ``dtype`` (IEEE round to nearest even between floats); with
        ``copy=False`` the array itself when it already has that dtype (array API)."""
        raise NotImplementedError

    def copy(self, array):
        """A new array with the same values, sharing no memory with ``array``."""
        raise NotImplementedError

    def size(self, array) -> int:
        """The number of elements, a Python int."""
        raise NotImplementedError

    def scalar(self, value, dtype):
        """``value`` (a Python number) as a 0-d value of ``dtype``, converted as ``astype``
        converts, that mixes with arrays of ``dtype`` without promoting them."""
        raise NotImplementedError

    def isdtype(self, dtype, kind: str) -> bool:
        """Whether ``dtype`` is of ``kind``, one of ``DTYPE_KINDS`` (array API)."""
        raise NotImplementedError

    def is_contiguous(self, array, order: str = "C") -> bool:
        """Whether ``array`` is laid out contiguously in ``order`` ("C": rows, "F": columns)."""
        raise NotImplementedError

    def zero_where(self, mask, values):
        """``where(mask, +0, values)``, bit for bit (inf and NaN in ``values`` kept)."""
        return self.xp.where(mask, self.scalar(0, values.dtype), values)

    def is_unshared(self, array) -> bool:
        """Whether nothing but the caller's one local variable refers to ``array``'s memory,
        so that the engine may keep it instead of copying (PyTorch's AccumulateGrad steals a
        gradient nobody else holds the same way). ``False`` is always a correct answer."""
        return False

    def bitcast(self, array, dtype):
        """``array``'s bits read as ``dtype`` of the same width (a view, no copy)."""
        raise NotImplementedError

    #: each float dtype and the unsigned dtype of its width, as this library names them
    bit_dtypes: dict = {}

    def bits(self, array):
        """float32 (float64) array viewed as its uint32 (uint64) IEEE bit patterns."""
        uint = self.bit_dtypes.get(array.dtype)
        if uint is None:
            raise TypeError(f"bits() takes float32 or float64 arrays, got {array.dtype}")
        return self.bitcast(array, uint)

    def from_bits(self, pattern):
        """uint32 (uint64) array viewed as float32 (float64)."""
        for flt, uint in self.bit_dtypes.items():
            if pattern.dtype == uint:
                return self.bitcast(pattern, flt)
        raise TypeError(f"from_bits() takes uint32 or uint64 arrays, got {pattern.dtype}")

    def round_to(self, x, fmt, mode="nearest_even", *, seed=None, offset=None,
                 subnormals=None, saturate=None, daz=False):
        """``fpsim.rounding.round_to`` on this backend's arrays, the same bits. By default
        ``fpsim.rounding.portable.round_to_portable`` on this backend's namespace and kernels
        (every mode, stochastic rounding, FTZ, DAZ, saturation); a backend may override it
        with a faster kernel under the parity tests (``tests/test_rounding_portable.py``).
        Host values (Python numbers, exact rationals, NumPy scalars and arrays) are rounded on
        the host by ``fpsim.rounding.round_to`` and come back as host values."""
        if not self.is_array(x):
            return host_round_to(x, fmt, mode, seed=seed, offset=offset,
                                 subnormals=subnormals, saturate=saturate, daz=daz)
        return round_to_portable(self, x, fmt, mode, seed=seed, offset=offset,
                                 subnormals=subnormals, saturate=saturate, daz=daz)

    def uniforms(self, seed: int, offset: int, n: int):
        """The n float64 uniforms of stochastic rounding for elements ``offset .. offset+n-1``
        under ``seed`` (Philox4x32-10, as ``fpsim.rounding.philox_uniforms``); by default
        ``philox_uniforms_portable`` on this backend's namespace."""
        return philox_uniforms_portable(self, seed, offset, n)

    def scratch(self, slot, dtype, n: int):
        """A work array of n elements of ``dtype`` for this thread, reused between calls with
        the same slot name: callers overwrite it before reading and never return it."""
        raise NotImplementedError

    def errstate(self, **settings):
        """A context manager silencing (``"ignore"``) floating-point warnings where the
        library raises them; infinities and NaNs are always produced as IEEE says."""
        raise NotImplementedError

    def fused(self, kernel: str):
        """The compiled ``kernel`` (one of ``FUSED_KERNELS``) this backend offers now, or None:
        the exact layer then runs its own code (the reference). None by default."""
        return None

    def versions(self) -> dict:
        """Library names and versions, for run records."""
        raise NotImplementedError
