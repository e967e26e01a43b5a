"""Losses: cross-entropy from logits with integer labels, and mean squared error.

Both are in the policy's ``loss`` category (autocast's float32 list has ``cross_entropy`` and
``mse_loss``): inputs are cast to the loss format, and each loss is one fused op rounded once
from the exact input values. cross_entropy is correctly rounded: the exact real value of the
whole reduction (``fpsim.exact.cr_cross_entropy``, libm-free, certified, Decimal fallback).
mse_loss is correctly rounded too (``_squared_error``: a certified float64 sum, else exact
sums rounded to odd, then rounded once); an inf or NaN input gives the float64 IEEE value of
the formula, and in the float64 reference mode (``FP64``) it is plain float64 arithmetic.
Backward, in float64 (exp libm-free), rounded once to each input's gradient format (not
certified)::

    cross_entropy:  d logits = (softmax(logits) - onehot(labels)) * g / N     (mean)
    mse_loss:       d pred   = 2 * (pred - target) * g / N,   d target = -d pred

>>> from fpsim.autograd import Tensor
>>> logits = Tensor([[2.0, 0.0], [0.0, 2.0]], requires_grad=True)
>>> loss = cross_entropy(logits, [0, 1]); round(loss.item(), 6)
0.126928
>>> loss.backward(); logits.grad.data[0]
array([-0.05960146,  0.05960146], dtype=float32)
"""
from __future__ import annotations

import enum
from fractions import Fraction

from .. import backend
from ..options import check_choice
from ..backend import round_to, xp
from ..exact import certify, cr_cross_entropy, round_to_odd_sum, width_factor
from ..exact import elementary
from ..rounding import float64_round_to_odd
from .numerics import FP64, round_array
from .ops_reduce import log_softmax_along
from .ops_shape import operands
from .tensor import Tensor, record

__all__ = ["cross_entropy", "mse_loss", "Reduction"]


class Reduction(str, enum.Enum):
    """How a loss reduces its per-sample values, as names that are their strings too
    (``Reduction.SUM == "sum"``): either is accepted."""

    MEAN = "mean"
    SUM = "sum"
    NONE = "none"

    def __str__(self) -> str:
        return self.value


_REDUCTIONS = tuple(reduction.value for reduction in Reduction)


def _reduce(values, reduction):
    if reduction == "mean":
        return xp.asarray(xp.divide(xp.sum(values), backend.size(values)))   # numpy.mean's bits
    if reduction == "sum":
        return xp.asarray(xp.sum(values))
    return values


def _check_reduction(reduction, op):
    check_choice(f"{op} reduction", reduction, _REDUCTIONS)


def _labels(labels, n, classes):
    if isinstance(labels, Tensor):
        labels = labels.data
    labels = xp.asarray(labels)
    if not backend.isdtype(labels.dtype, "integral"):
        if (backend.isdtype(labels.dtype, "real floating") and backend.size(labels)
                and xp.all(labels == xp.round(labels))):
            labels = backend.astype(labels, xp.int64)
        else:
            raise TypeError(f"cross_entropy: labels must be integers, got dtype {labels.dtype}")
    if labels.shape != (n,):
        raise ValueError(f"cross_entropy: labels shape {labels.shape} != ({n},) for logits "
                         f"with batch size {n}")
    if backend.size(labels):
        low, high = int(xp.min(labels)), int(xp.max(labels))
        if low < 0 or high >= classes:
            raise ValueError(f"cross_entropy: labels must lie in [0, {classes}), got values "
                             f"from {low} to {high}")
    return backend.astype(labels, xp.intp)


