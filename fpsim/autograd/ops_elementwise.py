"""Elementwise ops with broadcasting, each beside its backward.

Where each rounds (``fmt`` is the op's output format from the policy, see ``ops_shape.operands``):

- Arithmetic (add, sub, mul, div, neg, sqrt, relu): one IEEE float32 operation on the operands'
  exact values, then one rounding to ``fmt``. This is PyTorch's own scheme for half/bfloat16
  kernels (compute in float32, the "opmath" type, then cast). For operands already in ``fmt``
  with precision p <= 11 bits (fp16, bf16, fp8) the two roundings equal one correct rounding in
  the normal range (double rounding is innocuous when 24 >= 2p + 2). A Python scalar operand is
  converted to float32 first, like PyTorch's opmath scalar.
- Transcendental ops (exp, log, tanh, sigmoid, silu, gelu): correctly rounded to ``fmt`` from the
  exact operand values (``fpsim.exact``: a float64 evaluation with + - * / only, certified by
  its error bound, a Decimal fallback for the rare uncertified element), so the bits depend on
  no math library. ``pow`` is still the backend's float64 ``xp.power`` (libm's ``pow`` on
  NumPy) rounded once, so its bits may differ between backends and machines.
- Backward: single-operation gradients (g, -g, g*y, g/y, relu's mask) in float32 opmath,
  composite formulas (tanh's g*(1-t*t) with t the libm-free float64 tanh, div's -g*x/y**2,
  ...) in float64; each rounded once to the input's ``grad_fmt``. Where an input was broadcast, the
  full-shape gradient is then summed over the broadcast axes by the accumulation model and rounded
  to ``grad_fmt`` again (PyTorch: ``sum_to_size`` on the gradient).

Categories: ``exp``, ``log``, ``pow`` are on autocast's float32 list (policy ``wide``); the rest
are ``elementwise`` (promote by default).

>>> from fpsim.autograd import Tensor
>>> x = Tensor([1.0, 2.0], "fp16", requires_grad=True)
>>> y = (x * 0.1).tanh(); y.fmt.name, y.data
('fp16', array([0.09967041, 0.1973877 ], dtype=float32))
"""
from __future__ import annotations

from numbers import Real

from .. import backend
from ..backend import xp

from ..options import check_real
from .numerics import FP64, round_array
from ..exact import cr_exp, cr_gelu, cr_log, cr_sigmoid, cr_silu, cr_tanh, silu64
from ..exact.correctly_rounded import (GELU_TANH_KAPPA, TWO_SQRT_2_OVER_PI, cr_gelu_tanh,
                                      gelu_tanh64, gelu_tanh_parts, nan_as_input)
from ..exact import elementary
from .accumulate import accumulation_model as _model
from .accumulate import sum_to_shape as _unbroadcast
from .ops_shape import convert, operands
from .tensor import Tensor, record, register

__all__ = ["add", "sub", "mul", "div", "neg", "pow", "exp", "log", "sqrt", "tanh", "sigmoid",
           "silu", "relu", "gelu", "leaky_relu", "elu"]


def _is_scalar(v) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool) or (
        isinstance(v, xp.generic) and backend.isdtype(v.dtype, "numeric"))


def _opmath(data, scalar):
    """A Python scalar in the operand's arithmetic type (float32, or float64 in ref mode)."""
    return backend.scalar(scalar, data.dtype)


def _broadcast_shape(a, b, op):
    try:
        return xp.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ValueError(f"{op}: shapes {tuple(a.shape)} and {tuple(b.shape)} do not "
                         f"broadcast") from None


