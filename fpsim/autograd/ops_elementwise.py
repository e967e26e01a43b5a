"""Elementwise ops with broadcasting, each beside its backward.

Where each rounds (``fmt`` is the op's output format from the policy, see ``ops_shape.operands``):

- Arithmetic (add, sub, mul, div, neg, sqrt, relu): one IEEE float32 operation on the operands'
  exact values, then one rounding to ``fmt``. This is PyTorch's own scheme for half/bfloat16
  kernels (compute in float32, the "opmath" type, then cast). For operands already in ``fmt``
  with precision p <= 11 bits (fp16, bf16, fp8) the two roundings equal one correct rounding in
  the normal range (double rounding is innocuous when 24 >= 2p + 2). A Python scalar operand is
  converted to float32 first, like PyTorch's opmath scalar.
- Transcendental ops (exp, log, tanh, sigmoid, gelu, pow): evaluated in float64 from the exact
  operand values and rounded once to ``fmt``, so the bits do not depend on the float32 SIMD
  math library. NumPy's float64 functions are within an ulp or so of exact: the result can
  differ from the correctly rounded one only when the float64 value lies within those ulps of a
  rounding boundary of ``fmt`` (about 2**-28 relative for fp32 output).
- Backward: single-operation gradients (g, -g, g*y, g/y, relu's mask) in float32 opmath,
  composite formulas (tanh's g*(1-y*y), div's -g*x/y**2, ...) in float64; each rounded once to
  the input's ``grad_fmt``. Where an input was broadcast, the full-shape gradient is then
  summed over the broadcast axes by the accumulation model and rounded to ``grad_fmt`` again
  (PyTorch: ``sum_to_size`` on the gradient).

Categories: ``exp``, ``log``, ``pow`` are on autocast's float32 list (policy ``wide``); the rest
are ``elementwise`` (promote by default).

>>> from fpsim.autograd import Tensor
>>> x = Tensor([1.0, 2.0], "fp16", requires_grad=True)
>>> y = (x * 0.1).tanh(); y.fmt.name, y.data
('fp16', array([0.09967041, 0.1973877 ], dtype=float32))
"""
from __future__ import annotations

import math
from numbers import Real

import numpy as np

from .numerics import round_array
from .accumulate import accumulation_model as _model
from .accumulate import sum_to_shape as _unbroadcast
from .ops_shape import convert, operands
from .tensor import Tensor, record, register

__all__ = ["add", "sub", "mul", "div", "neg", "pow", "exp", "log", "sqrt", "tanh", "sigmoid",
           "relu", "gelu"]


def _is_scalar(v) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool) or (
        isinstance(v, np.generic) and v.dtype.kind in "fiu")


def _opmath(data, scalar):
    """A Python scalar in the operand's arithmetic type (float32, or float64 in ref mode)."""
    return data.dtype.type(scalar)


def _broadcast_shape(a, b, op):
    try:
        return np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ValueError(f"{op}: shapes {a.shape} and {b.shape} do not broadcast") from None


def _binary(op, a, b, forward, grad_a, grad_b, exact_grads=False):
    """Shared body of add/sub/mul/div. ``grad_a(g, x, y, out)`` is a's full-shape gradient
    before rounding; ``exact_grads``: those are exact in the output's gradient format (add,
    sub), so they are only converted."""
    if _is_scalar(a) or _is_scalar(b):
        return _with_scalar(op, a, b, forward, grad_a, grad_b, exact_grads)
    fmt, (a, b) = operands("elementwise", a, b)
    _broadcast_shape(a, b, op)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        out = round_array(forward(a.data, b.data), fmt)
    model = _model(None)

    def backward(g, g_fmt):
        ga = gb = None
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            if a.requires_grad:
                full = _grad_array(grad_a(g, a.data, b.data, out), g_fmt, a, exact_grads)
                ga = _unbroadcast(full, a.shape, a.grad_fmt, model)
            if b.requires_grad:
                full = _grad_array(grad_b(g, a.data, b.data, out), g_fmt, b, exact_grads)
                gb = _unbroadcast(full, b.shape, b.grad_fmt, model)
        return ga, gb

    return record(out, fmt, (a, b), backward, op)


def _grad_array(value, g_fmt, t, exact):
    """A computed gradient in ``t.grad_fmt``: converted if ``exact`` (its values are already
    in ``g_fmt``), else rounded once."""
    if exact:
        return convert(value, g_fmt, t.grad_fmt)
    return round_array(value, t.grad_fmt)


def _with_scalar(op, a, b, forward, grad_a, grad_b, exact_grads):
    scalar_first = _is_scalar(a)
    scalar, x = (a, b) if scalar_first else (b, a)
    fmt, (x,) = operands("elementwise", x)
    s = _opmath(x.data, scalar)
    args = (s, x.data) if scalar_first else (x.data, s)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        out = round_array(np.asarray(forward(*args), x.data.dtype), fmt)
    grad = grad_b if scalar_first else grad_a

    def backward(g, g_fmt):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            value = np.asarray(grad(g, *args, out))
            if value.shape != x.shape:
                value = np.broadcast_to(value, x.shape)
            return (_grad_array(value, g_fmt, x, exact_grads),)

    return record(out, fmt, (x,), backward, op)


def _f64(x):
    return np.asarray(x, np.float64)


def add(a, b) -> Tensor:
    return _binary("add", a, b, np.add, lambda g, x, y, o: g, lambda g, x, y, o: g, True)


