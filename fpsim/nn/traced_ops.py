"""The torch functions and tensor methods a traced model may call (``fpsim.nn.traced``),
each mapped onto the engine's own op with torch's argument names, so each rounds where that
op rounds (the policy's category for it, as autocast): ``F.relu`` is ``autograd.relu``,
``torch.flatten`` and ``.view`` are ``reshape`` (never round), ``F.softmax`` is
``autograd.softmax`` (the ``wide`` category), ``F.linear`` is ``autograd.linear`` with the
node's own FP8 scaling slots, ``operator.add`` is the Tensor's ``+`` (one float32 operation,
one rounding), and so on. Nothing is computed here that an engine op does not compute.

``FUNCTIONS`` maps a function's dotted torch name to its handler, ``METHODS`` a tensor
method's name to its handler (the tensor first). ``F.scaled_dot_product_attention`` follows
PyTorch's math kernel: q and k each scaled by sqrt(scale) (one float32 multiplication each),
``q @ k^T``, the mask (boolean: True keeps, as PyTorch's; float: added), softmax, ``@ v``.
"""
from __future__ import annotations

import math
import operator

from .. import autograd as ag
from .. import backend
from ..backend import xp

__all__ = ["FUNCTIONS", "METHODS", "GEMMS", "ATTRIBUTES", "scaled_dot_product_attention"]

ATTRIBUTES = ("shape", "ndim", "T")     # builtins.getattr on a tensor: these only


def _axis(x, dim):
    return tuple(dim) if isinstance(dim, (list, tuple)) else dim


def _flatten(input, start_dim=0, end_dim=-1):
    shape = input.shape
    start, end = start_dim % max(len(shape), 1), end_dim % max(len(shape), 1)
    return ag.reshape(input, shape[:start] + (math.prod(shape[start:end + 1]),)
                      + shape[end + 1:])


def _shape(size):
    return tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size


def _view(input, *size):
    return ag.reshape(input, _shape(size))


def _transpose(input, dim0, dim1):
    axes = list(range(input.ndim))
    axes[dim0], axes[dim1] = axes[dim1], axes[dim0]
    return ag.transpose(input, *axes)


def _permute(input, *dims):
    return ag.transpose(input, *_shape(dims))


def _unsqueeze(input, dim):
    dim = dim % (input.ndim + 1)
    return ag.reshape(input, input.shape[:dim] + (1,) + input.shape[dim:])


def _size(input, dim=None):
    return input.shape if dim is None else input.shape[dim]


def _mean(input, dim=None, keepdim=False):
    return ag.mean(input, _axis(input, dim), keepdim)


def _sum(input, dim=None, keepdim=False):
    return ag.sum(input, _axis(input, dim), keepdim)


def _softmax(input, dim=None, _stacklevel=3, dtype=None):
    _no_dtype(dtype, "softmax")
    return ag.softmax(input, dim)


def _log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    _no_dtype(dtype, "log_softmax")
    return ag.log_softmax(input, dim)


def _no_dtype(dtype, name):
    if dtype is not None:
        raise ValueError(f"{name}: dtype={dtype} is not supported (the policy decides each "
                         f"op's format)")