def _squared_error(pred, target, finite, reduction, fmt) -> xp.ndarray:
    """A float64 value that rounds to ``fmt`` (nearest even) as the exact mse of the float32
    values where ``finite`` does (to any format, when it is the exact value rounded to odd).

    p - t may be inexact in float64, but (p - t)**2 = p*p - 2*p*t + t*t and each product of
    two float32 values is exact in float64: ``round_to_odd_sum`` adds them exactly, rounded
    to odd (see ``fpsim.exact.odd_rounding``). "sum", and "mean" over a power of two (an exact
    scaling), first try their float64 sum in any order: where the certificate's ends
    (``fpsim.exact.certificate``) round alike, the exact sum and the float64 sum between
    them round to the same value. "mean" over other n divides S, the exact sum: S's 53 bits
    are not enough (a quotient rounded twice). With R = S - rodd(S) (a second exact sum,
    rounded to odd), rodd(S) + rodd(R) lies on the same side as S of every m * n, m a
    midpoint of the format (m * n has at most 78 bits, and within 2 ulps of rodd(S) its
    distance from rodd(S) has at most 28: rounding R to odd keeps its side), so their
    Fraction quotient by n rounds like S / n; ``float64_round_to_odd`` rounds it to odd.
    """
    p = xp.reshape(backend.astype(xp.where(finite, pred, 0.0), xp.float64), (-1,))
    t = xp.reshape(backend.astype(xp.where(finite, target, 0.0), xp.float64), (-1,))
    terms = xp.stack([p * p, -2.0 * p * t, t * t], axis=-1)      # (n, 3), every one exact
    if reduction == "none":
        return xp.reshape(round_to_odd_sum(terms), pred.shape)
    n = max(backend.size(p), 1)
    if reduction == "sum" or n & (n - 1) == 0:
        scale = 1.0 / n if reduction == "mean" else 1.0      # a power of two: exact
        approx = xp.reshape(xp.sum(terms) * scale, (1,))
        width = xp.reshape(xp.sum(xp.abs(terms)) * scale * width_factor(backend.size(terms)),
                           (1,))
        if certify(approx, width, round_end=lambda x: round_to(x, fmt))[2][0]:
            return approx[0]
        return xp.asarray(round_to_odd_sum(xp.reshape(terms, (1, -1)))[0] * scale)
    terms = xp.reshape(terms, (1, -1))
    total = round_to_odd_sum(terms)[0]
    rest = round_to_odd_sum(xp.concatenate([terms, xp.reshape(-total, (1, 1))], axis=1))[0]
    quotient = (Fraction(float(total)) + Fraction(float(rest))) / n
    return xp.asarray(float64_round_to_odd(quotient), xp.float64)


def cross_entropy(logits, labels, reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy of (N, C) ``logits`` against N integer class ``labels``."""
    _check_reduction(reduction, "cross_entropy")
    fmt, (logits,) = operands("loss", logits)
    if logits.ndim != 2:
        raise ValueError(f"cross_entropy: logits must be (N, C), got shape {logits.shape}")
    n, classes = logits.shape
    labels = _labels(labels, n, classes)
    rows = xp.arange(n)
    with xp.errstate(invalid="ignore", under="ignore", over="ignore"):
        if fmt is FP64:
            logp = log_softmax_along(backend.astype(logits.data, xp.float64), 1)
            value = _reduce(-logp[rows, labels], reduction)
        else:   # logp: the float64 log-softmax, log_softmax_along's bits
            value, logp = cr_cross_entropy(logits.data, labels, reduction, fmt,
                                           with_log_softmax=True)
        out = round_array(value, fmt)

    def backward(g, g_fmt):
        g64 = backend.astype(g, xp.float64)
        with xp.errstate(invalid="ignore", under="ignore", over="ignore"):
            d = elementary.exp(logp)
            d[rows, labels] -= 1.0
            if reduction == "none":
                d *= g64[:, None]
            else:
                d *= xp.divide(g64, n) if reduction == "mean" else g64
        return (round_array(d, logits.grad_fmt),)

    return record(out, fmt, (logits,), backward, "cross_entropy")


def mse_loss(pred, target, reduction: str = "mean") -> Tensor:
    """Mean (or summed, or per-element) squared difference of same-shape tensors."""
    _check_reduction(reduction, "mse_loss")
    fmt, (pred, target) = operands("loss", pred, target)
    if pred.shape != target.shape:
        raise ValueError(f"mse_loss: prediction shape {pred.shape} != target shape "
                         f"{target.shape} (broadcasting is refused here on purpose)")
    diff = backend.astype(pred.data, xp.float64) - backend.astype(target.data, xp.float64)
    with xp.errstate(over="ignore", under="ignore", invalid="ignore"):
        value = _reduce(diff * diff, reduction)     # IEEE float64: FP64, inf and NaN
        if fmt is not FP64 and backend.size(diff):
            finite = xp.isfinite(diff)                # float32 values: both are finite
            exact = _squared_error(pred.data, target.data, finite, reduction, fmt)
            if reduction == "none":
                value = xp.where(finite, exact, value)
            elif xp.all(finite):
                value = exact
        out = round_array(value, fmt)
    n = max(backend.size(diff), 1)

    def backward(g, g_fmt):
        g64 = backend.astype(g, xp.float64)
        with xp.errstate(over="ignore", under="ignore"):
            d = 2.0 * diff * (xp.divide(g64, n) if reduction == "mean" else g64)
        dp = round_array(d, pred.grad_fmt) if pred.requires_grad else None
        dt = round_array(-d, target.grad_fmt) if target.requires_grad else None
        return dp, dt

    return record(out, fmt, (pred, target), backward, "mse_loss")
