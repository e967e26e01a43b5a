"""Layer, batch and group normalisation (PyTorch's ``layer_norm``, ``batch_norm``,
``group_norm``), each beside its backward.

``layer_norm`` is in the policy's ``wide`` category: autocast runs ``layer_norm`` in float32
(its "autocast to float32" list), so under "16-mixed" an fp16 input is widened (exactly) and
the output is fp32; under "16-true" (``wide`` promotes) fp16 in gives fp16 out, PyTorch's
half kernel computing in float and rounding once.

Where it rounds. Over each row of the last ``len(normalized_shape)`` axes (n values), from
the exact input, weight and bias values, in float64::

    m  = RO(sum x) / n                       RO: the exact sum rounded to odd at 53 bits
    d  = x - m                               (``fpsim.exact.round_to_odd_sum``): the same
    v  = RO(sum d*d) / n                     bits on every backend, in any order
    r  = 1 / sqrt(v + eps)                   (biased variance, as PyTorch; eps as given)
    y  = (d * r) * w + b                     -> ONE rounding to the output format

Each step is one IEEE float64 operation (sqrt included), so the bits depend on no library
and no summation order. The float64 value is within a few float64 ulps of the exact layer
norm relative to |x_hat w| + |b|, that error growing by the factor 1 + |m| r for rows
whose mean dwarfs their spread (d inherits m's error). Rounded once, it is the correctly
rounded result except where the exact value lies within that error of a rounding boundary
of the format: not certified (unlike ``exp`` or ``softmax``); the tests compare with MPFR.

Backward, in float64 from the same x_hat = d r and r, with gw = g * w (g without weight),
each gradient rounded once to its tensor's gradient format::

    dx = r * (gw - RO(sum gw) / n - x_hat * RO(sum gw * x_hat) / n)      (per row)
    dw = RO(sum over rows of g * x_hat)          db = RO(sum over rows of g)

A row (or column) holding inf or NaN is summed in float64 in index order instead (its sum is
inf or NaN whatever the order).

>>> from fpsim.autograd import Tensor, use_policy
>>> with use_policy("16-mixed"):
...     y = layer_norm(Tensor([[1.0, 2.0, 3.0, 6.0]]).cast("fp16"), 4)
>>> y.fmt.name, y.data
('fp32', array([[-1.0690434, -0.5345217,  0.       ,  1.6035652]], dtype=float32))
"""
from __future__ import annotations

import math

from .. import backend
from ..backend import xp

from ..exact import round_to_odd_sum
from ..options import check_count, check_real
from .numerics import round_array
from .ops_shape import operands
from .tensor import Tensor, record, register

__all__ = ["layer_norm", "batch_norm", "group_norm"]


def _row_sums(rows):
    """Float64 sums of the rows of a 2-D float64 array: exact, rounded to odd at 53 bits,
    for finite rows; in index order where a row holds inf or NaN."""
    finite = xp.all(xp.isfinite(rows), axis=1)
    if bool(xp.all(finite)):
        return round_to_odd_sum(rows)
    out = xp.empty(rows.shape[0], xp.float64)
    if bool(xp.any(finite)):
        out[finite] = round_to_odd_sum(rows[finite])
    with xp.errstate(invalid="ignore", over="ignore"):
        out[~finite] = xp.cumsum(rows[~finite], axis=1)[:, -1]
    return out


def _normalized_shape(normalized_shape):
    shape = ((normalized_shape,) if not isinstance(normalized_shape, (tuple, list))
             else tuple(normalized_shape))
    if not shape:
        raise ValueError("layer_norm: normalized_shape must name at least one axis")
    return tuple(check_count("normalized_shape", n, 1) for n in shape)


