"""The accumulation the ops share, on arrays: the policy's model, products and sums rounded to
a format, and gradients summed back down to a broadcast operand's shape.

Every op that adds many values (``matmul``, ``linear``, ``sum``, ``mean``, the reduction of a
broadcast operand's gradient in the elementwise ops) goes through ``acc_matmul`` / ``acc_sum``,
so the accumulation model (``fpsim.exact.accumulation``) decides every such rounding. In the
float64 reference mode they are plain float64 sums (``xp.sum``).

>>> import numpy as np
>>> from fpsim.formats import FP16
>>> g = np.ones((4096, 1), np.float32)
>>> float(sum_to_shape(g, (1, 1), FP16, accumulation_model("sequential:fp16"))[0, 0])
2048.0
"""
from __future__ import annotations

from .. import backend
from ..backend import xp

from ..exact.accumulation import get_accumulation
from ..exact.accumulation import matmul as _acc_matmul
from ..exact.accumulation import reduce_sum as _acc_sum
from .context import current_policy
from .numerics import FP64, round_array

__all__ = ["accumulation_model", "acc_matmul", "acc_sum", "sum_to_shape"]


def accumulation_model(accumulation):
    """``accumulation`` as a model, or the current policy's when it is None."""
    return (current_policy().accumulation if accumulation is None
            else get_accumulation(accumulation))


def acc_matmul(a, b, fmt, model):
    """a @ b with ``model`` accumulation, rounded to ``fmt`` (float64 in the reference mode)."""
    if fmt is FP64 or a.dtype == xp.float64 or b.dtype == xp.float64:
        return round_array(xp.matmul(backend.astype(a, xp.float64, copy=False),
                                     backend.astype(b, xp.float64, copy=False)), fmt)
    return _acc_matmul(a, b, out_fmt=fmt, model=model)


def acc_sum(x, axis, keepdims, fmt, model):
    """sum(x, axis) with ``model`` accumulation, rounded to ``fmt``."""
    if fmt is FP64 or x.dtype == xp.float64:
        return round_array(xp.asarray(xp.sum(x, axis=axis, keepdims=keepdims,
                                             dtype=xp.float64)), fmt)
    return xp.asarray(_acc_sum(x, axis=axis, keepdims=keepdims, out_fmt=fmt, model=model))


def sum_to_shape(g, shape, fmt, model):
    """Sum a gradient over the axes that broadcasting added or stretched, down to ``shape``,
    with the accumulation model, rounded to ``fmt``."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, n in enumerate(shape)
                                      if n == 1 and g.shape[i + lead] != 1)
    return xp.reshape(acc_sum(g, axes, True, fmt, model), shape)
