"""Replay a recorded scaler trace through a reference scaler and find where they part.

The reference (a preset name such as ``"torch"``, a ``DynamicScaler``, or a ``ScalerState``
to start from) is fed the trace's ``found_inf`` decisions one by one; after every update the
trace's recorded values are compared with the reference's, exactly (scales bit for bit, as
Python floats; NaN meets NaN)::

    state = reference.init()
    for recorded in trace.steps:
        compare recorded.scale_before with state.scale
        state = state.update(recorded.found_inf)      # may raise LossScaleMinimumError
        a step that recorded an error: the reference must raise there (and only there)
        else compare scale_after, skipped, and growth_tracker / hysteresis where recorded
        first difference -> Divergence (both sides, side by side); stop

Before a step is fed to the reference, its ``found_inf`` is checked against its own
``grad_stats``: ``found_inf=false`` with ``"nonfinite": n > 0`` means the framework missed an
overflow (and applied inf/NaN gradients unless it skipped): a divergence of kind
``"missed_overflow"``, the worst bug a scaler can have, reported before any scale compares.

A preset name takes the trace header's ``params`` as overrides (the configuration the
framework was given), then ``overrides`` on top; ``use_header_params=False`` ignores them.

>>> from fpsim.conformance.trace import Trace, TraceHeader, TraceStep
>>> steps = (TraceStep(0, False, 65536.0, 65536.0, False),
...          TraceStep(1, True, 65536.0, 16384.0, True))
>>> report = replay(Trace(TraceHeader(source="demo"), steps), "torch")
>>> report.agree, report.divergence.step, report.divergence.fields
(False, 1, ('scale_after',))
"""
from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

from ..scaling import LossScaleMinimumError, ScalerState, preset
from .expect import backoff_conventions
from .trace import Trace, TraceStep, read_trace

__all__ = ["replay", "Report", "Divergence", "reference_state", "COMPARED_FIELDS"]

COMPARED_FIELDS = ("scale_before", "scale_after", "skipped", "growth_tracker", "hysteresis",
                   "error")
_SHOWN = ("found_inf",) + COMPARED_FIELDS
_CONTEXT_STEPS = 3


class Divergence(NamedTuple):
    """The first step where the recording and the reference disagree.

    ``recorded`` and ``expected`` map every shown field to the trace's value and the
    reference's (``None`` where the trace does not record it); ``fields`` names the fields
    that differ; ``reason`` is the reference's own account of its update (its
    ``Decision.reason``, or the error it raised); ``before`` are the last agreeing steps.
    ``kind``: ``"mismatch"`` (the recorded values differ from the reference's) or
    ``"missed_overflow"`` (``found_inf`` is false while the step's own ``grad_stats`` count
    non-finite gradient elements; ``expected`` is then the reference's update with an
    overflow).
    """

    step: int
    line: int | None
    fields: tuple
    recorded: dict
    expected: dict
    reason: str
    before: tuple = ()
    kind: str = "mismatch"


class Report(NamedTuple):
    """The outcome of a comparison: ``agree``, how many steps agreed, and the divergence."""

    agree: bool
    steps_compared: int
    total_steps: int
    reference: str
    source: str
    compared: tuple
    divergence: Divergence | None = None
    note: str = ""
    backoff: str = ""

    def __str__(self) -> str:
        return render(self)


def reference_state(reference, overrides: dict | None = None,
                    header_params: dict | None = None) -> tuple[ScalerState, str]:
    """The starting state and a label for ``reference``: a preset name (header params, then
    ``overrides``, applied), a scaler configuration (``overrides`` applied with
    ``dataclasses.replace``) or a ``ScalerState`` (used as it is)."""
    overrides = dict(overrides or {})
    if isinstance(reference, str):
        params = {**(header_params or {}), **overrides}
        scaler = preset(reference, **params)
        shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
        return scaler.init(), f"preset {scaler.name}" + (f" ({shown})" if shown else "")
    if isinstance(reference, ScalerState):
        if overrides:
            raise ValueError("overrides cannot be applied to a ScalerState; pass the scaler")
        return reference, f"{getattr(reference.scaler, 'name', 'scaler')} from {reference!r}"
    if hasattr(reference, "init") and hasattr(reference, "advance"):
        if overrides:
            if not dataclasses.is_dataclass(reference):
                raise ValueError("overrides need a preset name or a dataclass scaler")
            reference = dataclasses.replace(reference, **overrides)
        return reference.init(), getattr(reference, "name", type(reference).__name__)
    raise TypeError(f"the reference must be a preset name, a scaler (DynamicScaler, "
                    f"StaticScaler, NoScaler) or a ScalerState, got {type(reference).__name__}")


