"""Reductions (sum, mean, max) and softmax / log_softmax, each beside its backward.

Where each rounds:

- ``sum`` (autocast float32 list, policy ``wide``): the accumulation model sums the exact
  values into an fp32 accumulator and rounds once to the output format.
  Backward: the gradient, broadcast back, converted to the input's gradient format.
- ``mean`` (on neither autocast list, policy ``elementwise``: promote): sum as above into fp32,
  one float32 division by the count, one rounding to the output format (PyTorch's half mean:
  accumulate in float, divide, cast). Backward: g / count in float32, rounded to ``grad_fmt``.
- ``max`` (``elementwise``): no rounding (the result is an input value). Backward: the
  gradient goes to the first maximal element along the axis, like ``torch.max(x, dim)``.
- ``softmax`` / ``log_softmax`` (policy ``wide``): correctly rounded to the output format
  (``fpsim.exact.softmax``: libm-free float64 with the max subtracted, log-softmax as
  (x_i - m) - log1p(t), certified by an error bound, Decimal for the rare uncertified
  element). Backward from the rounded output y, in float64 (exp libm-free), rounded once (not
  certified): softmax ``y * (g - sum(g * y))``, log_softmax ``g - exp(y) * sum(g)``.

>>> from fpsim.autograd import Tensor
>>> x = Tensor([[1.0, 2.0, 3.0]], "fp16", requires_grad=True)
>>> x.softmax(-1).data
array([[0.09003057, 0.24472848, 0.66524094]], dtype=float32)
>>> x.mean().fmt.name, x.sum().fmt.name        # "32-true": everything fp32 except x itself
('fp16', 'fp32')
"""
from __future__ import annotations

import builtins
import math

from .. import backend
from ..backend import xp

from ..exact import cr_log_softmax, cr_softmax, log_softmax64, softmax64
from ..exact import elementary
from ..formats import FP32
from ..options import check_instance
from .numerics import FP64, round_array
from .accumulate import acc_sum
from .accumulate import accumulation_model as _model
from .ops_shape import convert, operands
from .tensor import Tensor, record, register

__all__ = ["sum", "mean", "max", "softmax", "log_softmax"]

_builtin_max = builtins.max  # this module defines its own max and sum


def _axes(x: Tensor, axis, op: str):
    """Normalised tuple of axes (all for None), with a clear error for bad ones."""
    if axis is None:
        return tuple(range(x.ndim))
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    out = []
    for a in axes:
        check_instance(f"{op}: axis", a, (int, xp.integer), "None, an int or a tuple of ints")
        if not -x.ndim <= a < _builtin_max(x.ndim, 1):
            raise ValueError(f"{op}: axis {a} is out of range for shape {x.shape}")
        out.append(int(a) % _builtin_max(x.ndim, 1))
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: repeated axis in {axis}")
    return tuple(out)


def _expand(g, x_shape, axes, keepdims):
    """The gradient of a reduction, with the reduced axes put back and broadcast to x."""
    if not keepdims:
        for a in sorted(axes):
            g = xp.expand_dims(g, a)
    return xp.broadcast_to(g, x_shape)


def sum(x, axis=None, keepdims: bool = False, *, accumulation=None) -> Tensor:  # noqa: A001
    fmt, (x,) = operands("wide", x)
    axes = _axes(x, axis, "sum")
    model = _model(accumulation)
    out = acc_sum(x.data, axes, keepdims, fmt, model)

    def backward(g, g_fmt):
        return (convert(xp.ascontiguousarray(_expand(g, x.shape, axes, keepdims)), g_fmt,
                        x.grad_fmt),)

    return record(out, fmt, (x,), backward, "sum")


def mean(x, axis=None, keepdims: bool = False, *, accumulation=None) -> Tensor:
    fmt, (x,) = operands("elementwise", x)
    axes = _axes(x, axis, "mean")
    count = math.prod(x.shape[a] for a in axes)
    if count == 0:
        raise ValueError(f"mean over an empty axis of shape {x.shape}")
    acc_fmt = FP64 if fmt is FP64 else FP32
    total = acc_sum(x.data, axes, keepdims, acc_fmt, _model(accumulation))
    with xp.errstate(over="ignore", under="ignore"):
        out = round_array(xp.asarray(total / backend.scalar(count, total.dtype)), fmt)

    def backward(g, g_fmt):
        with xp.errstate(under="ignore"):
            share = round_array(xp.asarray(g / backend.scalar(count, g.dtype)), x.grad_fmt)
        return (xp.ascontiguousarray(_expand(share, x.shape, axes, keepdims)),)

    return record(out, fmt, (x,), backward, "mean")