def _binary(op, a, b, forward, grad_a, grad_b, exact_grads=False):
    """Shared body of add/sub/mul/div. ``grad_a(g, x, y, out)`` is a's full-shape gradient
    before rounding; ``exact_grads``: those are exact in the output's gradient format (add,
    sub), so they are only converted."""
    if _is_scalar(a) or _is_scalar(b):
        return _with_scalar(op, a, b, forward, grad_a, grad_b, exact_grads)
    fmt, (a, b) = operands("elementwise", a, b)
    _broadcast_shape(a, b, op)
    with xp.errstate(over="ignore", invalid="ignore", divide="ignore"):
        out = round_array(forward(a.data, b.data), fmt)
    model = _model(None)

    def backward(g, g_fmt):
        ga = gb = None
        with xp.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
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
    with xp.errstate(over="ignore", invalid="ignore", divide="ignore"):
        out = round_array(xp.asarray(forward(*args), x.data.dtype), fmt)
    grad = grad_b if scalar_first else grad_a

    def backward(g, g_fmt):
        with xp.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            value = xp.asarray(grad(g, *args, out))
            if value.shape != x.shape:
                value = xp.broadcast_to(value, x.shape)
            return (_grad_array(value, g_fmt, x, exact_grads),)

    return record(out, fmt, (x,), backward, op)


def _f64(x):
    return xp.asarray(x, xp.float64)


def add(a, b) -> Tensor:
    return _binary("add", a, b, xp.add, lambda g, x, y, o: g, lambda g, x, y, o: g, True)


def sub(a, b) -> Tensor:
    return _binary("sub", a, b, xp.subtract, lambda g, x, y, o: g, lambda g, x, y, o: -g, True)


def mul(a, b) -> Tensor:
    return _binary("mul", a, b, xp.multiply, lambda g, x, y, o: g * y, lambda g, x, y, o: g * x)


def div(a, b) -> Tensor:
    return _binary("div", a, b, xp.divide, lambda g, x, y, o: g / y,
                   lambda g, x, y, o: -_f64(g) * _f64(x) / (_f64(y) * _f64(y)))


def _unary(op, x, category, forward, grad, *, exact=False, correctly_rounded=None):
    """``forward(data) -> float array``; ``grad(g, data, out) -> float array`` (x's gradient,
    before rounding). ``exact``: forward values are already in the input format and gradient
    values in the output's gradient format (neg, relu), so neither is rounded.
    ``correctly_rounded(data, fmt)``: a float64 proxy that rounds to the correctly rounded
    result (``fpsim.exact``); ``forward`` then serves the float64 reference mode only."""
    fmt, (x,) = operands(category, x)
    with xp.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        if correctly_rounded is not None and fmt is not FP64:
            value = correctly_rounded(x.data, fmt)
        else:
            value = forward(x.data)
        out = convert(value, x.fmt, fmt) if exact else round_array(value, fmt)

    def backward(g, g_fmt):
        with xp.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            if exact:
                return (_grad_array(grad(g, x.data, out), g_fmt, x, exact),)
            # a NaN g comes back as itself, whatever NaN the formula makes of x beside it
            # (which of two NaNs a product returns is left open: ``nan_as_input``)
            value = nan_as_input(_f64(g), grad(g, x.data, out))
            return (_grad_array(value, g_fmt, x, exact),)

    return record(out, fmt, (x,), backward, op)


def neg(x) -> Tensor:
    return _unary("neg", x, "elementwise", xp.negative, lambda g, d, o: -g, exact=True)


def relu(x) -> Tensor:
    """x where x < 0 is false, else +0: NaN stays NaN (its payload too) and -0.0 stays -0.0,
    as PyTorch 2.13's ``torch.relu`` / ``F.relu`` (``clamp_min(x, 0)``) on CPU for fp16, bf16
    and fp32 (the tests compare bit for bit). The gradient is 0 where the output is <= 0, so
    0 at x = +-0, and passes through a NaN output, as PyTorch's ``threshold_backward``."""
    return _unary("relu", x, "elementwise", _relu_values,
                  lambda g, d, o: _zero_where_nonpositive(o, g), exact=True)


def _relu_values(d):
    return _zero_where(xp.less(d, 0), d)


def _zero_where_nonpositive(o, g):
    return _zero_where(xp.less_equal(o, 0), g)


def _zero_where(drop, values):
    """+0 where ``drop``, else ``values`` (relu and its gradient)."""
    return backend.zero_where(drop, values)


