"""Format casts and shape ops, and how an op picks its format from the policy.

``cast`` is the only op that changes a tensor's format on purpose. Forward: one rounding into
the new format (none when the new format holds every value of the old one). Backward: the
gradient, which arrives in the cast output's gradient format, is converted to the source's
gradient format: widening (fp16 -> fp32, exact) or rounding. This is how autocast's fp16 copy
of an fp32 weight sends an fp16 gradient back to the fp32 weight.

Shape ops (reshape, transpose, indexing, concatenate, stack) move values without arithmetic,
so they never round; concatenate and stack of mixed formats promote (``numerics.widest``).

>>> from fpsim.autograd import Tensor
>>> w = Tensor([1.0, 1e-5], "fp32", requires_grad=True)
>>> h = w.cast("fp16"); h.data
array([1.000000e+00, 1.001358e-05], dtype=float32)
>>> (h * 1e-3).sum().backward(); w.grad.data   # fp16(1e-3), widened to w's fp32 gradient
array([0.0010004, 0.0010004], dtype=float32)
"""
from __future__ import annotations

from itertools import accumulate

from .. import backend
from ..backend import xp
from ..exact import scatter_sum
from .context import current_policy
from .numerics import container_of, contains, resolve, round_array, widest
from .tensor import Tensor, as_tensor, record, register

__all__ = ["cast", "convert", "operands", "reshape", "transpose", "getitem", "concatenate",
           "stack"]


def convert(array, src_fmt, dst_fmt):
    """``array`` (values in ``src_fmt``) in ``dst_fmt``: no rounding when ``dst_fmt`` holds
    every value of ``src_fmt``, only a change of container if needed."""
    if src_fmt is dst_fmt or contains(dst_fmt, src_fmt):
        return backend.astype(array, container_of(dst_fmt), copy=False)
    return round_array(array, dst_fmt)


def cast(x: Tensor, fmt) -> Tensor:
    """``x`` in format ``fmt`` (recorded, so gradients flow back converted to ``x.grad_fmt``)."""
    fmt = resolve(fmt)
    if x.fmt is fmt or x.fmt == fmt:
        return x
    data = convert(x.data, x.fmt, fmt)

    def backward(g, g_fmt):
        return (convert(g, g_fmt, x.grad_fmt),)

    return record(data, fmt, (x,), backward, f"cast[{fmt}]")


def operands(category: str, *values):
    """Resolve an op's inputs under the current policy.

    Returns ``(fmt, tensors)``: with the category's format set, every tensor is cast to it;
    with ``None`` (promote), tensors pass unchanged and ``fmt`` is the widest of theirs.
    Non-tensor inputs (arrays, lists) become constants in the policy's ``input`` format;
    Python scalars are handled by the ops themselves.
    """
    policy = current_policy()
    tensors = tuple(as_tensor(v) for v in values)
    fmt = getattr(policy, category)
    if fmt is None:
        fmt = widest(*(t.fmt for t in tensors))
        return fmt, tensors
    return fmt, tuple(cast(t, fmt) for t in tensors)


def check_linear_shapes(x: Tensor, weight: Tensor, bias) -> None:
    """``linear``'s operands fit: weight (out, in), x (..., in), bias (out,) or None."""
    if weight.ndim != 2:
        raise ValueError(f"linear: weight must be 2-D (out, in), got shape {weight.shape}")
    if x.ndim < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: input shape {x.shape} and weight shape {weight.shape}: "
                         f"input features {x.shape[-1] if x.ndim else None} != "
                         f"weight in-features {weight.shape[1]}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"linear: bias shape {bias.shape} != ({weight.shape[0]},) for weight "
                         f"shape {weight.shape}")


def reshape(x: Tensor, *shape) -> Tensor:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    try:
        data = xp.reshape(x.data, shape)
    except ValueError:
        raise ValueError(f"reshape: cannot reshape shape {x.shape} ({x.size} elements) "
                         f"to {shape}") from None

    def backward(g, g_fmt):
        return (convert(xp.reshape(g, x.shape), g_fmt, x.grad_fmt),)

    return record(data, x.fmt, (x,), backward, "reshape")


