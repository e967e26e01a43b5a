"""2-D convolution (NCHW, PyTorch's ``conv2d``): im2col and the exact matmul machinery.

``conv2d`` is in the policy's ``matmul`` category (autocast's float16 list has ``conv2d``):
input, weight and bias are cast to the category format, and every output element is ONE dot
product over (input channel of its group, kernel row, kernel column), formed by the
accumulation model (``fpsim.exact.accumulation``; default: the policy's) into an fp32
accumulator and rounded once to the output format. The bias joins the fp32 accumulator
before that rounding, as in ``linear`` (a cuDNN/cuBLAS epilogue)::

    y[n, o, p, q] = round_out( round_fp32( round_fp32(sum_{c,i,j} x_pad[n, c, s p + d i,
                                          s q + d j] * w[o, c, i, j]) + b[o] ) )

The columns are ordered (c, i, j), the order ``sequential`` and ``blocked`` add them in.

Backward (gradients of fp16 operands are fp16, as under autocast), each element one dot
product by the accumulation model, rounded once to the operand's gradient format:

- dx: the transposed convolution, written as a stride-1 convolution of the gradient placed
  every ``stride`` positions in a zero frame, with the kernel flipped and its in/out axes
  swapped (what cuDNN's dgrad computes). Each dx element is the sum of ALL its products
  (over output channel and kernel position: the col2im scatter-add of the column gradient
  ``g @ W``, but never rounding the per-column sums ``g @ W`` on the way), rounded once.
  The terms are taken in (o, flipped i, flipped j) order. With finite weights the frame's
  zero terms change no exact sum and no sequential accumulator (acc + 0 = acc: the
  accumulator starts at +0 and is never -0); the blocked model cuts them into its blocks of
  k like the other terms (an infinite weight times a frame zero is NaN, as in the forward
  pass's zero padding).
- dW: for each kernel position (i, j), ``dW[:, :, i, j] = g (O, N P Q) @ patch_ij
  (N P Q, C)``: one dot product over (n, p, q) per element, in that order.
- db: the sum of g over (n, p, q) (``acc_sum``).

In the float64 reference mode ("64-true") the products are plain float64.

Memory. im2col's columns for the whole input hold N P Q C kh kw elements, about kh kw times
the input at stride 1 (9x for a 3x3 kernel). They are never built whole: each pass unfolds
bands of output rows (of part of the batch where one row of every sample is too many)
holding at most as many elements as the input x, unless one output row of one sample needs
more (Q C kh kw > N C H W). dx unfolds, band by band with the same budget, a zero frame of
N O (H + d(kh-1)) (W + d(kw-1)) elements holding the gradient (zero-stuffed at stride > 1);
dW unfolds one kernel position at a time (N P Q C elements: the input's size at stride 1
with "same" padding). The padded input is kept for dW. On top of the columns, the exact
model's matmul (``fpsim.exact.fast_matmul``) widens its operands to float64 (twice their
float32 bytes) and holds float64 products of a band's outputs. Measured with tracemalloc
(N = 16, C = O = 16, 32 x 32, 3 x 3, padding 1, fp32): the forward peaks at 4.7 times the
input's bytes, its own output (1x) included; the backward's dx at 2.8x plus its frame
(1.1x), dW at 8.9x (its float64 copies of the gradient and of one kernel position's
columns).

>>> from fpsim.autograd import Tensor, use_policy
>>> x = Tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
>>> w = Tensor([[[[1.0, 1.0], [1.0, 1.0]]]])
>>> conv2d(x, w, padding=1).data[0, 0]
array([[ 1.,  3.,  2.],
       [ 4., 10.,  6.],
       [ 3.,  7.,  4.]], dtype=float32)
"""
from __future__ import annotations

from .. import backend
from ..backend import xp
from ..exact import underflow
from ..formats import FP32
from ..options import check_count
from .accumulate import acc_matmul, acc_sum, accumulation_model
from .numerics import FP64, container_of, round_array
from .ops_shape import operands
from .tensor import Tensor, record, register

__all__ = ["conv2d", "pair", "conv_output_size", "pad_frame", "window_values"]


def pair(value, name: str, minimum: int) -> tuple[int, int]:
    """An int or a pair of ints (rows, columns), each at least ``minimum``."""
    items = (value, value) if not isinstance(value, (tuple, list)) else tuple(value)
    if len(items) != 2:
        raise ValueError(f"{name} takes an int or a pair of ints, got {value!r}")
    for item in items:
        check_count(name, item, minimum)
    return int(items[0]), int(items[1])


