"""The array library the engine computes with: the one place where array libraries differ.

Everything above this layer (``exact``, ``autograd``, ``nn``, ``optim``, ``scaling``,
``train``) reaches the array library only through this module, never by importing NumPy:

- ``xp``: the array namespace, restricted to the closed list ``NAMESPACE`` (elementwise IEEE
  arithmetic, comparisons, integer and bit operations, shapes, indexing, float64 products);
  asking it for anything else is an ``AttributeError`` that names the list;
- ``ARRAY_ATTRIBUTES``: the closed list of attributes the engine reads from an array
  (``shape``, ``ndim``, ``dtype``, ``T``); everything else is a function here;
- the kernels of ``Backend`` (``interface.py``): ``round_to`` (every mode), ``uniforms``
  (stochastic rounding's Philox draws), ``astype``, ``copy``, ``size``, ``scalar``,
  ``isdtype``, ``bits`` / ``from_bits`` / ``bitcast``, ``is_contiguous``, ``asarray`` /
  ``to_numpy`` / ``to_list`` / ``host_bytes`` (host transfer), ``is_array``, ``scratch``
  (per-thread work buffers), ``is_unshared`` (buffer reuse), ``errstate``;
- ``host_rng``: the host NumPy generator that draws initial weights and data, on the CPU
  for every backend so that every backend starts from the same numbers.

``tests/test_backend_seam.py`` proves it from the source: no module above this layer imports
an array library (``HOST_PACKAGES`` and ``HOST_MODULES``: plots, the CLI, experiments, sweeps
and the conformance adapters, which read and write files and talk to frameworks), every
``xp.NAME`` used is in ``NAMESPACE``, and no array attribute outside ``ARRAY_ATTRIBUTES`` is
read. The ``numpy-strict`` backend checks the same at run time, and what other array
libraries refuse or do differently (``strict.py``).

Which backend: NumPy is the default; ``numpy-strict`` is NumPy underneath with the checks above
(slow; for testing the engine); ``torch`` computes on PyTorch CPU tensors with NumPy's bits (listed
when PyTorch is installed, imported only when chosen; ``torch_backend.py``). ``available()`` lists
them; the GPU backends are further implementations of ``Backend``. ``set_backend(name)``,
``use_backend(name)`` (a context manager) or the ``FPSIM_BACKEND`` environment variable (read when
fpsim is imported; case and surrounding spaces do not matter; unset or empty means numpy) choose
one; the choice is process-wide, not per thread.

Containers: a value of any fpsim ``Format`` lives in a float32 array (every format fits one
exactly, see ``fpsim.formats``); the float64 reference mode of ``fpsim.autograd`` keeps float64
arrays. Integer arrays carry labels and indices.

>>> from fpsim import backend
>>> backend.name()
'numpy'
>>> hex(int(backend.bits(backend.asarray([1.0]))[0]))
'0x3f800000'
>>> float(backend.from_bits(backend.xp.asarray([0x3F80], backend.xp.uint32) << 16)[0])
1.0
>>> backend.xp.exp
Traceback (most recent call last):
AttributeError: xp.exp is not in fpsim's kernel namespace (fpsim.backend.NAMESPACE): ...
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys
from contextlib import contextmanager
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..options import check_instance
from .interface import (ARRAY_ATTRIBUTES, DTYPE_KINDS, FUSED_KERNELS, HOST_MODULES,
                        HOST_PACKAGES, NAMESPACE, Backend)
from .numpy_backend import NumpyBackend
from .strict import StrictBackend
from .tuning import Tuning

__all__ = ["NAMESPACE", "ARRAY_ATTRIBUTES", "DTYPE_KINDS", "HOST_PACKAGES", "HOST_MODULES",
           "Backend", "xp", "name", "current", "available", "register_backend", "set_backend",
           "use_backend", "asarray", "to_numpy", "to_list", "host_bytes", "is_array",
           "is_array_like", "astype", "copy", "size", "scalar", "isdtype", "is_contiguous",
           "is_unshared", "zero_where", "bitcast", "bits", "from_bits", "round_to", "uniforms",
           "scratch", "errstate", "fused", "FUSED_KERNELS", "host_rng", "is_generator",
           "array_text", "versions",
           "CONTAINER", "backend_from_environment", "accepted", "DEVICE_BACKENDS", "Tuning",
           "tuning", "use_tuning"]

def _torch_backend(device: str = "cpu") -> Backend:
    """The PyTorch backend on ``device``, imported only when chosen (importing torch takes
    seconds); a CUDA device that is not there is a ValueError saying so."""
    from .torch_backend import TorchBackend, cuda_problem
    problem = cuda_problem(device) if device != "cpu" else None
    if problem:
        raise ValueError(f"backend 'torch:{device}' {problem}")
    return TorchBackend(device)


#: "torch:cuda" and "torch:cuda:N": the torch backend on a CUDA device (not in available():
#: knowing whether a device is there takes importing torch)
DEVICE_BACKENDS = re.compile(r"(?P<library>torch):(?P<device>cuda(?::\d+)?)")


# backends that need a library fpsim does not require: name -> (module, how to install it)
OPTIONAL = {"torch": ("torch", "pip install 'fpsim[torch]' (PyTorch's CPU build)")}
_IMPLEMENTATIONS: dict[str, Callable[..., Backend]] = {"numpy": NumpyBackend,
                                                     "numpy-strict": StrictBackend}
if importlib.util.find_spec("torch") is not None:
    _IMPLEMENTATIONS["torch"] = _torch_backend
CONTAINER = np.float32  # the container of every fpsim Format, on every backend


class _Namespace:
    """``xp``: the current backend's array functions, only those in ``NAMESPACE``. Its
    attributes are filled in when the backend is chosen, so a lookup costs what a module
    attribute does."""

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise AttributeError(f"xp.{attr} is not in fpsim's kernel namespace "
                             f"(fpsim.backend.NAMESPACE): {', '.join(sorted(NAMESPACE))}")


if TYPE_CHECKING:
    # mypy reads xp as NumPy, the reference backend: the others offer its names with its meaning.
    import numpy as xp
else:
    xp = _Namespace()
_current: Backend = NumpyBackend()


def _install(chosen: Backend) -> None:
    global _current
    missing = sorted(attr for attr in NAMESPACE if not hasattr(chosen.xp, attr))
    if missing:
        raise ValueError(f"backend {chosen.name!r} lacks namespace names: {', '.join(missing)}")
    chosen.activate()
    vars(xp).clear()
    for attr in NAMESPACE:
        setattr(xp, attr, getattr(chosen.xp, attr))
    _current = chosen


def available() -> tuple[str, ...]:
    """The backends this fpsim has."""
    return tuple(_IMPLEMENTATIONS)


def register_backend(backend_name: str, factory) -> None:
    """Make ``factory()`` (returning a ``Backend`` whose ``xp`` has every ``NAMESPACE`` name)
    selectable as ``backend_name``. A name already taken is refused."""
    check_instance("backend name", backend_name, str, "a non-empty string")
    if not backend_name:
        raise ValueError("backend name must be a non-empty string, got ''")
    if backend_name in _IMPLEMENTATIONS:
        raise ValueError(f"backend {backend_name!r} is already registered")
    _IMPLEMENTATIONS[backend_name] = factory


def _missing_library(backend_name: str) -> str:
    module, install = OPTIONAL[backend_name.split(":")[0]]
    return (f"backend {backend_name!r} needs {module}, which is not installed here: "
            f"{install}; available now: {', '.join(available())}")


def accepted() -> str:
    """The backend names this fpsim takes, in words (for error messages and --help)."""
    names = ", ".join(available())
    return f"{names}, torch:cuda, torch:cuda:N" if "torch" in _IMPLEMENTATIONS else names


def _make(backend_name: str) -> Backend:
    on_device = DEVICE_BACKENDS.fullmatch(backend_name) if isinstance(backend_name, str) \
        else None
    library = on_device["library"] if on_device else backend_name
    if library in OPTIONAL and library not in _IMPLEMENTATIONS:
        raise ValueError(_missing_library(backend_name))
    if on_device:
        return _torch_backend(on_device["device"])
    if not isinstance(backend_name, str) or backend_name not in _IMPLEMENTATIONS:
        error = ValueError if isinstance(backend_name, str) else TypeError
        raise error(f"unknown backend {backend_name!r}; accepted: {accepted()}")
    return _IMPLEMENTATIONS[backend_name]()


def set_backend(backend_name: str) -> None:
    """Make ``backend_name`` (one of ``available()``, or "torch:cuda" / "torch:cuda:N" where
    PyTorch sees a CUDA device) the backend of every later computation."""
    _install(_make(backend_name))


@contextmanager
def use_backend(backend_name: str):
    """``with use_backend("numpy"): ...`` runs the block on that backend, then restores the
    previous one (process-wide, not per thread)."""
    previous = _current
    set_backend(backend_name)
    try:
        yield _current
    finally:
        _install(previous)


def tuning() -> Tuning:
    """The current backend's speed settings (chunk sizes, path thresholds; never a value)."""
    return _current.tuning


