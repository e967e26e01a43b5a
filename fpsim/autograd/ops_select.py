"""Selection by a boolean mask: ``where``, ``masked_fill`` and ``dropout``, each beside its
backward.

Neither op does arithmetic: every output element is one of its inputs' values, moved, so the
select itself never rounds. The only roundings are the format resolution before it:

- Tensor operands go through the ``elementwise`` category (``ops_shape.operands``): they
  promote to the widest of their formats (a widening, exact) by default, or are cast to the
  category's format when a policy sets one (a recorded cast, which rounds as every cast does).
- A Python scalar operand is rounded once into the output format, as PyTorch converts the
  scalar to the tensor's dtype. ``where`` rounds an out-of-range scalar to inf (as
  ``torch.where(m, half_tensor, 1e6)`` gives inf); ``masked_fill`` refuses a finite value the
  format cannot hold (``ValueError``, as ``masked_fill`` on a half tensor raises "value cannot
  be converted ... without overflow"), so ``x.masked_fill(mask, float("-inf"))`` is the way
  to mask attention scores in any format.

Backward: the output's gradient goes where the mask sent each value and +0 elsewhere (no
arithmetic, so values are only converted to each input's gradient format); an operand that
was broadcast then has its gradient summed over the broadcast axes by the accumulation model
and rounded once (PyTorch's ``sum_to_size``). The condition is a boolean array (NumPy or the
backend's, or nested lists), broadcast against the operands.

``dropout(x, p, seed=, offset=)`` is PyTorch's CPU dropout: x * noise, noise = 1/(1-p) where
kept and 0 where dropped (so a dropped NaN or inf gives NaN, a dropped -x gives -0, as
there). The scale is float32's 1 / float32(1 - p), rounded once more into x's format (the
noise tensor has x's dtype); x * noise is one float32 multiplication rounded to x's format;
backward: g * noise the same way. Which elements drop is PyTorch's distribution, not its bits:
element i (C order) drops when the Philox4x32-10 uniform of counter ``offset + i`` under key
``seed`` (``fpsim.backend.uniforms``, the generator of stochastic rounding) is < p, so a
(seed, offset) gives the same mask on every backend and thread count.

>>> from fpsim.autograd import Tensor
>>> x = Tensor([1.0, 2.0, 3.0], "fp16", requires_grad=True)
>>> y = masked_fill(x, [False, True, False], 0.1); y.fmt.name, y.data
('fp16', array([1.        , 0.09997559, 3.        ], dtype=float32))
>>> y.sum().backward(); x.grad.data
array([1., 0., 1.], dtype=float32)
"""
from __future__ import annotations

import math
from numbers import Real

from .. import backend
from ..backend import xp

from ..options import check_real
from .accumulate import accumulation_model, sum_to_shape
from .numerics import container_of, round_array
from .ops_shape import convert, operands
from .tensor import Tensor, record, register

__all__ = ["where", "masked_fill", "dropout"]


def _mask(condition, op):
    cond = xp.asarray(condition.data if isinstance(condition, Tensor) else condition)
    if not backend.isdtype(cond.dtype, "bool"):
        raise TypeError(f"{op}: the condition must be a boolean array, got dtype {cond.dtype}")
    return cond


def _is_scalar(v) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def _scalar_array(value, fmt, shape, refuse_overflow=False):
    """A Python scalar rounded once into ``fmt``, broadcast to ``shape``; with
    ``refuse_overflow``, a finite value that rounds to inf or NaN is a ``ValueError``."""
    one = backend.astype(round_array(xp.asarray([float(value)], xp.float64), fmt),
                         container_of(fmt))
    if refuse_overflow and math.isfinite(value) and not math.isfinite(float(one[0])):
        raise ValueError(f"masked_fill: value {value!r} cannot be converted to {fmt} without "
                         f"overflow")
    return xp.broadcast_to(xp.reshape(one, ()), shape)


def _routed(g, keep, t, g_fmt, model):
    """The gradient of operand ``t``: ``g`` where ``keep``, +0 elsewhere, in ``t.grad_fmt``,
    summed down to ``t.shape`` where ``t`` was broadcast."""
    full = convert(backend.zero_where(xp.logical_not(keep), g), g_fmt, t.grad_fmt)
    return sum_to_shape(full, t.shape, t.grad_fmt, model)