def conv_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """Output positions along one axis, PyTorch's formula (floor)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def pad_frame(data, padding, fill: float = 0.0):
    """``data`` (N, C, H, W) inside a frame of ``padding`` (rows, columns) filled with
    ``fill`` (zeros for convolution and average pooling, -inf for max pooling)."""
    ph, pw = padding
    if ph == 0 and pw == 0:
        return data
    n, c, h, w = data.shape
    out = xp.full((n, c, h + 2 * ph, w + 2 * pw), fill, data.dtype)
    out[:, :, ph:ph + h, pw:pw + w] = data
    return out


def window_values(padded, i, j, rows, out_w, stride, dilation):
    """The (N, C, len(rows), out_w) values kernel position (i, j) meets at output rows
    ``rows`` (a range) and every output column."""
    (sh, sw), (dh, dw) = stride, dilation
    top, left = rows.start * sh + i * dh, j * dw
    return padded[:, :, top:top + sh * (len(rows) - 1) + 1:sh,
                  left:left + sw * (out_w - 1) + 1:sw]


def _bands(n, p, per_row, budget):
    """(batch slice, output rows) pairs covering n samples x p output rows, each unfolding
    at most ``budget`` elements (``per_row`` per sample and output row), or, where one row of
    one sample needs more, one row of one sample."""
    rows = budget // max(n * per_row, 1)
    if rows >= 1:
        return [(slice(0, n), range(s, min(p, s + rows))) for s in range(0, p, rows)]
    batch = max(1, budget // max(per_row, 1))
    return [(slice(b, min(n, b + batch)), range(r, r + 1))
            for b in range(0, n, batch) for r in range(p)]


def _convolve(padded, weight, stride, dilation, groups, out_hw, fmt, model, budget):
    """(N, C, Hp, Wp) with (O, C/groups, kh, kw) -> (N, O, P, Q), each element the model's
    dot product over (c, i, j) rounded to ``fmt``; unfolded in bands of at most ``budget``
    column elements (module doc)."""
    n, c, _, _ = padded.shape
    o, cg, kh, kw = weight.shape
    (p, q), og, k = out_hw, o // groups, cg * kh * kw
    weights = xp.reshape(weight, (groups, og, k))
    out = xp.empty((n, o, p, q), container_of(fmt))
    with underflow.assembled(out):      # the bands' roundings: one gradient (when counted)
        for batch, rows in _bands(n, p, q * c * kh * kw, budget):
            part = padded[batch]
            m = part.shape[0]
            columns = xp.empty((m, len(rows), q, c, kh, kw), padded.dtype)
            for i in range(kh):
                for j in range(kw):
                    window = window_values(part, i, j, rows, q, stride, dilation)
                    columns[:, :, :, :, i, j] = xp.transpose(window, (0, 2, 3, 1))
            columns = xp.reshape(columns, (m * len(rows) * q, groups, k))
            for g in range(groups):
                product = xp.reshape(acc_matmul(columns[:, g, :], weights[g].T, fmt, model),
                                     (m, len(rows), q, og))
                out[batch, g * og:(g + 1) * og, rows.start:rows.stop, :] = xp.transpose(
                    product, (0, 3, 1, 2))
    return out


def _gradient_frame(g, in_hw, kernel, stride, padding, dilation):
    """g (N, O, P, Q) placed where the transposed convolution reads it: a zero frame of
    (H + d(kh-1), W + d(kw-1)) with g[.., p, .] at row s p + d(kh-1) - pad (rows that fall
    outside map to padding, whose gradient is dropped)."""
    n, o, p, q = g.shape
    frame = xp.zeros((n, o) + tuple(size + d * (k - 1) for size, k, d
                                    in zip(in_hw, kernel, dilation)), g.dtype)
    spans = []
    for size, count, k, s, pad, d in zip(in_hw, (p, q), kernel, stride, padding, dilation):
        offset = d * (k - 1) - pad
        first = max(0, -(offset // s))                   # ceil(-offset / s)
        last = min(count, (size + pad - 1) // s + 1)     # rows that land on the input
        spans.append((offset, first, last, s))
    if any(last <= first for _, first, last, _ in spans):
        return frame
    (oh, fh, lh, sh), (ow, fw, lw, sw) = spans
    frame[:, :, oh + sh * fh:oh + sh * (lh - 1) + 1:sh,
          ow + sw * fw:ow + sw * (lw - 1) + 1:sw] = g[:, :, fh:lh, fw:lw]
    return frame


def _transposed_kernel(weight, groups):
    """(O, C/groups, kh, kw) -> (C, O/groups, kh, kw), flipped in kh and kw: the kernel of
    the transposed convolution."""
    o, cg, kh, kw = weight.shape
    swapped = xp.transpose(xp.reshape(weight, (groups, o // groups, cg, kh, kw)),
                           (0, 2, 1, 3, 4))
    swapped = xp.reshape(swapped, (groups * cg, o // groups, kh, kw))
    swapped = xp.take(swapped, xp.arange(kh - 1, -1, -1), axis=2)
    return xp.take(swapped, xp.arange(kw - 1, -1, -1), axis=3)


def _check_shapes(x, weight, bias, groups, kernel_hw):
    if x.ndim != 4 or weight.ndim != 4:
        raise ValueError(f"conv2d takes input (N, C, H, W) and weight (O, C/groups, kh, kw), "
                         f"got shapes {x.shape} and {weight.shape}")
    c, o = x.shape[1], weight.shape[0]
    if c % groups or o % groups:
        raise ValueError(f"conv2d: groups={groups} must divide the input channels ({c}) and "
                         f"the output channels ({o})")
    if weight.shape[1] * groups != c:
        raise ValueError(f"conv2d: weight shape {weight.shape} expects {weight.shape[1]} "
                         f"channels per group, the input {x.shape} has {c // groups} "
                         f"(groups={groups})")
    if bias is not None and bias.shape != (o,):
        raise ValueError(f"conv2d: bias shape {bias.shape} != ({o},)")
    if min(kernel_hw) < 1:
        raise ValueError(f"conv2d: input {x.shape} with padding is smaller than the "
                         f"(dilated) kernel {weight.shape[2:]}: no output position")


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1, *,
           accumulation=None) -> Tensor:
    """PyTorch's ``conv2d``: x (N, C, H, W), weight (O, C/groups, kh, kw), bias (O,);
    ``stride``, ``padding`` (zeros), ``dilation``: an int or (rows, columns). Module doc:
    where it rounds, its backward, its memory."""
    stride, dilation = pair(stride, "stride", 1), pair(dilation, "dilation", 1)
    padding = pair(padding, "padding", 0)
    check_count("groups", groups, 1)
    parts = (x, weight) if bias is None else (x, weight, bias)
    fmt, tensors = operands("matmul", *parts)
    x, weight = tensors[:2]
    bias = tensors[2] if bias is not None else None
    kernel = tuple(weight.shape[2:]) if weight.ndim == 4 else (1, 1)
    out_hw = tuple(conv_output_size(size, k, s, pad, d) for size, k, s, pad, d
                   in zip(x.shape[2:], kernel, stride, padding, dilation))
    _check_shapes(x, weight, bias, groups, out_hw)
    model = accumulation_model(accumulation)
    padded = pad_frame(x.data, padding)
    budget = backend.size(x.data)       # column elements per band: at most the input's
    if bias is None:
        out = _convolve(padded, weight.data, stride, dilation, groups, out_hw, fmt, model,
                        budget)
    else:
        acc_fmt = FP64 if fmt is FP64 else FP32
        acc = _convolve(padded, weight.data, stride, dilation, groups, out_hw, acc_fmt, model,
                        budget)
        with xp.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, as in IEEE
            acc += xp.reshape(bias.data, (1, -1, 1, 1))  # the epilogue's fp32 addition
        out = round_array(acc, fmt)

    def backward(g, g_fmt):
        dx = dw = db = None
        if x.requires_grad:
            frame = _gradient_frame(g, x.shape[2:], kernel, stride, padding, dilation)
            dx = _convolve(frame, _transposed_kernel(weight.data, groups), (1, 1), dilation,
                           groups, x.shape[2:], x.grad_fmt, model, budget)
        if weight.requires_grad:
            dw = _weight_gradient(g, padded, weight, stride, dilation, groups, model)
        if bias is not None and bias.requires_grad:
            db = acc_sum(g, (0, 2, 3), False, bias.grad_fmt, model)
        return (dx, dw) if bias is None else (dx, dw, db)

    return record(out, fmt, tensors, backward, "conv2d")


def _weight_gradient(g, padded, weight, stride, dilation, groups, model):
    """dW[:, :, i, j] = g @ (the input kernel position (i, j) meets), per group: one dot
    product over (n, p, q) per element, one kernel position unfolded at a time."""
    n, o, p, q = g.shape
    _, cg, kh, kw = weight.shape
    og = o // groups
    grads = [xp.reshape(xp.transpose(g[:, k * og:(k + 1) * og], (1, 0, 2, 3)), (og, n * p * q))
             for k in range(groups)]
    dw = xp.empty(weight.shape, container_of(weight.grad_fmt))
    with underflow.assembled(dw):      # one rounding per kernel position: one gradient
        for i in range(kh):
            for j in range(kw):
                window = window_values(padded, i, j, range(p), q, stride, dilation)
                for k in range(groups):
                    columns = xp.reshape(xp.transpose(window[:, k * cg:(k + 1) * cg],
                                                      (0, 2, 3, 1)), (n * p * q, cg))
                    dw[k * og:(k + 1) * og, :, i, j] = acc_matmul(grads[k], columns,
                                                                  weight.grad_fmt, model)
    return dw


register(conv2d)
