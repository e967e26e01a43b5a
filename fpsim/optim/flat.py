"""A speed path of ``Optimizer.step``: many small parameters updated as one flat array.

Each pass over a parameter costs a fixed amount besides its elementwise work (some 40 us on
NumPy, against about 1 ns an element to join arrays). Where the rule is elementwise (SGD,
Adam: each output element depends on the same element of each input only), one pass over
the parameters joined into one flat array gives the bits of one parameter at a time, save
the sign of a NaN computed from two NaNs of opposite signs (NumPy's SIMD loops return one
operand in their vector body and the other in their tail, so that sign depends on an
element's position, and on the machine).

After such a step the master copies, the weights and the rule's state are views of the step's
flat results, kept beside them (``Joined``), so the next step joins nothing: ``rejoin`` takes
the flat array itself where it is given the very views it handed out.

``backend.tuning().together_max`` sets where the path pays: parameters holding at most that
many elements per pass saved (parameters - 1); 0 turns it off. For a GPU backend this whole
module is what a multi-tensor kernel does (PyTorch's ``_foreach_*`` ops, apex's
``multi_tensor_apply``: one launch over a list of tensors); such a backend would offer it as
a kernel (a list of arrays in, a list of arrays out) and this module would call it.

>>> from fpsim.backend import xp
>>> parts = split(join([xp.zeros((2, 2), xp.float32), xp.ones(3, xp.float32)]), [(2, 2), (3,)])
>>> [p.shape for p in parts.parts], rejoin(parts.parts, parts) is parts.flat
([(2, 2), (3,)], True)
"""
from __future__ import annotations

import math
from typing import NamedTuple

from ..backend import tuning, xp
from ..formats import Format
from .rules import SGD, Adam

__all__ = ["Joined", "NOT_JOINED", "join", "rejoin", "split", "together_format",
           "ELEMENTWISE_RULES"]

#: rules whose update of each element reads the same element of each input only
ELEMENTWISE_RULES = (SGD, Adam)


class Joined(NamedTuple):
    """Arrays (``parts``) that are consecutive views of one flat array (``flat``); ``flat``
    None where they are not."""

    parts: tuple
    flat: object


NOT_JOINED = Joined((), None)


def join(arrays):
    """The arrays' elements, in C order, one array after the other, in one new flat array.
    (NumPy's ``concatenate(axis=None)`` does the same, measured slower.)"""
    return xp.concatenate([a if a.ndim == 1 else xp.reshape(a, (-1,)) for a in arrays])


def rejoin(arrays, last: Joined):
    """``join(arrays)``, without a copy where ``arrays`` are ``last``'s views themselves."""
    if (last.flat is not None and len(last.parts) == len(arrays)
            and all(a is b for a, b in zip(arrays, last.parts))):
        return last.flat
    return join(arrays)


def split(flat, shapes) -> Joined:
    """``flat`` (one dimension) as consecutive views of the given shapes (the inverse of
    ``join``)."""
    parts, start = [], 0
    for shape in shapes:
        stop = start + math.prod(shape)
        part = flat[start:stop]
        parts.append(part if len(shape) == 1 else xp.reshape(part, shape))
        start = stop
    return Joined(tuple(parts), flat)


def together_format(rule, tensors, stored, states, master_fmt) -> "Format | None":
    """The format in which the step updates all parameters as one flat array, or None where
    it goes parameter by parameter: the rule is elementwise, the parameters are many small
    ones (``tuning().together_max``), share the update's format (the master's, or one format
    of all weights without a master), and the values the rule reads (``stored``: masters or
    weights; ``states``: the rule's state of each parameter) are float32 arrays."""
    if type(rule) not in ELEMENTWISE_RULES or len(tensors) < 2:
        return None
    if sum(math.prod(p.shape) for p in tensors) > (len(tensors) - 1) * tuning().together_max:
        return None
    fmt = master_fmt if master_fmt is not None else tensors[0].fmt
    if master_fmt is None and any(p.fmt != fmt for p in tensors):
        return None
    if not all(_float32_array(v) for v in stored):
        return None
    for field in zip(*states):
        if not (all(f is None for f in field) or all(_float32_array(f) for f in field)):
            return None
    return fmt


def _float32_array(value) -> bool:
    return isinstance(value, xp.ndarray) and value.dtype == xp.float32
