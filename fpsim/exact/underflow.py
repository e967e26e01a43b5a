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

__all__ = ["UnderflowCount", "count_gradient_underflow", "note", "in_backward", "active"]


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


@contextlib.contextmanager
def count_gradient_underflow():
    """Count underflowing gradient values in every backward pass run inside the block."""
    counts = UnderflowCount()
    token = _counter.set(counts)
    try:
        yield counts
    finally:
        _counter.reset(token)


@contextlib.contextmanager
def in_backward():
    token = _backward.set(True)
    try:
        yield
    finally:
        _backward.reset(token)


def active() -> bool:
    """Whether ``note`` would count now (a counter is set and a backward pass is running)."""
    return _counter.get() is not None and _backward.get()


def note(before: xp.ndarray, after: xp.ndarray) -> None:
    """Count ``after`` = ``before`` rounded elementwise into a format (any rounding maps a
    zero to a zero, so every nonzero ``after`` has a nonzero ``before``: the flushed values
    are the nonzero ``before`` count less the nonzero ``after`` count)."""
    counts = _counter.get()
    if counts is None or not _backward.get():
        return
    # comparisons into one reused bool buffer (after has before's shape), then the counts:
    # several times faster than counting a float array's nonzero elements directly, and
    # no fresh pages
    values = math.prod(before.shape)
    mask = xp.reshape(scratch("underflow.nonzero", bool, values), before.shape)
    nonzero_before = _count_nonzero(before, mask)
    counts.nonzero += nonzero_before
    if after is not before:
        counts.flushed += nonzero_before - _count_nonzero(after, mask)
    counts.values += values


def _count_nonzero(x: xp.ndarray, mask: xp.ndarray) -> int:
    return int(xp.count_nonzero(xp.not_equal(x, 0, out=mask)))
