"""Counting gradients that underflow: values nonzero before their rounding into a format and
zero after it, during ``backward``.

The engine calls ``note(before, after)`` wherever a backward gradient is rounded into its
format (``fpsim.autograd.numerics.round_array``, and here the accumulation models' output
rounding and the 2-D fast path's); ``Tensor.backward`` marks the pass with ``in_backward``.
Outside a ``count_gradient_underflow()`` block, or outside backward, it does nothing. It lives
in this layer so that the roundings below ``autograd`` can report to it.

>>> import numpy as np
>>> from fpsim.autograd import Tensor, use_policy
>>> with use_policy("16-true"), count_gradient_underflow() as counts:
...     x = Tensor(np.float32([1.0, 1.0]), requires_grad=True)
...     ((x * Tensor(np.float32([2.0 ** -12, 2.0 ** -2]))) * 2.0 ** -14).sum().backward()
>>> x.grad.data.tolist(), counts.flushed, counts.nonzero    # 2**-26 is below fp16's 2**-24
([0.0, 1.52587890625e-05], 1, 4)
"""
from __future__ import annotations

import contextlib
import math
from contextvars import ContextVar
from dataclasses import dataclass

from ..backend import scratch, xp

__all__ = ["UnderflowCount", "count_gradient_underflow", "note", "in_backward", "active",
           "count_per_tensor", "attributing", "OpRoundings", "op_roundings", "assembled",
           "send"]


@dataclass
class UnderflowCount:
    """``flushed``: gradient values nonzero before rounding and zero after; ``nonzero``:
    gradient values nonzero before rounding; ``values``: all gradient values rounded."""

    flushed: int = 0
    nonzero: int = 0
    values: int = 0

    @property
    def fraction(self) -> float:
        """Of the gradient values that were nonzero, the fraction that became zero."""
        return self.flushed / self.nonzero if self.nonzero else 0.0


_counter: ContextVar[UnderflowCount | None] = ContextVar("fpsim_underflow", default=None)
_backward: ContextVar[bool] = ContextVar("fpsim_in_backward", default=False)
_per_tensor: ContextVar["dict | None"] = ContextVar("fpsim_underflow_per_tensor", default=None)
_pending: ContextVar["OpRoundings | None"] = ContextVar("fpsim_op_roundings", default=None)


@contextlib.contextmanager
def _holding(var: ContextVar, value):
    """``var`` set to ``value`` for the block (yielded), then put back."""
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)


def count_gradient_underflow():
    """Count underflowing gradient values in every backward pass run inside the block."""
    return _holding(_counter, UnderflowCount())


def in_backward():
    return _holding(_backward, True)


def active() -> bool:
    """Whether ``note`` would count now (a counter is set and a backward pass is running)."""
    return (_counter.get() is not None or _per_tensor.get() is not None) and _backward.get()


def note(before: xp.ndarray, after: xp.ndarray) -> None:
    """Count ``after`` = ``before`` rounded elementwise into a format (any rounding maps a
    zero to a zero, so every nonzero ``after`` has a nonzero ``before``: the flushed values
    are the nonzero ``before`` count less the nonzero ``after`` count)."""
    counts, pending = _counter.get(), _pending.get()
    if (counts is None and pending is None) or not _backward.get():
        return
    # comparisons into one reused bool buffer (after has before's shape), then the counts:
    # several times faster than counting a float array's nonzero elements directly, and
    # no fresh pages
    values = math.prod(before.shape)
    mask = xp.reshape(scratch("underflow.nonzero", bool, values), before.shape)
    nonzero_before = _count_nonzero(before, mask)
    flushed = 0 if after is before else nonzero_before - _count_nonzero(after, mask)
    if counts is not None:
        counts.nonzero += nonzero_before
        counts.flushed += flushed
        counts.values += values
    if pending is not None:
        pending.records.append((after, UnderflowCount(flushed, nonzero_before, values)))


# --- per tensor: which gradient each rounding produced ---------------------------------------
# A backward op rounds the gradient it sends to each input (``note``); while ``count_per_tensor``
# is on, the autograd engine collects an op's roundings (``op_roundings``) and ``send`` hands
# each input's share on: the rounding whose result is the gradient sent (the same array or a
# view of it, as a reshape leaves it). A gradient that passes unrounded through an op of one
# input (a cast into a wider format, a reshape) keeps the counts it arrived with, so a
# parameter cast to fp16 for a matmul is charged the matmul's rounding of its gradient.


class OpRoundings:
    """The roundings one op's backward made: ``(result array, counts)`` in order."""

    def __init__(self) -> None:
        self.records: list = []


def count_per_tensor():
    """``with count_per_tensor() as counts:``: backward passes inside also fill ``counts``,
    ``{id(tensor): UnderflowCount}`` for each leaf tensor the gradients reach (``None`` where
    a rounding could not be matched to the gradient it produced: not measured)."""
    return _holding(_per_tensor, {})


def attributing() -> bool:
    """Whether the engine should collect roundings per op now."""
    return _per_tensor.get() is not None and _backward.get()


def op_roundings():
    """Collect the roundings of one op's backward (``note`` appends them)."""
    return _holding(_pending, OpRoundings())


@contextlib.contextmanager
def assembled(result):
    """The roundings made inside the block are parts of ``result``, a gradient an op builds
    from several roundings (a convolution's, band by band): they count as one rounding that
    produced ``result``."""
    pending = _pending.get()
    if pending is None:
        yield
        return
    start = len(pending.records)
    yield
    parts = pending.records[start:]
    del pending.records[start:]
    total = UnderflowCount()
    for _, counts in parts:
        total = _add(total, counts)
    pending.records.append((result, total))


def send(roundings: OpRoundings, arrived, targets, in_flight: dict, single_input: bool) -> None:
    """Charge each target its gradient's rounding. ``arrived``: the counts the op's own
    incoming gradient carried (None: not measured); ``targets``: ``(key, gradient,
    is_leaf)`` per input that receives one; ``single_input``: the op has one input (a
    gradient it passes on unrounded keeps ``arrived``); ``in_flight``: counts by key, summed
    over every gradient a tensor receives (leaves' totals go to ``count_per_tensor``'s
    dict)."""
    leaves = _per_tensor.get()
    unmatched = list(roundings.records)
    shares = [_matching(unmatched, grad) for _, grad, _ in targets]
    for (key, grad, is_leaf), share in zip(targets, shares):
        if share is None and unmatched:
            share = None       # a rounding went into some gradient it did not return as it
            #                    was: any input it did not match may hold it (not measured)
        elif share is None:    # not rounded here: passed on, or exact (nothing flushed)
            share = arrived if single_input else UnderflowCount(
                0, int(xp.count_nonzero(grad)), math.prod(grad.shape))
        book = leaves if is_leaf else in_flight
        book[key] = _add(book.get(key, UnderflowCount()), share)


def _matching(records: list, grad):
    for i, (after, counts) in enumerate(records):
        if after is grad or (xp.shares_memory(after, grad) and
                             math.prod(after.shape) == math.prod(grad.shape)):
            del records[i]
            return counts
    return None


def _add(total, share):
    if total is None or share is None:
        return None
    return UnderflowCount(total.flushed + share.flushed, total.nonzero + share.nonzero,
                          total.values + share.values)


def _count_nonzero(x: xp.ndarray, mask: xp.ndarray) -> int:
    return int(xp.count_nonzero(xp.not_equal(x, 0, out=mask)))
