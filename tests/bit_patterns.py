"""Bit-pattern comparison for the fast-path tests: equal shapes, dtypes and bits (the sign of
zero and every NaN payload included). Backend arrays (any backend's) are brought to the host
first, so the same helpers compare NumPy arrays, torch tensors or a mix."""
import numpy as np

from fpsim import backend


def host(x) -> np.ndarray:
    """``x`` as a host NumPy array: the current backend's arrays through ``backend.to_numpy``,
    anything else (NumPy arrays and scalars, lists, CPU tensors) through ``np.asarray``."""
    return backend.to_numpy(x) if backend.is_array(x) else np.asarray(x)


def bits(x):
    x = host(x)
    return x.view(np.uint32 if x.dtype == np.float32 else np.uint64)


def same_bits(x, y) -> bool:
    x, y = host(x), host(y)
    return x.shape == y.shape and x.dtype == y.dtype and np.array_equal(bits(x), bits(y))
