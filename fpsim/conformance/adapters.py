"""Drive any loss scaler through overflow patterns and compare it with a reference.

A scaler joins through an *adapter*: any object with

``update(found_inf: bool) -> float``
    one step of the scaler told whether the step's gradients overflowed; returns the scale
    after the update (the scale the next step will use).

and, optionally,

``scale`` (attribute or property) or ``get_scale()``
    the current scale, read once before the first update (otherwise step 0's
    ``scale_before`` is taken from the reference and is not checked);
``params`` (attribute)
    the scaler's configuration in ``DynamicScaler`` field names, written to the trace header
    (a replay through a preset then applies it);
``state() -> Mapping``
    read after every update; any of ``"growth_tracker"`` (clean steps counted toward the
    next growth, in fpsim's convention: 0 after an overflow or a growth, DeepSpeed's
    -1 start included), ``"hysteresis"`` (overflows still absorbed before a backoff) and
    ``"skipped"`` (whether the framework skipped the optimizer step). Fields it gives are
    compared; a scaler that reports no skips is taken to skip exactly its overflowing steps.

``record(adapter, found_infs)`` runs the pattern and returns a ``Trace``; ``compare(adapter,
found_infs, reference, **overrides)`` records and replays it through the reference and
returns the ``Report`` (``report.agree``; ``str(report)`` the side-by-side diff)::

    for step, found in enumerate(found_infs):
        before = previous scale_after (or the adapter's scale)
        after = adapter.update(found)
        write TraceStep(step, found, before, after, skipped, **adapter.state())
    replay(trace, reference)

``ReferenceAdapter`` turns an fpsim scaler into an adapter (to compare two presets, or to
check the machinery itself).

>>> report = compare(ReferenceAdapter("apex"), [False] * 2000, "torch")
>>> report.agree, report.steps_compared
(True, 2000)
>>> compare(ReferenceAdapter("keras3"), [False], "torch").divergence.fields
('scale_before', 'scale_after')
"""
from __future__ import annotations

import numbers
from typing import Any, Iterable, Mapping, Protocol, runtime_checkable

import numpy as np

from ..scaling import LossScaleMinimumError
from .replay import Divergence, Report, reference_state, replay
from .trace import Trace, TraceHeader, TraceStep

__all__ = ["ScalerAdapter", "ReferenceAdapter", "record", "compare", "AdapterError"]

STATE_KEYS = ("growth_tracker", "hysteresis", "skipped")


@runtime_checkable
class ScalerAdapter(Protocol):
    """The one required method of an adapter (see the module docstring for the optional
    ``scale`` and ``state()``)."""

    def update(self, found_inf: bool) -> float: ...


class AdapterError(RuntimeError):
    """The adapter broke the protocol (a non-number scale, an unknown state key) or raised."""


class ReferenceAdapter:
    """An fpsim scaler behind the adapter protocol: ``ReferenceAdapter("torch",
    growth_interval=4)`` or ``ReferenceAdapter(DynamicScaler(...))``."""

    def __init__(self, reference, **overrides) -> None:
        self._state, self.name = reference_state(reference, overrides)

    @property
    def scale(self) -> float:
        return self._state.scale

    def update(self, found_inf: bool) -> float:
        self._state = self._state.update(bool(found_inf))
        return self._state.scale

    def state(self) -> dict:
        return {"growth_tracker": self._state.growth_tracker,
                "hysteresis": self._state.hysteresis_left, "skipped": self._state.skipped}


def _current_scale(adapter) -> float | None:
    value = None
    if hasattr(adapter, "state"):
        value = dict(adapter.state()).get("scale")
    if value is None and hasattr(adapter, "scale"):
        value = adapter.scale
    if value is None and hasattr(adapter, "get_scale"):
        value = adapter.get_scale()
    return None if value is None else _as_scale(value, "the adapter's current scale")


def _as_scale(value, what: str) -> float:
    try:
        if isinstance(value, bool):
            raise TypeError
        if isinstance(value, numbers.Real):
            return float(value)
        array = np.asarray(value)          # a 0-d array or tensor-like with __array__
        if array.shape == () and array.dtype.kind in "fiu":
            return float(array)
    except (TypeError, ValueError):
        pass
    raise AdapterError(f"{what} must be a real number, got {type(value).__name__} {value!r}")


