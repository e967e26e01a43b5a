"""2-D pooling (NCHW, PyTorch's ``max_pool2d`` and ``avg_pool2d``), each beside its backward.

Both are on neither autocast list (policy ``elementwise``: promote by default, so under
"16-mixed" an fp16 input gives an fp16 output). ``kernel_size``, ``stride`` (default: the
kernel) and ``padding`` are an int or (rows, columns); padding is at most half the kernel,
as PyTorch requires.

- ``max_pool2d`` never rounds: each output is one of its window's values (the padding is
  -inf). The window is read row by row; the output and its gradient go to the first
  maximal element, to the last NaN where the window holds a NaN, and to the window's first
  element inside the input where every value is -inf, as PyTorch's CPU kernel (its search
  starts there and moves on ``val > maxval || isnan(val)``) does. Backward: each input
  element receives the exact sum of the gradients of the windows that chose it (windows
  overlap when the stride is smaller than the kernel; ``fpsim.exact.scatter_sum``:
  order-free, so the same bits on every backend), rounded once to its gradient format.
- ``avg_pool2d`` (PyTorch's defaults: zero padding counted in the divisor, ``kh kw``): the
  window summed by the accumulation model into fp32, one float32 division by ``kh kw``, one
  rounding to the output format, as ``mean`` (PyTorch's half kernels: float opmath sum,
  divide, cast). Backward: each input element's exact sum of the gradients of the windows
  holding it (``scatter_sum``, correct to 53 bits), divided by ``kh kw`` in float64, rounded
  once to the gradient format (correctly rounded when ``kh kw`` is a power of two).
- ``adaptive_avg_pool2d`` (an output size, PyTorch's windows ``[floor(i in / out),
  ceil((i + 1) in / out))``, which overlap when ``in`` is not a multiple of ``out``): an
  output size of (1, 1) is ``mean`` over H and W, the route PyTorch takes there (its bits:
  one division by H W). Otherwise, as PyTorch's CPU kernel: each window summed by the
  accumulation model into fp32, divided by its ``kh`` then by its ``kw`` (two float32
  divisions), rounded once to the output format. Backward: each input element's float64
  sum of the ``g / (kh kw)`` of the windows holding it (at most a few terms), rounded once.

>>> from fpsim.autograd import Tensor
>>> x = Tensor([[[[1.0, 5.0, 2.0, 0.0], [3.0, 4.0, 8.0, 6.0]]]])
>>> max_pool2d(x, 2).data, avg_pool2d(x, 2).data
(array([[[[5., 8.]]]], dtype=float32), array([[[[3.25, 4.  ]]]], dtype=float32))
"""
from __future__ import annotations

import math

from .. import backend
from ..backend import xp

from ..exact import scatter_sum
from ..formats import FP32
from .accumulate import acc_sum, accumulation_model
from .numerics import FP64, round_array
from .ops_conv import conv_output_size, pad_frame, pair, window_values
from .ops_reduce import mean
from .ops_shape import convert, operands
from .tensor import Tensor, as_tensor, record, register

__all__ = ["max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"]


def _geometry(x, kernel_size, stride, padding, op):
    """Checked (kernel, stride, padding, output (P, Q)) for a pooling of ``x``."""
    if x.ndim != 4:
        raise ValueError(f"{op} takes an (N, C, H, W) input, got shape {x.shape}")
    kernel = pair(kernel_size, "kernel_size", 1)
    stride = kernel if stride is None else pair(stride, "stride", 1)
    padding = pair(padding, "padding", 0)
    if any(2 * pad > k for pad, k in zip(padding, kernel)):
        raise ValueError(f"{op}: padding {padding} must be at most half the kernel {kernel}")
    out_hw = tuple(conv_output_size(size, k, s, pad, 1) for size, k, s, pad
                   in zip(x.shape[2:], kernel, stride, padding))
    if min(out_hw) < 1:
        raise ValueError(f"{op}: input {x.shape} with padding {padding} is smaller than the "
                         f"kernel {kernel}")
    return kernel, stride, padding, out_hw


def _windows(padded, kernel, stride, out_hw):
    """(N, C, P, Q, kh kw): each output's window, read row by row."""
    rows = range(out_hw[0])
    return xp.stack([window_values(padded, i, j, rows, out_hw[1], stride, (1, 1))
                     for i in range(kernel[0]) for j in range(kernel[1])], -1)