def _chunk(input, chunks, dim=0):
    step = -(-input.shape[dim] // chunks)
    return _pieces(input, range(0, input.shape[dim], step), step, dim)


def _split(input, split_size_or_sections, dim=0):
    size = input.shape[dim]
    if isinstance(split_size_or_sections, int):
        return _pieces(input, range(0, size, split_size_or_sections), split_size_or_sections,
                       dim)
    starts = [sum(split_size_or_sections[:i]) for i in range(len(split_size_or_sections))]
    return tuple(_piece(input, start, start + n, dim)
                 for start, n in zip(starts, split_size_or_sections))


def _pieces(input, starts, step, dim):
    return tuple(_piece(input, start, start + step, dim) for start in starts)


def _piece(input, start, stop, dim):
    index = (slice(None),) * (dim % input.ndim) + (slice(start, stop),)
    return ag.getitem(input, index)


def _cat(tensors, dim=0):
    return ag.concatenate(tensors, dim)


def _stack(tensors, dim=0):
    return ag.stack(tensors, dim)


def _gelu(input, approximate="none"):
    return ag.gelu(input, approximate)


def _layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return ag.layer_norm(input, normalized_shape, weight, bias, eps)


def _linear(input, weight, bias=None, *, scaling_slots=None):
    return ag.linear(input, weight, bias, scaling_slots=scaling_slots)


def _masked_fill(input, mask, value):
    return ag.masked_fill(input, _mask_array(mask), value)


def _mask_array(mask):
    return mask.data if isinstance(mask, ag.Tensor) else mask


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """PyTorch's math kernel of ``scaled_dot_product_attention`` (module doc)."""
    if dropout_p or enable_gqa:
        raise ValueError("scaled_dot_product_attention: dropout_p and enable_gqa are not "
                         "supported")
    factor = math.sqrt(1.0 / math.sqrt(query.shape[-1]) if scale is None else scale)
    scores = ag.matmul(query * factor, _transpose(key * factor, -2, -1))
    if is_causal:
        rows, cols = scores.shape[-2:]
        above = xp.greater(xp.expand_dims(xp.arange(cols), 0),
                           xp.expand_dims(xp.arange(rows), 1))    # torch: tril(ones) kept
        scores = ag.masked_fill(scores, above, -math.inf)
    if attn_mask is not None:
        mask = _mask_array(attn_mask)
        if backend.isdtype(mask.dtype, "bool"):
            scores = ag.masked_fill(scores, xp.logical_not(mask), -math.inf)
        else:
            scores = scores + ag.cast(ag.as_tensor(mask), scores.fmt)
    return ag.matmul(ag.softmax(scores, -1), value)


def _compare(op):
    """A comparison of values (a mask: no gradient), as a boolean array."""
    def apply(input, other):
        return op(*(v.data if isinstance(v, ag.Tensor) else v for v in (input, other)))
    return apply


def _identity(input, *args, **kwargs):
    return input


def _binary(op):
    def apply(input, other):
        return op(input, other)
    return apply


_SHARED = {
    "flatten": _flatten, "transpose": _transpose, "permute": _permute, "unsqueeze": _unsqueeze,
    "mean": _mean, "sum": _sum, "softmax": _softmax, "log_softmax": _log_softmax,
    "chunk": _chunk, "split": _split, "relu": ag.relu, "sigmoid": ag.sigmoid,
    "tanh": ag.tanh, "exp": ag.exp, "log": ag.log, "sqrt": ag.sqrt, "reshape": _view,
    "matmul": ag.matmul, "masked_fill": _masked_fill,
    "add": _binary(operator.add), "sub": _binary(operator.sub),
    "mul": _binary(operator.mul), "div": _binary(operator.truediv),
}

FUNCTIONS = {
    **{f"torch.{name}": fn for name, fn in _SHARED.items()},
    "torch.cat": _cat, "torch.concat": _cat, "torch.stack": _stack, "torch.bmm": ag.matmul,
    "torch.nn.functional.relu": lambda input, inplace=False: ag.relu(input),
    "torch.nn.functional.gelu": _gelu, "torch.nn.functional.silu":
        lambda input, inplace=False: ag.silu(input),
    "torch.nn.functional.softmax": _softmax, "torch.nn.functional.log_softmax": _log_softmax,
    "torch.nn.functional.linear": _linear, "torch.nn.functional.layer_norm": _layer_norm,
    "torch.nn.functional.scaled_dot_product_attention": scaled_dot_product_attention,
    "_operator.add": operator.add, "_operator.sub": operator.sub,
    "_operator.mul": operator.mul, "_operator.truediv": operator.truediv,
    "_operator.floordiv": operator.floordiv, "_operator.neg": operator.neg,
    "_operator.matmul": operator.matmul, "_operator.getitem": operator.getitem,
    **{f"_operator.{name}": _compare(getattr(operator, name))
       for name in ("eq", "ne", "lt", "le", "gt", "ge")},
    "math.sqrt": math.sqrt,     # of sizes (fx wraps math's functions of proxies)
}

GEMMS = ("torch.nn.functional.linear",)     # handlers that take the node's scaling slots

METHODS = {
    **_SHARED, "view": _view, "size": _size, "contiguous": _identity,
    "gelu": _gelu, "silu": ag.silu, "bmm": ag.matmul,
}