def sqrt(x) -> Tensor:
    """IEEE float32 square root (correctly rounded), then one rounding to the format."""
    return _unary("sqrt", x, "elementwise", xp.sqrt,
                  lambda g, d, o: _f64(g) / (2.0 * _f64(o)))


def exp(x) -> Tensor:
    """e**x correctly rounded to the output format (``fpsim.exact``, no libm). Backward:
    g * exp(x), the float64 product of g and exp(x) within 2**-50, rounded once (not always
    the correctly rounded gradient)."""
    return _unary("exp", x, "wide", elementary.exp,
                  lambda g, d, o: _f64(g) * elementary.exp(_f64(d)), correctly_rounded=cr_exp)


def log(x) -> Tensor:
    """Natural log correctly rounded (``fpsim.exact``). Backward: g / x in float64, rounded
    once (correctly rounded: one float64 division of exact values, then one rounding to a
    format of at most 24 bits, is innocuous double rounding)."""
    return _unary("log", x, "wide", elementary.log, lambda g, d, o: _f64(g) / _f64(d),
                  correctly_rounded=cr_log)


def pow(x, exponent) -> Tensor:
    """``x ** exponent`` for a real scalar exponent (autocast's float32 list: ``wide``).

    Still the backend's float64 ``power`` (libm for non-integer exponents), rounded once: unlike
    exp, log, tanh, sigmoid and gelu it is not certified correctly rounded, and its bits may
    differ between platforms by the last float64 ulp in rare near-midpoint cases."""
    if not _is_scalar(exponent):
        raise TypeError(f"pow takes a real scalar exponent, got {type(exponent).__name__}")
    p = float(exponent)
    return _unary("pow", x, "wide", lambda d: xp.power(_f64(d), p),
                  lambda g, d, o: _f64(g) * p * xp.power(_f64(d), p - 1.0))


def tanh(x) -> Tensor:
    """tanh correctly rounded (``fpsim.exact``). Backward: g * (1 - t*t) with t the float64
    tanh (within 2**-48), in float64, rounded once."""
    return _unary("tanh", x, "elementwise", elementary.tanh,
                  lambda g, d, o: _f64(g) * (1.0 - elementary.tanh(_f64(d)) ** 2),
                  correctly_rounded=cr_tanh)


def sigmoid(x) -> Tensor:
    """1 / (1 + e**-x) correctly rounded (``fpsim.exact``). Backward: g * s * (1 - s) with s
    the float64 sigmoid (within 2**-48), in float64, rounded once."""
    return _unary("sigmoid", x, "elementwise", elementary.sigmoid, _sigmoid_grad,
                  correctly_rounded=cr_sigmoid)


def _sigmoid_grad(g, d, o):
    s = elementary.sigmoid(d)                        # one evaluation, used twice
    return _f64(g) * s * (1.0 - s)


def silu(x) -> Tensor:
    """SiLU (swish), x sigmoid(x), correctly rounded (``fpsim.exact.cr_silu``); on neither
    autocast list (``elementwise``). Backward: g * s * (1 + x (1 - s)) with s the float64
    sigmoid (within 2**-48), in float64, rounded once."""
    def grad(g, d, o):
        s = elementary.sigmoid(d)
        return nan_as_input(_f64(d), _f64(g) * s * (1.0 + _f64(d) * (1.0 - s)))

    return _unary("silu", x, "elementwise", silu64, grad, correctly_rounded=cr_silu)


