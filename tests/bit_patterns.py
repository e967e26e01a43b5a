"""Bit-pattern comparison for the fast-path tests: equal shapes, dtypes and bits (the sign of
zero and every NaN payload included)."""
import numpy as np


def bits(x):
    x = np.asarray(x)
    return x.view(np.uint32 if x.dtype == np.float32 else np.uint64)


def same_bits(x, y) -> bool:
    x, y = np.asarray(x), np.asarray(y)
    return x.shape == y.shape and x.dtype == y.dtype and np.array_equal(bits(x), bits(y))