def _window_positions(padded_shape, kernel, stride, out_hw):
    """(N, C, P, Q, kh kw) int64: where each window element lies in the flattened padded
    input."""
    n, c, hp, wp = padded_shape
    (kh, kw), (sh, sw), (p, q) = kernel, stride, out_hw
    offsets = xp.arange(kh * kw)
    i, j = offsets // kw, offsets % kw
    planes = xp.reshape(xp.arange(n * c), (n, c, 1, 1, 1))
    rows = xp.reshape(xp.arange(p) * sh, (1, 1, p, 1, 1)) + xp.reshape(i, (1, 1, 1, 1, -1))
    cols = xp.reshape(xp.arange(q) * sw, (1, 1, 1, q, 1)) + xp.reshape(j, (1, 1, 1, 1, -1))
    return (planes * hp + rows) * wp + cols


def _chosen_positions(padded_shape, kernel, stride, index):
    """(N, C, P, Q) int64: where the window element ``index`` (N, C, P, Q) of each window
    lies in the flattened padded input (``_window_positions`` at ``index``, without the
    positions of the elements not chosen)."""
    n, c, hp, wp = padded_shape
    (kw, (sh, sw)), (p, q) = (kernel[1], stride), index.shape[2:]
    planes = xp.reshape(xp.arange(n * c), (n, c, 1, 1))
    rows = xp.reshape(xp.arange(p) * sh, (1, 1, p, 1)) + index // kw
    cols = xp.reshape(xp.arange(q) * sw, (1, 1, 1, q)) + index % kw
    return (planes * hp + rows) * wp + cols


def _scatter_back(positions, values, padded_shape, padding, in_hw, distinct=False):
    """Float64 (N, C, H, W): the exact (to odd at 53 bits) sum of the ``values`` sent to
    each input element (``positions`` in the padded frame), padding dropped. ``distinct``:
    no two positions are the same (windows that do not overlap), so each sum is its one
    value, +0 for -0 and nothing received, as ``scatter_sum`` gives it, without its sort."""
    if distinct:
        full = xp.zeros(math.prod(padded_shape), xp.float64)
        full[xp.reshape(positions, (-1,))] = xp.reshape(xp.asarray(values, xp.float64) + 0.0,
                                                        (-1,))
        full = xp.reshape(full, padded_shape)
    else:
        full = xp.reshape(scatter_sum(positions, values, math.prod(padded_shape)),
                          padded_shape)
    (ph, pw), (h, w) = padding, in_hw
    return full[:, :, ph:ph + h, pw:pw + w]


def _first_max_index(windows, first_real):
    """Index of the first maximal element of each window, or of its last NaN; where every
    value is -inf, the window's first element inside the input (``first_real``), as
    PyTorch, whose search starts there and moves only on a larger value."""
    last = windows.shape[-1] - 1
    nan = xp.isnan(windows)
    reversed_nan = xp.take(nan, xp.arange(last, -1, -1), axis=-1)
    last_nan = last - xp.argmax(reversed_nan, axis=-1)
    index = xp.where(xp.any(nan, axis=-1), last_nan, xp.argmax(windows, axis=-1))
    all_minus_inf = xp.all(xp.equal(windows, -float("inf")), axis=-1)
    return xp.where(all_minus_inf, xp.broadcast_to(first_real, index.shape), index)


def _first_real(in_hw, kernel, stride, padding, out_hw):
    """(P, Q): the index, in each window, of its first element inside the input."""
    inside = pad_frame(xp.ones((1, 1) + tuple(in_hw), xp.float32), padding)
    return xp.argmax(_windows(inside, kernel, stride, out_hw)[0, 0], axis=-1)


def _chosen_index(windows, data, kernel, stride, padding, out_hw):
    """``_first_max_index`` of each window. Without padding and NaN (one pass over the
    input tells) it is argmax's first maximal element: a window of -inf values only then
    starts inside the input, at its element 0, where argmax lands too."""
    if padding == (0, 0) and not xp.any(xp.isnan(data)):
        return xp.argmax(windows, axis=-1)
    return _first_max_index(windows, _first_real(data.shape[2:], kernel, stride, padding,
                                                 out_hw))