@contextmanager
def use_tuning(**changes):
    """``with use_tuning(widen_chunk=37): ...``: the current backend with some speed settings
    changed for the block (tests force each computation path this way)."""
    chosen = _current
    before = chosen.tuning
    chosen.tuning = before._replace(**changes)
    try:
        yield chosen.tuning
    finally:
        chosen.tuning = before


def current() -> Backend:
    return _current


def name() -> str:
    return _current.name


def asarray(data, dtype=None):
    """``data`` as a backend array of ``dtype`` (default: the float32 container); no copy when
    it already is one. Converting float64 data to float32 rounds (to nearest even), so callers
    that need one exact rounding into a narrower format convert from float64 themselves."""
    return _current.asarray(data, dtype)


def to_numpy(array) -> np.ndarray:
    """A host NumPy array with the same values (the identity for the NumPy backend)."""
    return _current.to_numpy(array)


def is_array(obj) -> bool:
    """Whether ``obj`` is an array of the current backend."""
    return _current.is_array(obj)


def is_array_like(obj) -> bool:
    """Whether ``obj`` is an array of the current backend or a host array (anything with a
    ``dtype`` and a ``shape``) that ``asarray`` takes as it is."""
    return _current.is_array(obj) or hasattr(obj, "dtype") and hasattr(obj, "shape")