def _check(x, shape, weight, bias):
    if x.shape[x.ndim - len(shape):] != shape or x.ndim < len(shape):
        raise ValueError(f"layer_norm: input shape {x.shape} does not end in normalized_shape "
                         f"{shape}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.shape != shape:
            raise ValueError(f"layer_norm: {name} shape {t.shape} != normalized_shape {shape}")


def _f64_rows(data, n):
    return xp.reshape(backend.astype(data, xp.float64, copy=False), (-1, n))


def _wide_operands(op: str, eps, x, weight, bias) -> tuple:
    """``(eps, fmt, tensors, (x, weight, bias))``: ``eps`` checked (>= 0); the given tensors
    cast as the ``wide`` category casts them (``tensors``, for the graph), and each of x,
    weight, bias among them (None where not given)."""
    eps = check_real("eps", eps)
    if eps < 0:
        raise ValueError(f"{op}: eps must be >= 0, got {eps}")
    fmt, tensors = operands("wide", *(t for t in (x, weight, bias) if t is not None))
    return eps, fmt, tensors, (tensors[0], tensors[1] if weight is not None else None,
                               tensors[-1] if bias is not None else None)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the trailing
    ``normalized_shape`` axes (module doc: float64 throughout, one rounding)."""
    shape = _normalized_shape(normalized_shape)
    eps, fmt, tensors, (x, weight, bias) = _wide_operands("layer_norm", eps, x, weight, bias)
    _check(x, shape, weight, bias)
    n = math.prod(shape)
    count = backend.scalar(n, xp.float64)
    rows = _f64_rows(x.data, n)
    with xp.errstate(invalid="ignore", over="ignore", divide="ignore"):
        centred = rows - xp.expand_dims(_row_sums(rows) / count, 1)
        rstd = xp.expand_dims(xp.divide(1.0, xp.sqrt(_row_sums(centred * centred) / count
                                                    + eps)), 1)
        x_hat = centred * rstd
        y = x_hat
        if weight is not None:
            y = y * xp.reshape(backend.astype(weight.data, xp.float64), (1, n))
        if bias is not None:
            y = y + xp.reshape(backend.astype(bias.data, xp.float64), (1, n))
    out = round_array(xp.reshape(y, x.shape), fmt)

    def backward(g, g_fmt):
        g64 = _f64_rows(g, n)
        grads = []
        with xp.errstate(invalid="ignore", over="ignore"):
            if x.requires_grad:
                gw = g64 if weight is None else g64 * xp.reshape(
                    backend.astype(weight.data, xp.float64), (1, n))
                dx = rstd * (gw - xp.expand_dims(_row_sums(gw) / count, 1)
                             - x_hat * xp.expand_dims(_row_sums(gw * x_hat) / count, 1))
                grads.append(round_array(xp.reshape(dx, x.shape), x.grad_fmt))
            else:
                grads.append(None)
            if weight is not None:
                grads.append(_column_sum(g64 * x_hat, weight) if weight.requires_grad else None)
            if bias is not None:
                grads.append(_column_sum(g64, bias) if bias.requires_grad else None)
        return tuple(grads)

    return record(out, fmt, tensors, backward, "layer_norm")


def _column_sum(values, t):
    """Sum over the rows of (R, n) float64 ``values``, shaped like ``t``, rounded once to
    ``t``'s gradient format."""
    return round_array(xp.reshape(_row_sums(values.T), t.shape), t.grad_fmt)


def _channel_rows(data):
    """(C, N * spatial) float64 rows of an (N, C, ...) array: one row per channel."""
    moved = xp.moveaxis(backend.astype(data, xp.float64, copy=False), 1, 0)
    return xp.reshape(moved, (moved.shape[0], -1))


def _from_channel_rows(rows, shape):
    return xp.moveaxis(xp.reshape(rows, (shape[1], shape[0]) + tuple(shape[2:])), 0, 1)


def _column(t, c):
    return xp.reshape(backend.astype(t.data, xp.float64), (c, 1))


def batch_norm(x, running_mean=None, running_var=None, weight=None, bias=None,
               training: bool = False, momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """PyTorch's ``F.batch_norm`` over axis 1 of an (N, C, ...) input.

    Training (or no running statistics): per channel, over N and the spatial axes (M
    values), the statistics of ``layer_norm`` (mean and biased variance from exact sums,
    float64), y = (x - m) r w + b rounded once; ``running_mean`` and ``running_var`` (tensors,
    updated in place, outside the graph) become (1 - momentum) old + momentum m and
    (1 - momentum) old + momentum v M / (M - 1) (the unbiased variance, as PyTorch), each
    evaluated in float64 and rounded once into the buffer's format. Eval: y = (x - mean)
    / sqrt(var + eps) w + b with the running statistics, in float64, rounded once.

    Formats: autocast's lists have no batch_norm, so under "16-mixed" it runs on the fp16
    activation with the fp32 weight and statistics and writes fp16, as cuDNN's mixed batch
    norm does (computing in fp32): the output takes x's format under the ``elementwise``
    category (promote: x's own; a jmp compute format: x cast to it); weight, bias and
    statistics enter exactly, whatever their formats. Backward, in float64, each gradient
    rounded once: training as ``layer_norm``'s per row (dx = r (gw - mean gw - x_hat
    mean(gw x_hat)), gw = g w), eval dx = g w r; dw = RO(sum g x_hat), db = RO(sum g)."""
    eps = check_real("eps", eps)
    momentum = check_real("momentum", momentum)
    fmt, (x,) = operands("elementwise", x)
    if x.ndim < 2:
        raise ValueError(f"batch_norm: input must be (N, C, ...), got shape {x.shape}")
    c = x.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var),
                    ("weight", weight), ("bias", bias)):
        if t is not None and t.shape != (c,):
            raise ValueError(f"batch_norm: {name} shape {t.shape} != ({c},), the channels")
    use_batch = training or running_mean is None or running_var is None
    rows = _channel_rows(x.data)
    m_count = rows.shape[1]
    if use_batch and training and m_count < 2:
        raise ValueError(f"batch_norm: expected more than 1 value per channel when training, "
                         f"got input shape {x.shape}")
    with xp.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if use_batch:
            count = backend.scalar(m_count, xp.float64)
            mean = xp.expand_dims(_row_sums(rows) / count, 1)
            centred = rows - mean
            var = xp.expand_dims(_row_sums(centred * centred) / count, 1)
        else:
            mean, var = _column(running_mean, c), _column(running_var, c)
            centred = rows - mean
        rstd = xp.divide(1.0, xp.sqrt(var + eps))
        x_hat = centred * rstd
        y = x_hat if weight is None else x_hat * _column(weight, c)
        y = y if bias is None else y + _column(bias, c)
    out = round_array(_from_channel_rows(y, x.shape), fmt)
    if training and running_mean is not None and running_var is not None:
        _update(running_mean, mean, momentum)
        _update(running_var, var * xp.divide(count, backend.scalar(m_count - 1, xp.float64)),
                momentum)
    params = [t for t in (weight, bias) if t is not None]

    def backward(g, g_fmt):
        g64 = _channel_rows(g)
        gw = g64 if weight is None else g64 * _column(weight, c)
        grads = []
        with xp.errstate(invalid="ignore", over="ignore"):
            if not x.requires_grad:
                grads.append(None)
            elif use_batch:
                dx = rstd * (gw - xp.expand_dims(_row_sums(gw) / count, 1)
                             - x_hat * xp.expand_dims(_row_sums(gw * x_hat) / count, 1))
                grads.append(round_array(_from_channel_rows(dx, x.shape), x.grad_fmt))
            else:
                grads.append(round_array(_from_channel_rows(gw * rstd, x.shape), x.grad_fmt))
            for t, values in ((weight, g64 * x_hat), (bias, g64)):
                if t is not None:
                    grads.append(round_array(_row_sums(values), t.grad_fmt)
                                 if t.requires_grad else None)
        return tuple(grads)

    return record(out, fmt, (x, *params), backward, "batch_norm")