def max_pool2d(x, kernel_size, stride=None, padding=0) -> Tensor:
    """Largest value of each window (module doc: no rounding; gradient to the first
    maximal element)."""
    fmt, (x,) = operands("elementwise", x)
    kernel, stride, padding, out_hw = _geometry(x, kernel_size, stride, padding, "max_pool2d")
    padded = pad_frame(x.data, padding, -float("inf"))
    windows = _windows(padded, kernel, stride, out_hw)
    index = xp.expand_dims(_chosen_index(windows, x.data, kernel, stride, padding, out_hw), -1)
    out = convert(xp.ascontiguousarray(xp.take_along_axis(windows, index, -1)[..., 0]),
                  x.fmt, fmt)

    def backward(g, g_fmt):
        positions = _chosen_positions(padded.shape, kernel, stride, index[..., 0])
        apart = stride[0] >= kernel[0] and stride[1] >= kernel[1]   # windows never overlap
        total = _scatter_back(positions, g, padded.shape, padding, x.shape[2:], apart)
        return (round_array(xp.ascontiguousarray(total), x.grad_fmt),)

    return record(out, fmt, (x,), backward, "max_pool2d")


def avg_pool2d(x, kernel_size, stride=None, padding=0, *, accumulation=None) -> Tensor:
    """Mean of each window, zero padding included in the count (module doc)."""
    fmt, (x,) = operands("elementwise", x)
    kernel, stride, padding, out_hw = _geometry(x, kernel_size, stride, padding, "avg_pool2d")
    count = kernel[0] * kernel[1]
    padded = pad_frame(x.data, padding)
    windows = _windows(padded, kernel, stride, out_hw)
    acc_fmt = FP64 if fmt is FP64 else FP32
    total = acc_sum(windows, -1, False, acc_fmt, accumulation_model(accumulation))
    with xp.errstate(over="ignore", under="ignore"):
        out = round_array(xp.asarray(total / backend.scalar(count, total.dtype)), fmt)

    def backward(g, g_fmt):
        positions = _window_positions(padded.shape, kernel, stride, out_hw)
        shares = xp.broadcast_to(xp.expand_dims(g, -1), positions.shape)
        apart = stride[0] >= kernel[0] and stride[1] >= kernel[1]   # windows never overlap
        total = _scatter_back(positions, shares, padded.shape, padding, x.shape[2:], apart)
        with xp.errstate(under="ignore"):
            share = total / backend.scalar(count, xp.float64)
        return (round_array(xp.ascontiguousarray(share), x.grad_fmt),)

    return record(out, fmt, (x,), backward, "avg_pool2d")


def adaptive_windows(size: int, out: int) -> list[tuple[int, int]]:
    """PyTorch's adaptive pooling windows along one axis: ``[floor(i size / out),
    ceil((i + 1) size / out))`` for each output position ``i``."""
    return [(i * size // out, -(-(i + 1) * size // out)) for i in range(out)]


def adaptive_avg_pool2d(x, output_size, *, accumulation=None) -> Tensor:
    """Mean of each of PyTorch's adaptive windows (module doc); ``output_size`` an int or
    (rows, columns), each at least 1."""
    out_hw = pair(output_size, "output_size", 1)
    x = as_tensor(x)
    if x.ndim != 4:
        raise ValueError(f"adaptive_avg_pool2d takes an (N, C, H, W) input, got shape "
                         f"{x.shape}")
    if out_hw == (1, 1):
        return mean(x, (2, 3), keepdims=True, accumulation=accumulation)
    fmt, (x,) = operands("elementwise", x)
    rows, cols = (adaptive_windows(n, o) for n, o in zip(x.shape[2:], out_hw))
    acc_fmt = FP64 if fmt is FP64 else FP32
    model = accumulation_model(accumulation)
    lead = tuple(x.shape[:2])
    columns = []
    for r0, r1 in rows:
        for c0, c1 in cols:
            window = xp.reshape(x.data[:, :, r0:r1, c0:c1], lead + (-1,))   # row by row
            total = acc_sum(window, -1, False, acc_fmt, model)
            with xp.errstate(over="ignore", under="ignore"):
                columns.append(total / backend.scalar(r1 - r0, total.dtype)
                               / backend.scalar(c1 - c0, total.dtype))
    out = round_array(xp.reshape(xp.stack(columns, -1), lead + out_hw), fmt)

    def backward(g, g_fmt):
        g64 = backend.astype(g, xp.float64)
        total = xp.zeros(x.shape, xp.float64)
        with xp.errstate(under="ignore"):
            for i, (r0, r1) in enumerate(rows):
                for j, (c0, c1) in enumerate(cols):
                    share = g64[:, :, i, j] / backend.scalar((r1 - r0) * (c1 - c0), xp.float64)
                    total[:, :, r0:r1, c0:c1] += xp.reshape(share, lead + (1, 1))
        return (round_array(total, x.grad_fmt),)

    return record(out, fmt, (x,), backward, "adaptive_avg_pool2d")


register(max_pool2d, avg_pool2d, adaptive_avg_pool2d)