def replay(trace, reference, *, use_header_params: bool = True, **overrides) -> Report:
    """Feed ``trace`` (a ``Trace`` or a path/stream to read one from) through ``reference``
    and report the first step where they disagree (see the module docstring). A trace with
    no steps raises ``ValueError``: nothing compared is not an agreement."""
    if not isinstance(trace, Trace):
        trace = read_trace(trace)
    header_params = trace.header.params if use_header_params else {}
    try:
        state, label = reference_state(reference, overrides, header_params)
    except (TypeError, ValueError) as err:
        origin = " (trace header params included)" if header_params else ""
        raise type(err)(f"cannot build the reference{origin}: {err}") from None
    if not trace.steps:
        raise ValueError(f"the trace{f' from {trace.header.source}' if trace.header.source else ''}"
                         f" has no steps: nothing to compare (an empty comparison is not an "
                         f"agreement)")
    compared = _compared_fields(trace)
    backoff = _backoff_line(trace.header.params, state.scaler)
    history: list[TraceStep] = []
    for index, recorded in enumerate(trace.steps):
        missed = missed_overflow(recorded)
        if missed:
            divergence = _missed_overflow_divergence(state, recorded, trace.line_of(index),
                                                     missed, history)
            return Report(False, index, len(trace.steps), label, trace.header.source,
                          compared, divergence, backoff=backoff)
        expected = {"found_inf": recorded.found_inf, "scale_before": state.scale}
        reason = ""
        try:
            after = state.update(recorded.found_inf)
        except LossScaleMinimumError as err:
            after, reason = None, f"raises LossScaleMinimumError: {err}"
            expected.update(scale_after="raises", skipped="raises", error=reason[7:])
        if after is not None:
            expected.update(scale_after=after.scale, skipped=after.skipped,
                            growth_tracker=after.growth_tracker,
                            hysteresis=after.hysteresis_left,
                            error=None if recorded.error is None else "no error")
            reason = after.decision.reason
        shown = {name: getattr(recorded, name) for name in _SHOWN}
        if recorded.error is not None or after is None:
            # the update raised on one side at least: whether both raised is what compares
            differ = ("scale_before",) if not _same(shown["scale_before"], state.scale) else ()
            if (recorded.error is None) != (after is not None):
                differ += ("error",)
        else:
            differ = tuple(name for name in compared if shown[name] is not None
                           and not _same(shown[name], expected.get(name)))
        if differ:
            divergence = Divergence(index, trace.line_of(index), differ, shown, expected, reason,
                                    tuple(history[-_CONTEXT_STEPS:]))
            return Report(False, index, len(trace.steps), label, trace.header.source,
                          compared, divergence, backoff=backoff)
        history.append(recorded)
        state = after
    return Report(True, len(trace.steps), len(trace.steps), label, trace.header.source,
                  compared)


def _backoff_line(params: dict, scaler) -> str:
    """Both sides' backoff in both conventions (torch and Megatron multiply by 0.5; DeepSpeed,
    apex, Keras and jmp divide by 2.0), for the diverged report where a divisor is involved;
    "" where both sides multiply (torch's convention, the reports as they always were)."""
    factor, op = getattr(scaler, "backoff_factor", None), getattr(scaler, "backoff_op", None)
    if factor is None or op is None:
        return ""
    line, divides = f"reference {backoff_conventions(factor, op)}", op == "divide"
    recorded = params.get("backoff_factor")
    if isinstance(recorded, (int, float)) and not isinstance(recorded, bool) \
            and recorded > 0 and recorded != 1:
        side = backoff_conventions(float(recorded), "multiply" if recorded < 1 else "divide")
        line, divides = f"recorded backoff_factor={recorded!r}: {side}; {line}", \
            divides or recorded > 1
    return line if divides else ""