def to_list(array):
    """The values as (nested) Python numbers on the host: an explicit transfer."""
    return _current.to_list(array)


def host_bytes(array) -> bytes:
    """The values' bytes in C order, on the host (for hashing data)."""
    return _current.host_bytes(array)


def astype(array, dtype, copy: bool = True):
    """``array`` as ``dtype`` (array API ``astype``; floats round to nearest even)."""
    return _current.astype(array, dtype, copy)


def copy(array):
    """A new array with the same values, sharing no memory with ``array``."""
    return _current.copy(array)


def size(array) -> int:
    """The number of elements of ``array``."""
    return _current.size(array)


def scalar(value, dtype):
    """``value`` as a 0-d value of ``dtype`` that mixes with ``dtype`` arrays unpromoted."""
    return _current.scalar(value, dtype)


def isdtype(dtype, kind: str) -> bool:
    """Whether ``dtype`` is of ``kind`` (``DTYPE_KINDS``, the array API's names)."""
    return _current.isdtype(dtype, kind)


def is_contiguous(array, order: str = "C") -> bool:
    """Whether ``array`` is contiguous in ``order`` ("C" rows, "F" columns)."""
    return _current.is_contiguous(array, order)


def zero_where(mask, values):
    """+0 where ``mask`` holds, else ``values``, bit for bit."""
    return _current.zero_where(mask, values)