def record(adapter, found_infs: Iterable, *, source: str | None = None,
           initial_scale: float | None = None, errors: str = "raise") -> Trace:
    """Run ``adapter`` through ``found_infs`` and return the trace of what it did.

    ``initial_scale`` stands in for step 0's ``scale_before`` when the adapter cannot tell
    its scale. An exception from the adapter's ``update`` is re-raised as ``AdapterError``
    naming the step; with ``errors="record"`` it ends the trace instead, as a last step with
    ``error="Type: message"`` (the framework stopped there, as DeepSpeed does at its minimum
    scale; a replay agrees where the reference raises at that step too).
    """
    if errors not in ("raise", "record"):
        raise ValueError(f"errors must be 'raise' or 'record', got {errors!r}")
    if not callable(getattr(adapter, "update", None)):
        raise TypeError(f"an adapter needs an update(found_inf) -> scale method; "
                        f"{type(adapter).__name__} has none")
    before = _current_scale(adapter)
    if before is None:
        before = initial_scale
    if before is None:
        raise AdapterError("the adapter does not tell its scale (no scale, get_scale() or "
                           "state()['scale']); pass initial_scale=")
    has_state = callable(getattr(adapter, "state", None))
    steps = []
    for index, flag in enumerate(found_infs):
        flag = bool(flag)
        try:
            result = adapter.update(flag)
        except Exception as err:  # noqa: BLE001 - reported with the step it happened at
            if errors == "record":
                steps.append(TraceStep(index, flag, before, before, True,
                                       error=f"{type(err).__name__}: {err}"))
                break
            raise AdapterError(f"the adapter raised {type(err).__name__} at step {index} "
                               f"(found_inf={flag}): {err}") from err
        after = _as_scale(result, f"update() at step {index}")
        extra: dict[str, Any] = {}
        if has_state:
            reported = adapter.state()
            if not isinstance(reported, Mapping):
                raise AdapterError(f"state() must return a mapping, got "
                                   f"{type(reported).__name__}")
            unknown = set(reported) - set(STATE_KEYS) - {"scale"}
            if unknown:
                raise AdapterError(f"state() gave unknown key(s) {sorted(unknown)}; known: "
                                   f"scale, {', '.join(STATE_KEYS)}")
            extra = {k: reported[k] for k in STATE_KEYS if reported.get(k) is not None}
        skipped = bool(extra.pop("skipped", flag))
        steps.append(TraceStep(index, flag, before, after, skipped,
                               growth_tracker=_int_or_none(extra.get("growth_tracker")),
                               hysteresis=_int_or_none(extra.get("hysteresis"))))
        before = after
    name = source or getattr(adapter, "name", None) or type(adapter).__name__
    params = dict(getattr(adapter, "params", None) or {})
    return Trace(TraceHeader(source=str(name), params=params), tuple(steps), ())


def _int_or_none(value):
    if value is None:
        return None
    return int(np.asarray(value).item())


def compare(adapter, found_infs, reference, **overrides) -> Report:
    """Record ``adapter`` on ``found_infs`` and replay the trace through ``reference`` (a
    preset name with ``overrides``, or a scaler); the first divergence, if any, is in the
    returned ``Report``.

    When the reference raises ``LossScaleMinimumError`` (DeepSpeed at its minimum) the run
    stops there; the adapter agrees if it raises at the same step too. Where only the adapter
    raises, the report diverges at that step: its ``error`` against the reference's none.
    """
    flags = [bool(f) for f in found_infs]
    start, _ = reference_state(reference, overrides)
    stop, state = len(flags), start
    for index, flag in enumerate(flags):
        try:
            state = state.update(flag)
        except LossScaleMinimumError:
            stop = index
            break
    # a raise of the adapter alone ends its trace as an error step: a divergence, not a crash
    trace = record(adapter, flags[:stop], initial_scale=start.scale, errors="record")
    report = replay(trace, reference, **overrides)
    if not report.agree or stop == len(flags):
        return report
    try:
        adapter.update(flags[stop])
    except Exception as err:  # noqa: BLE001 - the framework's own stop is the expected outcome
        return report._replace(note=f"both stopped at step {stop}: the reference raises "
                                    f"LossScaleMinimumError, the adapter raised "
                                    f"{type(err).__name__}: {err}")
    last = trace.steps[-1].scale_after if trace.steps else start.scale
    divergence = Divergence(
        stop, None, ("scale_after",),
        {"found_inf": flags[stop], "scale_before": last, "scale_after": "no error"},
        {"found_inf": flags[stop], "scale_before": last, "scale_after": "raises",
         "skipped": "raises"},
        "raises LossScaleMinimumError (the scale is at its minimum)", trace.steps[-3:])
    return report._replace(agree=False, divergence=divergence)