def missed_overflow(step: TraceStep) -> int:
    """How many non-finite gradient elements a step with ``found_inf=false`` recorded in its
    ``grad_stats`` (0: none, or no ``nonfinite`` count, or the step found its overflow)."""
    if step.found_inf or not step.grad_stats:
        return 0
    count = step.grad_stats.get("nonfinite", 0)
    return int(count) if count > 0 else 0


def _missed_overflow_divergence(state, recorded: TraceStep, line, count: int,
                                history: list) -> Divergence:
    shown = {name: getattr(recorded, name) for name in _SHOWN}
    shown["nonfinite"] = count             # for the headline; the table shows _SHOWN only
    expected = {"found_inf": True, "scale_before": state.scale}
    try:
        after = state.update(True)
        expected.update(scale_after=after.scale, skipped=after.skipped,
                        growth_tracker=after.growth_tracker, hysteresis=after.hysteresis_left)
        decision = after.decision.reason
    except LossScaleMinimumError as err:
        expected.update(scale_after="raises", skipped="raises")
        decision = f"raises LossScaleMinimumError: {err}"
    reason = f"with the overflow the gradients show: {decision}"
    return Divergence(recorded.step, line, ("found_inf",), shown, expected, reason,
                      tuple(history[-_CONTEXT_STEPS:]), kind="missed_overflow")


def _compared_fields(trace: Trace) -> tuple:
    present = set(("scale_before", "scale_after", "skipped"))
    for optional in ("growth_tracker", "hysteresis", "error"):
        if any(getattr(s, optional) is not None for s in trace.steps):
            present.add(optional)
    return tuple(name for name in COMPARED_FIELDS if name in present)


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or isinstance(b, str):
        return type(a) is type(b) and a == b
    if isinstance(a, float) or isinstance(b, float):
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return a == b


def show_value(value) -> str:
    """A value as the report prints it: floats with their exact hex form."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if not math.isfinite(value) else f"{value!r} ({value.hex()})"
    return str(value)


def render(report: Report) -> str:
    """The report as text: one line when they agree, the side-by-side diff when not."""
    source = report.source or "trace"
    if report.agree:
        text = (f"agree: {report.steps_compared} of {report.total_steps} steps match "
                f"{report.reference} (compared: {', '.join(report.compared)})")
        return text + (f"\n{report.note}" if report.note else "")
    d = report.divergence
    where = f" (trace line {d.line})" if d.line is not None else ""
    agreeing = (f"after {report.steps_compared} agreeing "
                f"step{'s' if report.steps_compared != 1 else ''}")
    headline = f"DIVERGED at step {d.step}{where}, {agreeing}"
    if d.kind == "missed_overflow":
        count = d.recorded["nonfinite"]
        applied = "the step was skipped" if d.recorded["skipped"] else "the step applied them"
        headline = (f"MISSED OVERFLOW at step {d.step}{where}, {agreeing}: found_inf=false "
                    f"but grad_stats counts {count} non-finite gradient element"
                    f"{'s' if count != 1 else ''}; {applied}")
    lines = [headline,
             f"  recorded:  {source}", f"  reference: {report.reference}"]
    if report.backoff:
        lines.append(f"  backoff:   {report.backoff}")
    lines.append("")
    rows = [("field", "recorded", "reference", "")]
    for name in _SHOWN:
        if name == "error" and d.recorded.get(name) is None and d.expected.get(name) is None:
            continue               # neither side raised: the row would say nothing
        mark = "<- differs" if name in d.fields else ""
        rows.append((name, show_value(d.recorded.get(name)), show_value(d.expected.get(name)),
                     mark))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[3])
    lines[-len(rows):] = [line.rstrip() for line in lines[-len(rows):]]
    lines += ["", f"  reference's decision: {d.reason}"]
    if d.before:
        lines.append("  steps before (agreeing):")
        for s in d.before:
            lines.append(f"    step {s.step}: found_inf={show_value(s.found_inf)}, scale "
                         f"{s.scale_before!r} -> {s.scale_after!r}, skipped="
                         f"{show_value(s.skipped)}"
                         + (f", growth_tracker={s.growth_tracker}"
                            if s.growth_tracker is not None else ""))
    if report.note:
        lines.append(report.note)
    return "\n".join(lines)

