"""Counting gradients that underflow: values nonzero before their rounding into a format and
zero after it, during ``backward``.

The counts are observers (``fpsim.exact.observers``): ``count_gradient_underflow()`` attaches
a ``GradientUnderflow`` for the block, ``count_per_tensor()`` a ``PerTensorUnderflow``; every
rounding of a gradient reports to the registry (``observers.rounded``), which hands it to
them. Outside such a block, or outside backward, nothing is counted. The counts live in this
layer so that the roundings below ``autograd`` can report to them.

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
from dataclasses import dataclass

from ..backend import scratch, xp
from .observers import Rounding, attached, observing

__all__ = ["UnderflowCount", "count_gradient_underflow", "GradientUnderflow", "counts_of",
           "count_per_tensor", "PerTensorUnderflow", "attribution", "OpRoundings",
           "assembled"]


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


def counts_of(rounding: Rounding) -> UnderflowCount:
    """One rounding's counts, measured once (kept on the rounding for its other observers).
    Any rounding maps a zero to a zero, so every nonzero ``after`` has a nonzero ``before``:
    the flushed values are the nonzero ``before`` count less the nonzero ``after`` count."""
    if rounding.counts is None:
        before, after = rounding.before, rounding.after
        # comparisons into one reused bool buffer (after has before's shape), then the
        # counts: several times faster than counting a float array's nonzero elements
        # directly, and no fresh pages
        values = math.prod(before.shape)
        mask = xp.reshape(scratch("underflow.nonzero", bool, values), before.shape)
        nonzero = _count_nonzero(before, mask)
        flushed = 0 if after is before else nonzero - _count_nonzero(after, mask)
        rounding.counts = UnderflowCount(flushed, nonzero, values)
    return rounding.counts


class GradientUnderflow:
    """Observer: the counts of every gradient rounding, added up in ``counts``."""

    def __init__(self) -> None:
        self.counts = UnderflowCount()

    def rounded(self, rounding: Rounding) -> None:
        counts = counts_of(rounding)
        self.counts.nonzero += counts.nonzero
        self.counts.flushed += counts.flushed
        self.counts.values += counts.values


@contextlib.contextmanager
def count_gradient_underflow():
    """Count underflowing gradient values in every backward pass run inside the block:
    ``with count_gradient_underflow() as counts:`` (an ``UnderflowCount``)."""
    with observing(GradientUnderflow()) as observer:
        yield observer.counts


# --- per tensor: which gradient each rounding produced ---------------------------------------
# A backward op rounds the gradient it sends to each input (and reports the rounding); while
# ``count_per_tensor`` is on, the engine collects an op's roundings (``op_roundings``) and
# ``send`` hands each input's share on: the rounding whose result is the gradient sent (the
# same array or a view of it, as a reshape leaves it). A gradient that passes unrounded
# through an op of one input (a cast into a wider format, a reshape) keeps the counts it
# arrived with, so a parameter cast to fp16 for a matmul is charged the matmul's rounding of
# its gradient.


class OpRoundings:
    """The roundings one op's backward made: ``(result array, counts)`` in order."""

    def __init__(self) -> None:
        self.records: list = []


class PerTensorUnderflow:
    """Observer: the counts of each leaf tensor's gradient, ``leaves`` (``{id(tensor):
    UnderflowCount}``). While the engine runs one op's backward (``op_roundings``), each
    rounding is kept with the array it produced; ``send`` then charges each input's
    gradient the rounding that produced it."""

    def __init__(self) -> None:
        self.leaves: dict = {}
        self.pending: OpRoundings | None = None

    def rounded(self, rounding: Rounding) -> None:
        if self.pending is not None:
            self.pending.records.append((rounding.after, counts_of(rounding)))

    @contextlib.contextmanager
    def op_roundings(self):
        """Collect the roundings of one op's backward (yielded, an ``OpRoundings``)."""
        outer, self.pending = self.pending, OpRoundings()
        try:
            yield self.pending
        finally:
            self.pending = outer

    def send(self, roundings: OpRoundings, arrived, targets, in_flight: dict,
             single_input: bool) -> None:
        """Charge each target its gradient's rounding. ``arrived``: the counts the op's own
        incoming gradient carried (None: not measured); ``targets``: ``(key, gradient,
        is_leaf)`` per input that receives one; ``single_input``: the op has one input (a
        gradient it passes on unrounded keeps ``arrived``); ``in_flight``: counts by key,
        summed over every gradient a tensor receives (leaves' totals go to ``leaves``)."""
        unmatched = list(roundings.records)
        shares = [_matching(unmatched, grad) for _, grad, _ in targets]
        for (key, grad, is_leaf), share in zip(targets, shares):
            if share is None and unmatched:
                share = None       # a rounding went into some gradient it did not return as
                #                    it was: any input it did not match may hold it (unmeasured)
            elif share is None:    # not rounded here: passed on, or exact (nothing flushed)
                share = arrived if single_input else UnderflowCount(
                    0, int(xp.count_nonzero(grad)), math.prod(grad.shape))
            book = self.leaves if is_leaf else in_flight
            book[key] = _add(book.get(key, UnderflowCount()), share)


@contextlib.contextmanager
def count_per_tensor():
    """``with count_per_tensor() as counts:``: backward passes inside also fill ``counts``,
    ``{id(tensor): UnderflowCount}`` for each leaf tensor the gradients reach (``None`` where
    a rounding could not be matched to the gradient it produced: not measured)."""
    with observing(PerTensorUnderflow()) as observer:
        yield observer.leaves


def attribution() -> PerTensorUnderflow | None:
    """The per-tensor observer the engine charges gradients to now (the innermost attached),
    or None: then the engine need not collect roundings per op."""
    found = attached(PerTensorUnderflow)
    return found[-1] if found else None


@contextlib.contextmanager
def assembled(result):
    """The roundings made inside the block are parts of ``result``, a gradient an op builds
    from several roundings (a convolution's, band by band): they count as one rounding that
    produced ``result``."""
    observer = attribution()
    pending = None if observer is None else observer.pending
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