def gelu(x, approximate: str = "none") -> Tensor:
    """GELU, correctly rounded (``fpsim.exact``: no erf or tanh from libm), either form of
    PyTorch's ``approximate``:

    - ``"none"`` (default): exact GELU, x * Phi(x). PyTorch's float32 kernel,
      ``x * 0.5 * (1 + erf(x / sqrt 2))``, flushes GELU to 0 below x = -5.5 and loses relative
      accuracy before that; here x * Phi(x) is right down to where it leaves the format (x
      about -14 for fp32). Backward: g * (Phi(x) + x phi(x)) from the float64 Phi and phi
      (within 2**-49), in float64, rounded once.
    - ``"tanh"``: the real number 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3))), with the
      real constants sqrt(2/pi) and 0.044715, rounded once to the format
      (``fpsim.exact.cr_gelu_tanh``). PyTorch evaluates that formula step by step in float32,
      so its bits differ by a few ulps and, for x << 0 where 1 + tanh cancels, by more (the
      tests bound the difference). Backward: g * (s + x s (1 - s) y') with y = 2 sqrt(2/pi)
      (x + 0.044715 x**3), s = sigmoid(y), y' = 2 sqrt(2/pi) (1 + 3 * 0.044715 x**2), in
      float64, rounded once."""
    if approximate == "tanh":
        return _unary("gelu", x, "elementwise", gelu_tanh64, _gelu_tanh_grad,
                      correctly_rounded=cr_gelu_tanh)
    if approximate != "none":
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _unary("gelu", x, "elementwise", elementary.gelu, _gelu_grad,
                  correctly_rounded=cr_gelu)


# A NaN x gives x's own NaN as gradient (``nan_as_input``: the formulas would make it meet
# the NaN its normal_pdf or sigmoid derives, and which of two NaNs returns is left open).
def _gelu_grad(g, d, o):
    d = _f64(d)
    cdf, pdf = elementary.normal_cdf_pdf(d)          # one exp for both
    return nan_as_input(d, _f64(g) * (cdf + d * pdf))


def _gelu_tanh_grad(g, d, o):
    d = _f64(d)
    y, s = gelu_tanh_parts(d)
    slope = TWO_SQRT_2_OVER_PI * (1.0 + (3.0 * GELU_TANH_KAPPA) * (d * d))
    return nan_as_input(d, _f64(g) * (s + d * s * (1.0 - s) * slope))


def leaky_relu(x, negative_slope: float = 0.01) -> Tensor:
    """x where x > 0, else x * negative_slope: PyTorch's CPU kernel (``a > 0 ? a : a * s``
    with s the slope in float32, fp16 and bf16 computed in float32), so one float32 product
    rounded once to the format; NaN and -0.0 take the product (NaN, -0.0 for s > 0).
    Backward: g where x > 0, else g * s in float32, rounded once to the gradient format
    (``leaky_relu_backward``). On neither autocast list (``elementwise``)."""
    slope = check_real("negative_slope", negative_slope)

    def values(d):
        return xp.where(xp.greater(d, 0), d, d * _opmath(d, slope))

    def grad(g, d, o):
        return xp.where(xp.greater(d, 0), g, g * _opmath(g, slope))

    return _unary("leaky_relu", x, "elementwise", values, grad)


def elu(x, alpha: float = 1.0) -> Tensor:
    """x where x > 0, else alpha * (e**x - 1), as ``torch.nn.functional.elu`` (scale 1). The
    negative side is alpha times the libm-free float64 expm1 (``fpsim.exact.elementary``:
    within 3 float64 ulps), rounded once to the format: the correctly rounded value except
    within that error of a rounding boundary. PyTorch's kernel rounds expm1 (Sleef, 1 ulp)
    and then the float32 product by alpha: within 2 fp32 ulps of ours (1 for alpha = 1,
    whose product is exact). x >= 0, NaN and -0.0 pass unchanged. Backward: g where x > 0,
    else g * alpha * e**x (NaN for a NaN x), as ``elu_backward`` on the input, in float64,
    rounded once. On
    neither autocast list (``elementwise``)."""
    alpha = check_real("alpha", alpha)

    def values(d):
        d64 = _f64(d)
        negative = xp.less(d64, 0)
        return xp.where(negative, alpha * elementary.expm1_neg(xp.where(negative, d64, 0.0)),
                        d64)

    def grad(g, d, o):
        d64 = _f64(d)
        below = xp.logical_not(xp.greater(d64, 0))        # NaN too, as torch's kernel
        slope = alpha * elementary.exp(xp.where(below, d64, 0.0))
        return xp.where(below, _f64(g) * slope, _f64(g))

    return _unary("elu", x, "elementwise", values, grad)


register(add, sub, mul, div, neg, pow, exp, log, sqrt, tanh, sigmoid, silu, relu, gelu,
         leaky_relu, elu)