def max(x, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Largest element (``axis=None``) or largest along one int ``axis``."""
    fmt, (x,) = operands("elementwise", x)
    if axis is not None:
        check_instance("max: axis", axis, (int, xp.integer), "None or one int axis")
    if x.size == 0:
        raise ValueError(f"max of an empty tensor of shape {x.shape}")
    flat = xp.reshape(x.data, (-1,)) if axis is None else x.data
    ax = 0 if axis is None else _axes(x, axis, "max")[0]
    index = xp.expand_dims(xp.argmax(flat, axis=ax), ax)
    out = xp.take_along_axis(flat, index, ax)
    if axis is None:
        out = xp.reshape(out, (1,) * x.ndim if keepdims else ())
    elif not keepdims:
        out = xp.squeeze(out, ax)
    out = convert(xp.ascontiguousarray(out), x.fmt, fmt)

    def backward(g, g_fmt):
        full = xp.zeros(flat.shape, g.dtype)
        xp.put_along_axis(full, index, xp.reshape(g, index.shape), ax)
        return (convert(xp.reshape(full, x.shape), g_fmt, x.grad_fmt),)

    return record(out, fmt, (x,), backward, "max")


def _check_axis(x, axis, op):
    """The one axis ``op`` works along (a tuple is refused, not cut to its first axis)."""
    check_instance(f"{op}: axis", axis, (int, xp.integer), "one int axis")
    return _axes(x, axis, op)[0]


def softmax(x, axis: int = -1) -> Tensor:
    fmt, (x,) = operands("wide", x)
    ax = _check_axis(x, axis, "softmax")
    with xp.errstate(invalid="ignore", under="ignore"):
        if fmt is FP64:
            value = _along(softmax64, x.data, ax)
        else:
            value = cr_softmax(x.data, ax, fmt)
        out = round_array(xp.ascontiguousarray(value), fmt)

    def backward(g, g_fmt):
        y, g64 = backend.astype(out, xp.float64), backend.astype(g, xp.float64)
        with xp.errstate(invalid="ignore", under="ignore"):
            return (round_array(y * (g64 - xp.sum(g64 * y, axis=ax, keepdims=True)),
                                x.grad_fmt),)

    return record(out, fmt, (x,), backward, "softmax")


def _along(rowwise, d, ax):
    """``rowwise`` (on (R, n) float64 rows) applied along axis ``ax`` of ``d``."""
    moved = xp.moveaxis(xp.asarray(d, xp.float64), ax, -1)
    rows = rowwise(xp.reshape(moved, (-1, moved.shape[-1])))
    return xp.moveaxis(xp.reshape(rows, moved.shape), -1, ax)


def log_softmax_along(d, ax):
    """Libm-free float64 log-softmax along ``ax`` (``fpsim.exact.log_softmax64``)."""
    return _along(log_softmax64, d, ax)


def log_softmax(x, axis: int = -1) -> Tensor:
    fmt, (x,) = operands("wide", x)
    ax = _check_axis(x, axis, "log_softmax")
    with xp.errstate(invalid="ignore", under="ignore"):
        if fmt is FP64:
            value = log_softmax_along(x.data, ax)
        else:
            value = cr_log_softmax(x.data, ax, fmt)
        out = round_array(xp.ascontiguousarray(value), fmt)

    def backward(g, g_fmt):
        g64 = backend.astype(g, xp.float64)
        with xp.errstate(invalid="ignore", under="ignore"):
            return (round_array(g64 - elementary.exp(backend.astype(out, xp.float64))
                                * xp.sum(g64, axis=ax, keepdims=True), x.grad_fmt),)

    return record(out, fmt, (x,), backward, "log_softmax")


register(sum, mean, max, softmax, log_softmax)
