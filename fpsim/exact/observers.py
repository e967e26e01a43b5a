"""Who is watching the engine's arithmetic: the one registry of observers.

Counters that watch a run (the gradient-underflow counts, the per-tensor attribution, the
exact model's product counts) are *observers*: plain objects attached for a block with
``with observing(observer):``. The engine reports facts to the registry, which hands them to
the observers attached now; nothing else in the engine keeps state about who is watching.

Facts reported:

- ``rounded(before, after)``: ``after`` = ``before`` rounded elementwise into a format. Every
  rounding the engine makes of a gradient reports (``autograd.numerics.round_array``, the
  accumulation models' output rounding and the fast path's). Only roundings made during a
  backward pass are gradients' (``Tensor.backward`` marks the pass with ``backward_pass()``),
  so only they reach observers, as a ``Rounding``, through their ``rounded(rounding)``
  method. Outside a backward pass, or with no such observer attached, a report costs one
  read of the registry.
- Anything else an observer kind defines for itself: its reporters look for attached
  observers of their kind with ``attached(kind)`` (``product_count``'s counts do).

The registry is one context variable holding an immutable snapshot (the observers attached,
whether a backward pass runs, and the ``rounded`` methods to call): per thread (a sweep runs
cells in threads, each with its own observers; a new thread starts with none attached) and
restored exactly when a block ends, however it ends.

>>> class Seen:
...     def __init__(self):
...         self.values = 0
...     def rounded(self, rounding):
...         self.values += rounding.before.size
>>> import numpy as np
>>> with observing(Seen()) as seen:
...     rounded(np.ones(3), np.ones(3, np.float32))          # not in a backward pass
...     with backward_pass():
...         rounded(np.ones(4), np.ones(4, np.float32))
>>> seen.values, attached(Seen)
(4, ())
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Any

__all__ = ["Rounding", "observing", "backward_pass", "attached", "gradients_observed",
           "rounded"]


class Rounding:
    """One rounding's facts: ``before`` (a float32 or float64 array) rounded elementwise into
    ``after``. ``counts`` is free for the underflow observers to keep the counts they measure
    (``underflow.counts_of``), so that several observers of one rounding measure it once."""

    __slots__ = ("before", "after", "counts")

    def __init__(self, before, after) -> None:
        self.before, self.after = before, after
        # an underflow.UnderflowCount once measured (underflow.py imports this module)
        self.counts: Any = None


class _Snapshot:
    """What the registry holds: the observers attached (innermost last), whether a backward
    pass runs, and the ``rounded`` methods that gradient roundings go to now."""

    __slots__ = ("observers", "backward", "gradient_reports")

    def __init__(self, observers: tuple, backward: bool) -> None:
        self.observers, self.backward = observers, backward
        self.gradient_reports = tuple(
            o.rounded for o in observers if hasattr(o, "rounded")) if backward else ()


# A snapshot is never changed in place (each change sets a new one): safe as the default.
_registry: ContextVar[_Snapshot] = ContextVar(
    "fpsim_observers", default=_Snapshot((), False))  # noqa: B039


@contextlib.contextmanager
def _holding(snapshot: _Snapshot):
    token = _registry.set(snapshot)
    try:
        yield
    finally:
        _registry.reset(token)


@contextlib.contextmanager
def observing(observer):
    """Attach ``observer`` for the block (yielded): it receives the facts reported inside."""
    now = _registry.get()
    with _holding(_Snapshot(now.observers + (observer,), now.backward)):
        yield observer


def backward_pass():
    """Mark the block as a backward pass: the roundings inside are gradients'."""
    now = _registry.get()
    return _holding(_Snapshot(now.observers, True))


def attached(kind) -> tuple:
    """The observers of class ``kind`` attached now, outermost first."""
    return tuple(o for o in _registry.get().observers if isinstance(o, kind))


def gradients_observed() -> bool:
    """Whether a gradient rounding reported now would reach an observer (fast paths that do
    not report their roundings step aside while it does)."""
    return bool(_registry.get().gradient_reports)


def rounded(before, after) -> None:
    """Report that ``after`` is ``before`` rounded elementwise into a format."""
    reports = _registry.get().gradient_reports
    if reports:
        rounding = Rounding(before, after)
        for report in reports:
            report(rounding)