def transpose(x: Tensor, *axes) -> Tensor:
    """Reverse the axes (no ``axes``) or permute them like ``numpy.transpose``."""
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = tuple(axes[0])
    axes = axes or tuple(range(x.ndim - 1, -1, -1))
    if sorted(a % max(x.ndim, 1) for a in axes) != list(range(x.ndim)):
        raise ValueError(f"transpose: axes {axes} are not a permutation of the {x.ndim} axes "
                         f"of shape {x.shape}")
    inverse = tuple(sorted(range(x.ndim), key=lambda i: axes[i] % x.ndim))

    def backward(g, g_fmt):
        return (convert(xp.transpose(g, inverse), g_fmt, x.grad_fmt),)

    return record(xp.transpose(x.data, axes), x.fmt, (x,), backward, "transpose")


def getitem(x: Tensor, index) -> Tensor:
    """NumPy indexing: ints, slices, ``None``, ``...``, integer or boolean arrays.

    Backward scatters the gradient into zeros (no rounding: each element receives at most one
    value) except where integer-array indices may repeat (an embedding lookup): there each
    element's total is the exact sum of its repeated gradients (``fpsim.exact.scatter_sum``:
    no order, so no atomics on any array library), rounded once to ``x.grad_fmt``.
    """
    if isinstance(index, Tensor):
        index = backend.astype(index.data, xp.int64)
    try:
        data = x.data[index]
    except IndexError as err:
        raise IndexError(f"index into shape {x.shape}: {err}") from None
    parts = index if isinstance(index, tuple) else (index,)
    # anything but ints, slices, None and ... is an index array (a host or backend array,
    # a list); a repeated-index scatter is exact for unrepeated ones too, only slower
    advanced = any(not isinstance(p, (int, slice, type(None), type(Ellipsis))) for p in parts)

    def backward(g, g_fmt):
        if advanced:
            targets = xp.reshape(xp.arange(x.size), x.shape)[index]
            full = xp.reshape(scatter_sum(targets, g, x.size), x.shape)
            return (round_array(full, x.grad_fmt),)
        full = xp.zeros(x.shape, g.dtype)
        full[index] = g
        return (convert(full, g_fmt, x.grad_fmt),)

    return record(xp.ascontiguousarray(data), x.fmt, (x,), backward, "getitem")


def _join(tensors, axis, op):
    if not tensors:
        raise ValueError(f"{op} needs at least one tensor")
    _, tensors = operands("elementwise", *tensors)
    fmt = widest(*(t.fmt for t in tensors))
    arrays = [convert(t.data, t.fmt, fmt) for t in tensors]
    try:
        data = xp.concatenate(arrays, axis) if op == "concatenate" else xp.stack(arrays, axis)
    except ValueError as err:  # an axis out of range is a ValueError too
        raise ValueError(f"{op}: shapes {[t.shape for t in tensors]} along axis {axis}: "
                         f"{err}") from None
    return fmt, tensors, data


def concatenate(tensors, axis: int = 0) -> Tensor:
    fmt, tensors, data = _join(list(tensors), axis, "concatenate")
    bounds = list(accumulate(t.shape[axis] for t in tensors))[:-1]

    def backward(g, g_fmt):
        parts = xp.split(g, bounds, axis=axis)
        return tuple(convert(p, g_fmt, t.grad_fmt) for p, t in zip(parts, tensors))

    return record(data, fmt, tensors, backward, "concatenate")


def stack(tensors, axis: int = 0) -> Tensor:
    fmt, tensors, data = _join(list(tensors), axis, "stack")

    def backward(g, g_fmt):
        parts = xp.moveaxis(g, axis, 0)
        return tuple(convert(xp.ascontiguousarray(p), g_fmt, t.grad_fmt)
                     for p, t in zip(parts, tensors))

    return record(data, fmt, tensors, backward, "stack")


register(reshape, transpose, getitem, cast)
