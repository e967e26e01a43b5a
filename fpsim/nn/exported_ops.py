"""The ATen ops a ``torch.export`` graph may hold (``fpsim.nn.exported``), each mapped onto
the engine's op as ``traced_ops`` maps torch's functions: ``aten.addmm`` (GPT-2's
``Conv1D``: bias, x, w with w (in, out)) is ``autograd.linear(x, w^T, bias)`` (one product
rounded once, bias in the fp32 accumulator), ``aten.layer_norm`` is ``layer_norm``,
``aten.scaled_dot_product_attention`` is PyTorch's math kernel (``traced_ops``), shape ops
never round, ``aten.add``/``mul`` are the Tensor's operators (one float32 operation, one
rounding), ``aten.pow`` is ``autograd.pow``, ``aten.tanh`` is the correctly rounded tanh.

Integer and boolean values (positions, masks built from the input's shape) are backend
arrays, computed exactly with the array library (``arange``, ``cumsum``, ``diff``,
comparisons, ``index``); a comparison of float values compares the Tensor's data (no
gradient: a mask). ``ATEN`` maps the op's name (``"aten.view.default"``) to its handler;
``GEMMS`` are the handlers that take the node's FP8 scaling slots.
"""
from __future__ import annotations

import operator

from .. import autograd as ag
from .. import backend
from ..backend import xp
from .traced_ops import METHODS, scaled_dot_product_attention

__all__ = ["ATEN", "GEMMS", "DType"]


class DType(str):
    """A torch dtype in a node's arguments, by name ("bool", "int64", "float32")."""


def _is_tensor(value):
    return isinstance(value, ag.Tensor)


def _data(value):
    return value.data if _is_tensor(value) else value


def _either(tensor_op, array_op):
    """A handler running ``tensor_op`` when any argument is a Tensor, else ``array_op``."""
    def apply(*args, **kwargs):
        if any(_is_tensor(a) for a in args):
            return tensor_op(*args, **kwargs)
        return array_op(*args, **kwargs)
    return apply


def _binary(op, name):
    def tensor_op(a, b, alpha=1):
        if alpha != 1:
            raise ValueError(f"aten.{name}: alpha={alpha} is not supported")
        return op(a, b)
    return _either(tensor_op, lambda a, b, alpha=1: op(xp.asarray(a), b * alpha))


def _compare(op):
    return lambda a, b: op(xp.asarray(_data(a)), _data(b))


def _array_dtype(dtype):
    return {"bool": bool, "int64": xp.int64, "int32": xp.int32}.get(dtype)


def _to(x, *args, dtype=None, **kwargs):
    """``.to(dtype)``: integer and boolean arrays cast; a float Tensor stays in its format
    (the policy decides formats; the graph was exported in float32 or float64)."""
    dtype = next((a for a in args if isinstance(a, DType)), dtype)
    if _is_tensor(x):
        if dtype not in (None, "float32", "float64"):
            raise ValueError(f"aten.to: a float tensor to {dtype} is not supported")
        return x
    wanted = _array_dtype(dtype)
    return x if wanted is None else backend.astype(xp.asarray(x), wanted)


def _arange(*args, dtype=None, **kwargs):
    return xp.arange(*args, dtype=_array_dtype(dtype) or xp.int64)


def _new_ones(x, size, dtype=None, **kwargs):
    return xp.ones(tuple(size), dtype=_array_dtype(dtype) or xp.int64)


def _expand(x, size, implicit=False):
    if _is_tensor(x):
        raise ValueError("aten.expand of a float tensor is not supported")
    x = xp.asarray(x)
    lead = len(size) - x.ndim
    shape = [x.shape[i - lead] if n == -1 else n for i, n in enumerate(size)]
    return xp.broadcast_to(x, tuple(shape))


def _index(x, indices):
    index = tuple(slice(None) if i is None else xp.asarray(i) for i in indices)
    return ag.getitem(x, index) if _is_tensor(x) else xp.asarray(x)[index]


def _slice(x, dim=0, start=None, end=None, step=1):
    index = (slice(None),) * (dim % x.ndim) + (slice(start, end, step),)
    return ag.getitem(x, index) if _is_tensor(x) else xp.asarray(x)[index]


def _diff(x, n=1, dim=-1, prepend=None, append=None):
    parts = [p for p in (prepend, x, append) if p is not None]
    whole = xp.concatenate([xp.asarray(p) for p in parts], axis=dim)
    for _ in range(n):
        dim = dim % whole.ndim
        ahead = (slice(None),) * dim + (slice(1, None),)
        behind = (slice(None),) * dim + (slice(None, -1),)
        whole = whole[ahead] != whole[behind] if whole.dtype == bool else \
            whole[ahead] - whole[behind]
    return whole


def _shape_op(tensor_op, array_op):
    return _either(tensor_op, lambda x, *a: array_op(xp.asarray(x), *a))


def _addmm(bias, x, weight, beta=1, alpha=1, *, scaling_slots=None):
    if beta != 1 or alpha != 1:
        raise ValueError(f"aten.addmm: beta={beta}, alpha={alpha} are not supported")
    return ag.linear(x, ag.transpose(weight), bias, scaling_slots=scaling_slots)