def sub(a, b) -> Tensor:
    return _binary("sub", a, b, np.subtract, lambda g, x, y, o: g, lambda g, x, y, o: -g, True)


def mul(a, b) -> Tensor:
    return _binary("mul", a, b, np.multiply, lambda g, x, y, o: g * y, lambda g, x, y, o: g * x)


def div(a, b) -> Tensor:
    return _binary("div", a, b, np.divide, lambda g, x, y, o: g / y,
                   lambda g, x, y, o: -_f64(g) * _f64(x) / (_f64(y) * _f64(y)))


def _unary(op, x, category, forward, grad, *, exact=False):
    """``forward(data) -> float array``; ``grad(g, data, out) -> float array`` (x's gradient,
    before rounding). ``exact``: forward values are already in the input format and gradient
    values in the output's gradient format (neg, relu), so neither is rounded."""
    fmt, (x,) = operands(category, x)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        value = forward(x.data)
        out = convert(value, x.fmt, fmt) if exact else round_array(value, fmt)

    def backward(g, g_fmt):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            return (_grad_array(grad(g, x.data, out), g_fmt, x, exact),)

    return record(out, fmt, (x,), backward, op)


def neg(x) -> Tensor:
    return _unary("neg", x, "elementwise", np.negative, lambda g, d, o: -g, exact=True)


def relu(x) -> Tensor:
    """max(x, 0) (NaN stays NaN); the gradient is 0 where the output is <= 0, so 0 at x = 0,
    and passes through a NaN output, as PyTorch's ``threshold_backward`` on the result."""
    return _unary("relu", x, "elementwise", lambda d: np.maximum(d, d.dtype.type(0)),
                  lambda g, d, o: _zero_where_nonpositive(o, g), exact=True)


def _zero_where_nonpositive(o, g):
    """``np.where(o <= 0, +0, g)`` bit for bit (inf and NaN in g included), as an AND with an
    all-ones / all-zeros mask: five times faster than ``np.where`` on float32."""
    if g.dtype != np.float32 or g.shape != o.shape:
        return np.where(o <= 0, g.dtype.type(0), g)
    mask = np.less_equal(o, 0).astype(np.uint32)
    mask -= 1                                        # 1 -> 0, 0 -> 0xFFFFFFFF
    return np.bitwise_and(g.view(np.uint32), mask, out=mask).view(np.float32)


def sqrt(x) -> Tensor:
    """IEEE float32 square root (correctly rounded), then one rounding to the format."""
    return _unary("sqrt", x, "elementwise", np.sqrt,
                  lambda g, d, o: _f64(g) / (2.0 * _f64(o)))


def exp(x) -> Tensor:
    return _unary("exp", x, "wide", lambda d: np.exp(_f64(d)),
                  lambda g, d, o: _f64(g) * np.exp(_f64(d)))


def log(x) -> Tensor:
    return _unary("log", x, "wide", lambda d: np.log(_f64(d)), lambda g, d, o: _f64(g) / _f64(d))


def pow(x, exponent) -> Tensor:
    """``x ** exponent`` for a real scalar exponent (autocast's float32 list: ``wide``)."""
    if not _is_scalar(exponent):
        raise TypeError(f"pow takes a real scalar exponent, got {type(exponent).__name__}")
    p = float(exponent)
    return _unary("pow", x, "wide", lambda d: np.power(_f64(d), p),
                  lambda g, d, o: _f64(g) * p * np.power(_f64(d), p - 1.0))


def tanh(x) -> Tensor:
    return _unary("tanh", x, "elementwise", lambda d: np.tanh(_f64(d)),
                  lambda g, d, o: _f64(g) * (1.0 - np.tanh(_f64(d)) ** 2))


def _sigmoid64(d):
    d = _f64(d)
    # exp of a non-positive argument only, so no overflow for either sign
    z = np.exp(-np.abs(d))
    return np.where(d >= 0, 1.0 / (1.0 + z), z / (1.0 + z))


def sigmoid(x) -> Tensor:
    return _unary("sigmoid", x, "elementwise", _sigmoid64,
                  lambda g, d, o: _f64(g) * _sigmoid64(d) * (1.0 - _sigmoid64(d)))


_SQRT_HALF = math.sqrt(0.5)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_erfc = np.frompyfunc(math.erfc, 1, 1)  # libm's float64 erfc, element by element


def _gelu_cdf(d):
    # Phi(x) = erfc(-x / sqrt 2) / 2: no cancellation for negative x, where the textbook
    # (1 + erf(x / sqrt 2)) / 2 loses every digit (it gives 0 for x <= -8.3, not 1e-16...)
    return 0.5 * _erfc(_f64(d) * -_SQRT_HALF).astype(np.float64)


def gelu(x) -> Tensor:
    """Exact GELU, x * Phi(x) with the normal CDF through ``math.erfc`` (PyTorch's default
    ``approximate='none'``, whose float32 kernel, ``x * 0.5 * (1 + erf(x / sqrt 2))``, flushes
    GELU to 0 below x = -5.5 and loses relative accuracy before that; here the float64 value
    is within a few hundred float64 ulps of x * Phi(x) everywhere, then rounded once)."""
    return _unary("gelu", x, "elementwise", lambda d: _f64(d) * _gelu_cdf(d),
                  lambda g, d, o: _f64(g) * (_gelu_cdf(d) + _f64(d) * _INV_SQRT_2PI
                                             * np.exp(-0.5 * _f64(d) ** 2)))


register(add, sub, mul, div, neg, pow, exp, log, sqrt, tanh, sigmoid, relu, gelu)
