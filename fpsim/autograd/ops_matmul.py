"""Matrix products: ``matmul`` (2-D and batched) and ``linear`` (x @ W.T + b, one fused op).

Both are in the policy's ``matmul`` category (autocast's float16 list): inputs are cast to the
category format, every dot product is formed by the accumulation model
(``fpsim.exact.accumulation``; default: the policy's) into an fp32 accumulator and rounded
once to the output format. ``linear`` adds the bias to the fp32 accumulator before that last
rounding, as a cuBLAS(Lt) GEMM epilogue does::

    y = round_out( round_fp32( round_fp32(x @ W.T) + b ) )       # one rounding to out fmt

Backward (autocast's rule: gradients of fp16 operands are fp16)::

    dx = acc(g @ W)   -> x.grad_fmt        dW = acc(g.T @ x) -> W.grad_fmt
    db = acc(sum(g, batch axes)) -> b.grad_fmt

In the float64 reference mode products are plain float64 ``xp.matmul``.

>>> from fpsim.autograd import Tensor, use_policy
>>> with use_policy("16-mixed"):
...     y = Tensor([[1.0, 2.0]]) @ Tensor([[0.1], [0.2]])
>>> y.fmt.name, y.data          # 0.1, 0.2 cast to fp16 first, product rounded to fp16
('fp16', array([[0.5]], dtype=float32))
"""
from __future__ import annotations

from ..backend import xp

from ..exact import observers
from ..exact.accumulation import ExactAccumulation
from ..exact.fast_matmul import matmul_2d
from ..formats import FP32
from .accumulate import acc_matmul, acc_sum, accumulation_model, sum_to_shape
from .numerics import FP64, round_array
from .context import current_policy
from .ops_fp8 import quantized_linear
from .ops_shape import check_linear_shapes, operands
from .tensor import Tensor, record, register

__all__ = ["matmul", "linear"]


def _fused_linear(x, weight, bias, fmt, model):
    """The fp32 epilogue ``round_fmt(fl32(acc + bias))`` certified in one pass by the exact
    model's 2-D fast path (same bits as acc_matmul to fp32, ``+=`` bias, round_array); None
    where it does not apply. While gradient underflow is being counted the general path runs,
    so the counter sees exactly its two roundings."""
    if (x.dtype != xp.float32 or weight.dtype != xp.float32 or bias.dtype != xp.float32
            or not isinstance(model, ExactAccumulation) or model.acc != FP32
            or observers.gradients_observed()):
        return None
    out = matmul_2d(xp.reshape(x, (-1, x.shape[-1])), weight.T, fmt, bias, note=False)
    return None if out is None else xp.reshape(out, x.shape[:-1] + (weight.shape[0],))


def _check_matmul_shapes(a_shape, b_shape, op):
    if len(a_shape) < 1 or len(b_shape) < 1:
        raise ValueError(f"{op}: scalars have no matrix product (shapes {a_shape} and {b_shape})")
    inner_a = a_shape[-1]
    inner_b = b_shape[-2] if len(b_shape) >= 2 else b_shape[0]
    if inner_a != inner_b:
        raise ValueError(f"{op}: shapes {a_shape} and {b_shape}: inner dimensions "
                         f"{inner_a} and {inner_b} differ")
    try:
        xp.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    except ValueError:
        raise ValueError(f"{op}: batch dimensions of shapes {a_shape} and {b_shape} do not "
                         f"broadcast") from None


def matmul(a, b, *, accumulation=None) -> Tensor:
    """``a @ b`` for 2-D or batched (..., M, K) @ (..., K, N) tensors (1-D operands are
    promoted to matrices and the added axis removed again, as in NumPy)."""
    fmt, (a, b) = operands("matmul", a, b)
    _check_matmul_shapes(a.shape, b.shape, "matmul")
    model = accumulation_model(accumulation)
    a2 = a.data[None, :] if a.ndim == 1 else a.data
    b2 = b.data[:, None] if b.ndim == 1 else b.data
    out = acc_matmul(a2, b2, fmt, model)
    if a.ndim == 1:
        out = out[..., 0, :]
    if b.ndim == 1:
        out = out[..., 0]

    def backward(g, g_fmt):
        g2 = g
        if a.ndim == 1:
            g2 = g2[..., None, :]
        if b.ndim == 1:
            g2 = g2[..., None]
        da = db = None
        if a.requires_grad:
            da = acc_matmul(g2, xp.swapaxes(b2, -1, -2), a.grad_fmt, model)
            da = xp.reshape(sum_to_shape(da, a2.shape, a.grad_fmt, model), a.shape)
        if b.requires_grad:
            db = acc_matmul(xp.swapaxes(a2, -1, -2), g2, b.grad_fmt, model)
            db = xp.reshape(sum_to_shape(db, b2.shape, b.grad_fmt, model), b.shape)
        return da, db

    return record(out, fmt, (a, b), backward, "matmul")


def linear(x, weight, bias=None, *, accumulation=None, scaling_slots=None,
           fp8: bool = True) -> Tensor:
    """``x @ weight.T + bias`` with ``weight`` of shape (out, in) as in PyTorch; ``x`` is
    (..., in). The bias joins the fp32 accumulator before the one rounding to the output
    format (module doc). Under a policy with an FP8 recipe the operands are quantized
    (``ops_fp8``; ``scaling_slots``: the GEMM's ``ScalingSlots``, kept by ``nn.Linear``)
    unless ``fp8=False`` or the slots are ``kept`` (a recipe's ``keep=``), which keep this
    product in the policy's matmul format."""
    kept = scaling_slots is not None and scaling_slots.kept
    recipe = current_policy().fp8 if fp8 and not kept else None
    if recipe is not None:
        return quantized_linear(x, weight, bias, recipe=recipe, slots=scaling_slots,
                                accumulation=accumulation)
    parts = (x, weight) if bias is None else (x, weight, bias)
    fmt, tensors = operands("matmul", *parts)
    x, weight = tensors[:2]
    bias = tensors[2] if bias is not None else None
    check_linear_shapes(x, weight, bias)
    model = accumulation_model(accumulation)
    if bias is None:
        out = acc_matmul(x.data, weight.data.T, fmt, model)
    elif fmt is FP64:
        out = xp.matmul(x.data, weight.data.T) + bias.data
    elif (out := _fused_linear(x.data, weight.data, bias.data, fmt, model)) is not None:
        pass
    else:
        acc = acc_matmul(x.data, weight.data.T, FP32, model)
        with xp.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, as in IEEE
            acc += bias.data  # float32 addition: the epilogue's fp32 rounding
        out = round_array(acc, fmt)

    def backward(g, g_fmt):
        dx = dw = db = None
        if x.requires_grad:
            dx = acc_matmul(g, weight.data, x.grad_fmt, model)
        if weight.requires_grad:
            g2 = xp.reshape(g, (-1, g.shape[-1]))
            dw = acc_matmul(g2.T, xp.reshape(x.data, (-1, x.shape[-1])), weight.grad_fmt, model)
        if bias is not None and bias.requires_grad:
            db = acc_sum(xp.reshape(g, (-1, g.shape[-1])), 0, False, bias.grad_fmt, model)
        return (dx, dw) if bias is None else (dx, dw, db)

    return record(out, fmt, tensors, backward, "linear")


register(matmul)