def _linear(x, weight, bias=None, *, scaling_slots=None):
    return ag.linear(x, weight, bias, scaling_slots=scaling_slots)


def _layer_norm(x, shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return ag.layer_norm(x, tuple(shape), weight, bias, eps)


def _embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if padding_idx != -1 or scale_grad_by_freq or sparse:
        raise ValueError("aten.embedding: padding_idx, scale_grad_by_freq and sparse are not "
                         "supported")
    return ag.getitem(weight, backend.astype(xp.asarray(_data(indices)), xp.intp))


def _dropout(x, p, train):
    if p and train:
        raise ValueError(f"aten.dropout: p={p} in training mode is not supported on the "
                         f"torch.export route (convert the model in eval mode or with p=0)")
    return x


def _identity(x, *args, **kwargs):
    return x


def _softmax(x, dim, half_to_float=False):
    return ag.softmax(x, dim)


ATEN = {
    "aten.view.default": _shape_op(METHODS["view"], xp.reshape),
    "aten.reshape.default": _shape_op(METHODS["view"], xp.reshape),
    "aten._unsafe_view.default": _shape_op(METHODS["view"], xp.reshape),
    "aten.unsqueeze.default": _shape_op(METHODS["unsqueeze"], xp.expand_dims),
    "aten.transpose.int": _shape_op(METHODS["transpose"], xp.swapaxes),
    "aten.permute.default": _shape_op(METHODS["permute"], xp.transpose),
    "aten.expand.default": _expand, "aten.index.Tensor": _index, "aten.slice.Tensor": _slice,
    "aten.split.Tensor": METHODS["split"], "aten.split_with_sizes.default": METHODS["split"],
    "aten.cat.default": lambda tensors, dim=0: ag.concatenate(tensors, dim),
    "aten.add.Tensor": _binary(operator.add, "add"), "aten.sub.Tensor":
        _binary(operator.sub, "sub"),
    "aten.mul.Tensor": _binary(operator.mul, "mul"), "aten.div.Tensor":
        _binary(operator.truediv, "div"),
    "aten.neg.default": operator.neg, "aten.pow.Tensor_Scalar": ag.pow,
    "aten.tanh.default": ag.tanh, "aten.exp.default": ag.exp, "aten.sqrt.default": ag.sqrt,
    "aten.relu.default": ag.relu, "aten.sigmoid.default": ag.sigmoid,
    "aten.silu.default": ag.silu, "aten.gelu.default": METHODS["gelu"],
    "aten.softmax.int": _softmax, "aten._softmax.default": _softmax,
    "aten.mean.dim": METHODS["mean"], "aten.sum.dim_IntList": METHODS["sum"],
    "aten.layer_norm.default": _layer_norm, "aten.embedding.default": _embedding,
    "aten.addmm.default": _addmm, "aten.linear.default": _linear,
    "aten.matmul.default": ag.matmul, "aten.bmm.default": ag.matmul,
    "aten.mm.default": ag.matmul,
    "aten.scaled_dot_product_attention.default": scaled_dot_product_attention,
    "aten.dropout.default": _dropout, "aten.alias.default": _identity,
    "aten.clone.default": _identity, "aten.contiguous.default": _identity,
    "aten._assert_tensor_metadata.default": lambda *args, **kwargs: None,
    "aten.to.dtype_layout": _to, "aten.to.dtype": _to, "aten._to_copy.default": _to,
    "aten.arange.default": _arange, "aten.arange.start": _arange,
    "aten.new_ones.default": _new_ones, "aten.cumsum.default":
        lambda x, dim, dtype=None: xp.cumsum(xp.asarray(x), axis=dim),
    "aten.diff.default": _diff,
    "aten.eq.Tensor": _compare(operator.eq), "aten.eq.Scalar": _compare(operator.eq),
    "aten.ne.Tensor": _compare(operator.ne), "aten.ne.Scalar": _compare(operator.ne),
    "aten.le.Tensor": _compare(operator.le), "aten.le.Scalar": _compare(operator.le),
    "aten.lt.Tensor": _compare(operator.lt), "aten.lt.Scalar": _compare(operator.lt),
    "aten.ge.Tensor": _compare(operator.ge), "aten.ge.Scalar": _compare(operator.ge),
    "aten.gt.Tensor": _compare(operator.gt), "aten.gt.Scalar": _compare(operator.gt),
    "aten.__and__.Tensor": lambda a, b: xp.logical_and(a, b),
    "aten.__or__.Tensor": lambda a, b: xp.logical_or(a, b),
    "aten.logical_not.default": xp.logical_not, "aten.bitwise_not.default": xp.logical_not,
    "aten.sym_size.int": lambda x, dim: x.shape[dim],
    "_operator.getitem": operator.getitem, "_operator.add": operator.add,
    "_operator.sub": operator.sub, "_operator.mul": operator.mul,
    "_operator.floordiv": operator.floordiv,
}

GEMMS = ("aten.addmm.default", "aten.linear.default")