def _update(stat, batch_value, momentum):
    """The running statistic ``stat`` (a Tensor) <- (1 - momentum) stat + momentum value,
    in float64, rounded once into its format (in place: it is state, not a graph value)."""
    old = backend.astype(stat.data, xp.float64)
    new = (1.0 - momentum) * old + momentum * xp.reshape(batch_value, (-1,))
    stat.data = backend.astype(round_array(new, stat.fmt), stat.data.dtype)


def _per_channel(values, c):
    """(N, C, S) float64 ``values`` summed over N and S per channel, exactly (rounded to
    odd at 53 bits) where finite: (C,)."""
    return _row_sums(xp.reshape(xp.moveaxis(values, 1, 0), (c, -1)))


def group_norm(x, num_groups: int, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """PyTorch's ``F.group_norm`` of an (N, C, ...) input: the C channels split into
    ``num_groups`` groups of C / num_groups consecutive channels; each (sample, group)
    normalised over its channels and spatial positions with ``layer_norm``'s statistics
    (mean and biased variance from exact sums, in float64), then the per-channel
    ``weight`` and ``bias``: y = x_hat w_c + b_c, evaluated in float64 and rounded once.

    Policy ``wide``: ``group_norm`` is on autocast's float32 list, so under "16-mixed" an
    fp16 input gives an fp32 output (as ``layer_norm``); under "16-true" fp16 in, fp16 out.
    PyTorch's fp32 kernel computes its moments in float32 and y as x (r w) + (b - m r w):
    within a few ulps of |x| r |w| + |b| of ours (the tests derive the bound). Backward,
    in float64, each gradient rounded once: per (sample, group) row ``layer_norm``'s
    dx = r (gw - mean gw - x_hat mean(gw x_hat)), gw = g w_c; dw_c = RO(sum g x_hat),
    db_c = RO(sum g) over the samples and positions of channel c."""
    groups = check_count("num_groups", num_groups, 1)
    eps, fmt, tensors, (x, weight, bias) = _wide_operands("group_norm", eps, x, weight, bias)
    if x.ndim < 2 or x.shape[1] % groups:
        raise ValueError(f"group_norm: input must be (N, C, ...) with C divisible by "
                         f"num_groups={groups}, got shape {x.shape}")
    n, c = x.shape[:2]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.shape != (c,):
            raise ValueError(f"group_norm: {name} shape {t.shape} != ({c},), the channels")
    per_row = math.prod(x.shape[1:]) // groups
    count = backend.scalar(per_row, xp.float64)
    channel_shape = (n, c, per_row * groups // c)
    rows = _f64_rows(x.data, per_row)
    with xp.errstate(invalid="ignore", over="ignore", divide="ignore"):
        centred = rows - xp.expand_dims(_row_sums(rows) / count, 1)
        rstd = xp.expand_dims(xp.divide(1.0, xp.sqrt(_row_sums(centred * centred) / count
                                                    + eps)), 1)
        x_hat = centred * rstd
        y = xp.reshape(x_hat, channel_shape)
        if weight is not None:
            y = y * _channel_column(weight, c)
        if bias is not None:
            y = y + _channel_column(bias, c)
    out = round_array(xp.reshape(y, x.shape), fmt)

    def backward(g, g_fmt):
        g64 = xp.reshape(backend.astype(g, xp.float64), channel_shape)
        grads = []
        with xp.errstate(invalid="ignore", over="ignore"):
            if x.requires_grad:
                gw = g64 if weight is None else g64 * _channel_column(weight, c)
                gw = xp.reshape(gw, rows.shape)
                dx = rstd * (gw - xp.expand_dims(_row_sums(gw) / count, 1)
                             - x_hat * xp.expand_dims(_row_sums(gw * x_hat) / count, 1))
                grads.append(round_array(xp.reshape(dx, x.shape), x.grad_fmt))
            else:
                grads.append(None)
            for t, values in ((weight, g64 * xp.reshape(x_hat, channel_shape)), (bias, g64)):
                if t is not None:
                    grads.append(round_array(_per_channel(values, c), t.grad_fmt)
                                 if t.requires_grad else None)
        return tuple(grads)

    return record(out, fmt, tensors, backward, "group_norm")


def _channel_column(t, c):
    """A (C,) tensor as float64 (1, C, 1), to scale (N, C, S) values per channel."""
    return xp.reshape(backend.astype(t.data, xp.float64), (1, c, 1))


register(layer_norm, batch_norm, group_norm)
