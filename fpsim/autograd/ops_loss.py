"""Losses: cross-entropy from logits with integer labels, and mean squared error.

Both are in the policy's ``loss`` category (autocast's float32 list has ``cross_entropy`` and
``mse_loss``): inputs are cast to the loss format, and each loss is one fused op rounded once
from the exact input values. cross_entropy is correctly rounded: the exact real value of the
whole reduction (``fpsim.exact.cr_cross_entropy``, libm-free, certified, Decimal fallback);
mse_loss is computed in float64 (``reduction="mean"`` divides in float64) before its one
rounding. Backward, in float64 (exp libm-free), rounded once to each input's gradient
format (not certified)::

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

from ..backend import xp

from ..exact import cr_cross_entropy
from ..exact import elementary as f64
from .numerics import FP64, round_array
from .ops_reduce import log_softmax_along
from .ops_shape import operands
from .tensor import Tensor, record

__all__ = ["cross_entropy", "mse_loss"]

_REDUCTIONS = ("mean", "sum", "none")


def _reduce(values, reduction):
    if reduction == "mean":
        return xp.asarray(values.mean())
    if reduction == "sum":
        return xp.asarray(values.sum())
    return values


def _check_reduction(reduction, op):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def _labels(labels, n, classes):
    if isinstance(labels, Tensor):
        labels = labels.data
    labels = xp.asarray(labels)
    if labels.dtype.kind not in "iu":
        if labels.dtype.kind == "f" and labels.size and xp.all(labels == xp.round(labels)):
            labels = labels.astype(xp.int64)
        else:
            raise TypeError(f"cross_entropy: labels must be integers, got dtype {labels.dtype}")
    if labels.shape != (n,):
        raise ValueError(f"cross_entropy: labels shape {labels.shape} != ({n},) for logits "
                         f"with batch size {n}")
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        raise ValueError(f"cross_entropy: labels must lie in [0, {classes}), got values from "
                         f"{labels.min()} to {labels.max()}")
    return labels.astype(xp.intp)


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
            logp = log_softmax_along(logits.data.astype(xp.float64), 1)
            value = _reduce(-logp[rows, labels], reduction)
        else:   # logp: the float64 log-softmax, log_softmax_along's bits
            value, logp = cr_cross_entropy(logits.data, labels, reduction, fmt,
                                           with_log_softmax=True)
        out = round_array(value, fmt)

    def backward(g, g_fmt):
        g64 = g.astype(xp.float64)
        with xp.errstate(invalid="ignore", under="ignore", over="ignore"):
            d = f64.exp(logp)
            d[rows, labels] -= 1.0
            if reduction == "none":
                d *= g64[:, None]
            else:
                d *= g64 / n if reduction == "mean" else g64
        return (round_array(d, logits.grad_fmt),)

    return record(out, fmt, (logits,), backward, "cross_entropy")


def mse_loss(pred, target, reduction: str = "mean") -> Tensor:
    """Mean (or summed, or per-element) squared difference of same-shape tensors."""
    _check_reduction(reduction, "mse_loss")
    fmt, (pred, target) = operands("loss", pred, target)
    if pred.shape != target.shape:
        raise ValueError(f"mse_loss: prediction shape {pred.shape} != target shape "
                         f"{target.shape} (broadcasting is refused here on purpose)")
    diff = pred.data.astype(xp.float64) - target.data.astype(xp.float64)
    with xp.errstate(over="ignore", under="ignore"):
        out = round_array(_reduce(diff * diff, reduction), fmt)
    n = max(diff.size, 1)

    def backward(g, g_fmt):
        g64 = g.astype(xp.float64)
        with xp.errstate(over="ignore", under="ignore"):
            d = 2.0 * diff * (g64 / n if reduction == "mean" else g64)
        dp = round_array(d, pred.grad_fmt) if pred.requires_grad else None
        dt = round_array(-d, target.grad_fmt) if target.requires_grad else None
        return dp, dt

    return record(out, fmt, (pred, target), backward, "mse_loss")