def where(condition, a, b) -> Tensor:
    """``a`` where ``condition`` holds, else ``b`` (broadcast together); ``a`` or ``b`` may
    be a Python scalar, rounded once into the output format (module doc)."""
    cond = _mask(condition, "where")
    if _is_scalar(a) and _is_scalar(b):
        raise TypeError("where: at least one of a, b must be a tensor")
    tensors = [v for v in (a, b) if not _is_scalar(v)]
    fmt, tensors = operands("elementwise", *tensors)
    try:
        shape = xp.broadcast_shapes(cond.shape, *(t.shape for t in tensors))
    except ValueError:
        raise ValueError(f"where: shapes {tuple(cond.shape)}, "
                         f"{[t.shape for t in tensors]} do not broadcast") from None
    it = iter(tensors)
    values = [_scalar_array(v, fmt, shape) if _is_scalar(v) else next(it) for v in (a, b)]
    arrays = [v if not isinstance(v, Tensor) else convert(v.data, v.fmt, fmt) for v in values]
    out = xp.where(cond, arrays[0], arrays[1])
    if out.shape != shape:      # a scalar next to a smaller tensor: where broadcasts anyway
        out = xp.broadcast_to(out, shape)
    out = xp.ascontiguousarray(out)
    model = accumulation_model(None)
    keeps = [xp.broadcast_to(cond, shape), xp.logical_not(xp.broadcast_to(cond, shape))]
    parents = tuple(v for v in values if isinstance(v, Tensor))
    routes = [keep for keep, v in zip(keeps, values) if isinstance(v, Tensor)]

    def backward(g, g_fmt):
        return tuple(_routed(g, keep, t, g_fmt, model) if t.requires_grad else None
                     for keep, t in zip(routes, parents))

    return record(out, fmt, parents, backward, "where")


def masked_fill(x, mask, value) -> Tensor:
    """``x`` with ``value`` (a real scalar) where ``mask`` holds; ``mask`` broadcasts to
    ``x``'s shape. ``value`` is rounded once into the output format; a finite value that
    overflows it is a ``ValueError`` (module doc)."""
    cond = _mask(mask, "masked_fill")
    if not _is_scalar(value):
        raise TypeError(f"masked_fill: value must be a real scalar, got {type(value).__name__}")
    fmt, (x,) = operands("elementwise", x)
    try:
        if xp.broadcast_shapes(cond.shape, x.shape) != x.shape:
            raise ValueError
    except ValueError:
        raise ValueError(f"masked_fill: mask shape {tuple(cond.shape)} does not broadcast to "
                         f"the input's shape {x.shape}") from None
    filler = _scalar_array(value, fmt, x.shape, refuse_overflow=True)
    data = xp.ascontiguousarray(xp.where(cond, filler, x.data))
    keep = xp.logical_not(xp.broadcast_to(cond, x.shape))
    model = accumulation_model(None)

    def backward(g, g_fmt):
        return (_routed(g, keep, x, g_fmt, model),)

    return record(data, fmt, (x,), backward, "masked_fill")


def dropout(x, p: float = 0.5, *, seed: int, offset: int = 0) -> Tensor:
    """Training-mode dropout of ``x`` with drop probability ``p`` in [0, 1], the mask drawn
    from Philox counters ``offset .. offset + x.size - 1`` under key ``seed`` (module doc).
    ``p = 1`` gives x * 0, as PyTorch."""
    p = check_real("p", p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    fmt, (x,) = operands("elementwise", x)
    opmath = x.data.dtype
    drawn = backend.uniforms(seed, offset, x.size)
    keep = xp.reshape(drawn >= p, x.shape)
    if p == 1.0:
        scale = xp.asarray([0.0], opmath)
    elif opmath == xp.float64:              # the float64 reference mode: no rounding
        scale = xp.asarray([1.0 / (1.0 - p)], xp.float64)
    else:                                   # torch: noise.div_(1 - p) in float32, x's dtype
        scale = round_array(xp.divide(xp.asarray([1.0], xp.float32),
                                      xp.asarray([1.0 - p], xp.float32)), fmt)
    noise = xp.where(keep, xp.reshape(scale, ()), backend.scalar(0.0, opmath))
    with xp.errstate(invalid="ignore", over="ignore"):
        out = round_array(x.data * noise, fmt)

    def backward(g, g_fmt):
        with xp.errstate(invalid="ignore", over="ignore", under="ignore"):
            return (round_array(backend.astype(g, opmath, copy=False) * noise, x.grad_fmt),)

    return record(out, fmt, (x,), backward, "dropout")


register(where, masked_fill, dropout)