def is_unshared(array) -> bool:
    """Whether only the caller's one local variable refers to ``array``'s memory, so it may
    be kept rather than copied (call it with the array held in exactly one local variable)."""
    return _current.is_unshared(array)


def bitcast(array, dtype):
    """``array``'s bits read as ``dtype`` of the same width, without a copy."""
    return _current.bitcast(array, dtype)


def bits(array):
    """The IEEE bit patterns of a float32 (float64) array as uint32 (uint64), without a copy."""
    return _current.bits(array)


def from_bits(pattern):
    """Inverse of ``bits``: a uint32 (uint64) array read as float32 (float64), without a copy."""
    return _current.from_bits(pattern)


def round_to(x, fmt, mode="nearest_even", *, seed=None, offset=None, subnormals=None,
             saturate=None, daz=False):
    """``fpsim.rounding.round_to`` on the backend's arrays (the same bits on every backend)."""
    return _current.round_to(x, fmt, mode, seed=seed, offset=offset, subnormals=subnormals,
                             saturate=saturate, daz=daz)


def uniforms(seed: int, offset: int, n: int):
    """Stochastic rounding's uniforms: Philox4x32-10 keyed by ``seed``, counter = element."""
    return _current.uniforms(seed, offset, n)


def scratch(slot, dtype, n: int):
    """A reusable per-thread work array (overwritten before it is read, never returned)."""
    return _current.scratch(slot, dtype, n)


def errstate(**settings):
    return _current.errstate(**settings)


def fused(kernel: str):
    """The current backend's compiled ``kernel`` (one of ``FUSED_KERNELS``), or None: the
    exact layer then computes it on the namespace (the same bits)."""
    return _current.fused(kernel)


def versions() -> dict:
    return _current.versions()


def host_rng(seed=None) -> np.random.Generator:
    """The host generator for initial weights and data: ``seed`` as ``numpy.random
    .default_rng`` takes it, or a ``Generator`` passed through. Draws happen on the CPU for
    every backend (then ``asarray`` moves them), so all backends start from the same values."""
    if is_generator(seed):
        return seed
    return np.random.default_rng(seed)


def array_text(array, threshold: int = 8) -> str:
    """The values as NumPy prints them (summarised beyond ``threshold`` elements), for reprs."""
    return np.array2string(to_numpy(array), threshold=threshold)


def is_generator(obj) -> bool:
    """Whether ``obj`` is a host ``numpy.random.Generator``."""
    return isinstance(obj, np.random.Generator)


def backend_from_environment(value: "str | None") -> str:
    """The backend ``FPSIM_BACKEND=value`` chooses: case and surrounding spaces ignored,
    unset or empty meaning numpy; anything else is a ValueError that says what is accepted."""
    chosen = (value or "").strip().lower() or "numpy"
    on_device = DEVICE_BACKENDS.fullmatch(chosen)
    library = on_device["library"] if on_device else chosen
    if library in OPTIONAL and library not in _IMPLEMENTATIONS:
        raise ValueError(f"FPSIM_BACKEND={value!r}: {_missing_library(chosen)}")
    if chosen not in _IMPLEMENTATIONS and not on_device:
        raise ValueError(f"FPSIM_BACKEND={value!r} is not a backend of this fpsim; accepted: "
                         f"{accepted()} (unset FPSIM_BACKEND for numpy; CuPy is not part of "
                         f"this version)")
    return chosen


try:
    _install(_make(backend_from_environment(os.environ.get("FPSIM_BACKEND"))))
except ValueError as err:
    # ``python -m fpsim``: Python imports the package before any of fpsim's command-line code
    # runs (sys.argv[0] is "-m" until then), so the command's one-line error is given here
    if sys.argv[:1] == ["-m"]:
        sys.stderr.write(f"fpsim: error: {err}\n")
        raise SystemExit(2) from None
    raise
