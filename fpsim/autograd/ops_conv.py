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
  every ``stride`` positions in a zero frame (read in place: ``Unfolding``), with the kernel
  flipped and its in/out axes swapped (what cuDNN's dgrad computes). Each dx element is the sum of
  ALL its products (over output channel and kernel position: the col2im scatter-add of the column
  gradient ``g @ W``, but never rounding the per-column sums ``g @ W`` on the way), rounded once.
  The terms are taken in (o, flipped i, flipped j) order. With finite weights the frame's
  zero terms change no exact sum and no sequential accumulator (acc + 0 = acc: the
  accumulator starts at +0 and is never -0); the blocked model cuts them into its blocks of
  k like the other terms (an infinite weight times a frame zero is NaN, as in the forward
  pass's zero padding).
- dW: ``dW[o, c, i, j] = g[:, o] . patch_cij``, the input values tap (i, j) of channel c
  meets: one dot product over (n, p, q) per element, in that order.
- db: the sum of g over (n, p, q) (``acc_sum``).

In the float64 reference mode ("64-true") the products are plain float64 BLAS products,
whose last bits may depend on the matrices' shapes: there the bands are the ones this module
always made (the input's size over the groups, dW tap by tap), whatever the tuning.

Memory. im2col's columns for the whole input hold N P Q C kh kw elements, about kh kw times
the input at stride 1 (9x for a 3x3 kernel), and the exact model's matmul
(``fpsim.exact.fast_matmul``) widens its operands to float64 (twice their float32 bytes).
They are never built whole, and no padded or zero-stuffed copy is made (``Unfolding``: each
band takes the part of x or g that lands on it and keeps zeros elsewhere). The forward pass
and dx unfold bands of samples x output rows, as few as fit (each is one product), each
group's columns at most ``tuning().conv_band_share`` of the larger of x and the output (g)
in elements, unless one output row of one sample needs more; the bias joins each band in the
certified epilogue. On the exact model's fast path dW splits its reduction over (n, p, q)
instead, in parts of samples (``product_parts.matmul_in_parts``: the bits of one certified
product): each part's gradient rows and columns at most ``conv_weight_part_share`` of the
larger of x and g in float32 elements (their float64 copies twice that), and only the open
elements' lines are rebuilt for the exact step. Other models' dW bands are rows of g (output
channels) and columns (c, i, j) of the unfolded input, both operands together within
``conv_weight_band_share`` of it. Splitting the outputs keeps every element's dot product
whole, and parts of the reduction are one more blocking of the same float64 product, so
neither changes a bit (``tests/test_conv_bands.py`` compares the smallest bands and parts
with one band). Measured with tracemalloc, the per-thread work buffers counted (N = 16,
C = O = 16, 32 x 32, 3 x 3, padding 1, fp32): the forward pass peaks at 2.1 times the input's
bytes, its output (1x) included, dx at 2.1x (dx included), dW at 1.9x (before the bands,
measured the same way: 5.8x, 5.8x, 8.4x); with O = 2 C (``benchmarks/bench_models.py``:
N = 64, 8 -> 16 channels, 14 x 14) at 4.4x (its 2x output included), 3.1x and 2.4x (before:
6.7x, 7.8x, 11.4x).

>>> from fpsim.autograd import Tensor, use_policy
>>> x = Tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
>>> w = Tensor([[[[1.0, 1.0], [1.0, 1.0]]]])
>>> conv2d(x, w, padding=1).data[0, 0]
array([[ 1.,  3.,  2.],
       [ 4., 10.,  6.],
       [ 3.,  7.,  4.]], dtype=float32)
"""
from __future__ import annotations

import math

from .. import backend
from ..backend import size, to_list, tuning, xp
from ..exact import observers, underflow
from ..exact.accumulation import ExactAccumulation
from ..exact.fast_matmul import matmul_2d
from ..exact.product_parts import matmul_in_parts
from ..formats import FP32
from ..options import check_count
from .accumulate import acc_matmul, acc_sum, accumulation_model
from .im2col import Unfolding, unfold
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
    at most ``budget`` elements (``per_row`` per sample and output row), as few as can be
    (each is one product), or, where one row of one sample needs more, one row of one
    sample."""
    best = (n * p, 1, 1)
    for rows in range(1, p + 1):
        samples = min(n, budget // max(rows * per_row, 1))
        if samples >= 1:
            best = min(best, (-(-n // samples) * -(-p // rows), samples, rows))
    _, samples, rows = best
    return [(slice(b, min(n, b + samples)), range(r, min(p, r + rows)))
            for b in range(0, n, samples) for r in range(0, p, rows)]


def _convolve(source, weight, how, groups, out_hw, fmt, model, budget, bias=None):
    """(N, C, Hs, Ws) read as ``how`` says, with (O, C/groups, kh, kw) -> (N, O, P, Q), each
    element the model's dot product over (c, i, j) (+ ``bias`` in the fp32 accumulator,
    ``_band_product``) rounded to ``fmt``; unfolded in bands of at most ``budget`` column
    elements, one group at a time (module doc)."""
    n, cg = source.shape[0], weight.shape[1]
    o, k = weight.shape[0], math.prod(weight.shape[1:])
    (p, q), og = out_hw, o // groups
    weights = xp.reshape(weight, (groups, og, k))
    out = xp.empty((n, o, p, q), container_of(fmt))
    with underflow.assembled(out):      # the bands' roundings: one gradient (when counted)
        for batch, rows in _bands(n, p, q * k, budget):
            for g in range(groups):
                columns = unfold(source[:, g * cg:(g + 1) * cg], how, batch, rows, q, 0, k,
                                  column_major=fmt is not FP64)
                part = None if bias is None else bias[g * og:(g + 1) * og]
                product = _band_product(columns, weights[g], fmt, model, part)
                out[batch, g * og:(g + 1) * og, rows.start:rows.stop, :] = xp.transpose(
                    xp.reshape(product, (-1, len(rows), q, og)), (0, 3, 1, 2))
    return out


def _band_product(columns, weights, fmt, model, bias):
    """columns @ weights.T rounded to ``fmt``; with a bias, the fp32 epilogue
    round_fmt(fl32(acc + bias)) as ``linear`` has it: certified in one pass by the exact
    model's 2-D fast path where it applies (``fast_matmul.matmul_2d``: the same bits), else
    the accumulator, the float32 addition and the rounding one after the other."""
    if bias is None:
        return acc_matmul(columns, weights.T, fmt, model)
    if (isinstance(model, ExactAccumulation) and model.acc == FP32 and fmt is not FP64
            and columns.dtype == xp.float32 and not observers.gradients_observed()):
        out = matmul_2d(columns, weights.T, fmt, bias, note=False)
        if out is not None:
            return out
    acc = acc_matmul(columns, weights.T, FP64 if fmt is FP64 else FP32, model)
    with xp.errstate(invalid="ignore", over="ignore"):     # inf - inf is NaN, as in IEEE
        acc += bias                                        # the epilogue's fp32 addition
    return round_array(acc, fmt)


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
    plain = fmt is FP64
    budget = _band_budget(x.data, out_hw, weight.shape[0], groups, plain, "conv_band_share")
    reads_x = Unfolding(kernel, stride, dilation, padding, (1, 1))
    out = _convolve(x.data, weight.data, reads_x, groups, out_hw, fmt, model, budget,
                    None if bias is None else bias.data)

    def backward(g, g_fmt):
        dx = dw = db = None
        if x.requires_grad:
            reads_g = Unfolding(kernel, (1, 1), dilation,
                                tuple(d * (k - 1) - pad for k, d, pad
                                      in zip(kernel, dilation, padding)), stride)
            dx = _convolve(g, _transposed_kernel(weight.data, groups), reads_g, groups,
                           x.shape[2:], x.grad_fmt, model, budget)
        if weight.requires_grad:
            dw = _weight_gradient(g, x.data, weight, reads_x, groups, model, _band_budget(
                x.data, out_hw, weight.shape[0], groups, plain, "conv_weight_band_share"))
        if bias is not None and bias.requires_grad:
            db = acc_sum(g, (0, 2, 3), False, bias.grad_fmt, model)
        return (dx, dw) if bias is None else (dx, dw, db)

    return record(out, fmt, tensors, backward, "conv2d")


def _band_budget(x, out_hw, out_channels, groups, plain: bool, share: str) -> int:
    """Elements one band may unfold: the ``tuning()`` share named ``share`` of the larger of
    the input x and the output (the gradient g in the backward pass), at least one.
    ``plain`` (the float64 reference mode, whose BLAS products' last bits may depend on their
    shapes): the input's size over all groups, whatever the tuning, the bands this module
    always made."""
    if plain:
        return max(1, backend.size(x) // groups)
    output = x.shape[0] * out_channels * out_hw[0] * out_hw[1]
    return max(1, int(getattr(tuning(), share) * max(backend.size(x), output)))


def _weight_gradient(g, x, weight, how, groups, model, budget):
    """dW[o, c, i, j] = g[:, o] . (the input tap (i, j) of channel c meets): one dot product
    over (n, p, q) per element, the reduction never split; in bands (``_banded_weight_gradient``),
    or tap by tap in the float64 reference mode (``_plain_weight_gradient``)."""
    dw = xp.empty(weight.shape, container_of(weight.grad_fmt))
    with underflow.assembled(dw):      # the bands' roundings: one gradient (when counted)
        if weight.grad_fmt is FP64 or x.dtype == xp.float64 or g.dtype == xp.float64:
            _plain_weight_gradient(dw, g, x, how, groups, weight.grad_fmt, model)
        else:
            _banded_weight_gradient(dw, g, x, how, groups, weight.grad_fmt, model, budget)
    return dw


def _banded_weight_gradient(dw, g, x, how, groups, fmt, model, budget):
    """dW into ``dw`` in bands of output channels (rows of g) and of (c, i, j) columns, both
    operands of a band together at most ``budget`` elements (``_weight_bands``); on the
    exact model's fast path, the reduction in parts (``_weight_gradient_in_parts``)."""
    n, o, p, q = g.shape
    og, cg, k = o // groups, dw.shape[1], math.prod(dw.shape[1:])
    flat = xp.reshape(dw, (o, k))       # a view: the bands write dw
    for group in range(groups):
        source = x[:, group * cg:(group + 1) * cg]
        channels = range(group * og, (group + 1) * og)
        if _fast_path_applies(model, fmt, g):
            _weight_gradient_in_parts(flat, g, source, how, channels, fmt, model, max(1, int(
                tuning().conv_weight_part_share * max(backend.size(x), backend.size(g)))))
            continue
        rows, cols = _weight_bands(og, k, n * p * q, budget)
        for left in range(0, k, cols):  # each column band unfolded once
            right = min(k, left + cols)
            columns = unfold(source, how, slice(0, n), range(p), q, left, right,
                              column_major=True)
            for first in range(channels.start, channels.stop, rows):
                stop = min(channels.stop, first + rows)
                flat[first:stop, left:right] = acc_matmul(_gradient_rows(g, first, stop),
                                                          columns, fmt, model)


def _gradient_rows(g, first, stop):
    """g's output channels [first, stop) as (stop - first, N P Q) rows (a float32 copy)."""
    n, _, p, q = g.shape
    return xp.reshape(xp.transpose(g[:, first:stop], (1, 0, 2, 3)), (stop - first, n * p * q))


def _fast_path_applies(model, fmt, g) -> bool:
    """Whether dW's products take the exact model's 2-D fast path (``matmul_2d``)."""
    return (isinstance(model, ExactAccumulation) and model.acc == FP32 and fmt is not FP64
            and g.dtype == xp.float32)


def _weight_gradient_in_parts(flat, g, source, how, channels, fmt, model, budget):
    """dW's rows ``channels`` (one group) on the exact fast path, the reduction over (n, p, q)
    in parts of samples (``product_parts.matmul_in_parts``: the bits of ``matmul_2d`` on the
    whole operands, which are never built): each part's gradient rows and im2col columns
    together at most ``budget`` float32 elements (their float64 copies: twice that). A
    product the fast path does not take (NaN/inf) goes the general way (``acc_matmul``)."""
    n, _, p, q = g.shape
    k = flat.shape[1]
    chosen = g[:, channels.start:channels.stop]
    samples = max(1, budget // max(1, (len(channels) + k) * p * q))

    def parts():
        for first in range(0, n, samples):
            batch = slice(first, min(n, first + samples))
            yield (_gradient_rows(chosen[batch], 0, len(channels)),
                   unfold(source, how, batch, range(p), q, 0, k, column_major=True))

    def rows_of(lines):
        return _gradient_rows(xp.take(chosen, lines, axis=1), 0, size(lines))

    def cols_of(columns):
        return xp.concatenate([unfold(source, how, slice(0, n), range(p), q, c, c + 1)
                               for c in to_list(columns)], axis=1)

    out = matmul_in_parts(parts(), (len(channels), k), fmt, rows_of, cols_of, budget)
    if out is None:
        out = acc_matmul(_gradient_rows(chosen, 0, len(channels)),
                         unfold(source, how, slice(0, n), range(p), q, 0, k), fmt, model)
    flat[channels.start:channels.stop] = out


def _plain_weight_gradient(dw, g, x, how, groups, fmt, model):
    """dW into ``dw`` in the float64 reference mode: plain float64 products of the shapes
    this module always used (their last bits may depend on them), one kernel tap at a time,
    each (O/groups, N P Q) @ (N P Q, C/groups) per group."""
    n, o, p, q = g.shape
    og, cg, (kh, kw) = o // groups, dw.shape[1], dw.shape[2:]
    for group in range(groups):
        grads = xp.reshape(xp.transpose(g[:, group * og:(group + 1) * og], (1, 0, 2, 3)),
                           (og, n * p * q))
        source = x[:, group * cg:(group + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                tap = how._replace(kernel=(1, 1), offset=(how.offset[0] - i * how.dilation[0],
                                                          how.offset[1] - j * how.dilation[1]))
                columns = unfold(source, tap, slice(0, n), range(p), q, 0, cg)
                dw[group * og:(group + 1) * og, :, i, j] = acc_matmul(grads, columns, fmt,
                                                                      model)


def _weight_bands(rows, cols, length, budget):
    """(output channels, columns) per band of dW: both operands' bands (rows and columns of
    ``length`` elements) within ``budget`` elements where one of each fits, the fewest
    products, of those the smallest bands."""
    room = max(2, budget // length)
    best = None
    for height in range(1, min(rows, room - 1) + 1):
        width = min(cols, room - height)
        key = (-(-rows // height) * -(-cols // width), height + width)
        best = min(best, (key, height, width)) if best else (key, height, width)
    return best[1], best[2]


register(conv2d)
