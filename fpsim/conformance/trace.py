"""The scaler trace: what a framework's loss scaler did, step by step, as JSON Lines.

Format ``fpsim-scaler-trace``, version 2 (version 1, the same without ``error``, is read as
well). UTF-8 text, one JSON object per line. The first line is the header; every further
non-blank line is one step, in order, numbered from 0::

    {"format": "fpsim-scaler-trace", "version": 2, "source": "torch 2.13.0 GradScaler('cpu')",
     "params": {"init_scale": 65536.0, "growth_interval": 2000}}
    {"step": 0, "found_inf": false, "scale_before": 65536.0, "scale_after": 65536.0,
     "skipped": false, "growth_tracker": 1}
    {"step": 1, "found_inf": true, "scale_before": 65536.0, "scale_after": 32768.0,
     "skipped": true, "growth_tracker": 0, "grad_stats": {"count": 4, "nonfinite": 1}}

Header fields: ``format`` and ``version`` (required, exactly as above); ``source`` (optional
text: which framework and version produced the trace); ``params`` (optional object: the
scaler's configuration in ``fpsim.scaling.DynamicScaler`` field names -- ``init_scale``,
``growth_factor``, ``backoff_factor``, ``growth_interval``, ... -- which a replay applies as
overrides of the preset unless told not to).

Step fields:

=================  ========  ==============================================================
field              required  meaning
=================  ========  ==============================================================
step               yes       the update's index: 0, 1, 2, ... without gaps
found_inf          yes       true/false: the framework's overflow decision for this step
scale_before       yes       the loss scale the step used (exact value)
scale_after        yes       the scale after the update (exact value); it must equal the next
                             step's ``scale_before``
skipped            yes       true/false: whether the optimizer step was skipped
growth_tracker     no        the framework's clean-step counter after the update
hysteresis         no        overflows still absorbed before a backoff, after the update
grad_stats         no        object of numbers: ``count`` (gradient elements), ``nonfinite``
                             (how many were inf/NaN; a step with ``found_inf`` false and
                             ``nonfinite`` > 0 replays as a missed overflow), ``max_abs``
                             (largest finite magnitude), ``l2_norm`` (norm of the finite
                             values); others are allowed
error              no (v2)   ``"ExceptionType: message"``: the framework's update raised
                             (DeepSpeed at its minimum scale); the run stopped there, so it is
                             the last step, and its other fields are what the trace saw before
                             the update (a replay compares only whether the reference raises)
=================  ========  ==============================================================

Numbers are JSON numbers written with Python's ``repr`` (which round-trips every float64, so
every float32 scale too); JSON has no inf or NaN, so those are the strings ``"inf"``,
``"-inf"`` and ``"nan"``. A hexadecimal float string (``"0x1p+16"``) is accepted as well.
Unknown fields are errors, so a misspelt ``found_Inf`` is caught, not ignored.

``read_trace`` validates everything and raises ``TraceFormatError`` naming the line and the
field that is wrong; ``TraceWriter`` writes a trace and flushes every line, so an interrupted
run leaves a readable trace up to its last step.

>>> import io
>>> out = io.StringIO()
>>> with TraceWriter(out, source="example") as w:
...     w.write(TraceStep(0, found_inf=True, scale_before=4.0, scale_after=2.0, skipped=True))
>>> read_trace(io.StringIO(out.getvalue())).steps[0].scale_after
2.0
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import IO, Iterable, NamedTuple

from ..train.trace import strict_json

__all__ = ["TraceStep", "TraceHeader", "Trace", "TraceWriter", "TraceFormatError",
           "read_trace", "write_trace", "TRACE_FORMAT", "TRACE_VERSION", "READ_VERSIONS"]

TRACE_FORMAT = "fpsim-scaler-trace"
TRACE_VERSION = 2
READ_VERSIONS = (1, 2)     # version 1: no "error" field

REQUIRED = ("step", "found_inf", "scale_before", "scale_after", "skipped")
OPTIONAL = ("growth_tracker", "hysteresis", "grad_stats", "error")
HEADER_FIELDS = ("format", "version", "source", "params")


class TraceFormatError(ValueError):
    """A trace that does not follow the format; ``line`` (1-based) and ``field`` say where."""

    def __init__(self, where: str, line: int, field: str | None, problem: str) -> None:
        self.line, self.field = line, field
        at = f"{where} line {line}" + (f", field {field!r}" if field else "")
        super().__init__(f"{at}: {problem}")


class TraceHeader(NamedTuple):
    """The first line: which framework wrote the trace and with what configuration."""

    source: str = ""
    params: dict = {}
    version: int = TRACE_VERSION


class TraceStep(NamedTuple):
    """One update of the framework's scaler (see the module docstring for each field)."""

    step: int
    found_inf: bool
    scale_before: float
    scale_after: float
    skipped: bool
    growth_tracker: int | None = None
    hysteresis: int | None = None
    grad_stats: dict | None = None
    error: str | None = None

    def as_json(self) -> dict:
        row = {"step": self.step, "found_inf": self.found_inf,
               "scale_before": _number_out(self.scale_before),
               "scale_after": _number_out(self.scale_after), "skipped": self.skipped}
        for name in ("growth_tracker", "hysteresis"):
            if getattr(self, name) is not None:
                row[name] = getattr(self, name)
        if self.grad_stats is not None:
            row["grad_stats"] = {k: _number_out(v) for k, v in self.grad_stats.items()}
        if self.error is not None:
            row["error"] = self.error
        return row


class Trace(NamedTuple):
    """A whole trace: the header and the steps; ``lines[i]`` is the file line of step i."""

    header: TraceHeader
    steps: tuple
    lines: tuple = ()

    @property
    def found_infs(self) -> list[bool]:
        return [s.found_inf for s in self.steps]

    def line_of(self, index: int) -> int | None:
        """The file line of step ``index``; None for a trace that was not read from a file."""
        return self.lines[index] if index < len(self.lines) else None


def _number_out(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        value = float(value)
    if isinstance(value, int):
        return value
    return value if math.isfinite(value) else repr(float(value))


class TraceWriter:
    """Writes a trace to a path or text stream: the header at once, then one line per
    ``write(step)``, flushed. Steps must come numbered 0, 1, 2, ..."""

    def __init__(self, target: "str | os.PathLike | IO[str]", *, source: str = "",
                 params: dict | None = None) -> None:
        if not isinstance(source, str):
            raise TypeError(f"source must be a str, got {type(source).__name__}")
        params = dict(params or {})
        for key, value in params.items():
            _check_param(key, value, lambda problem, k=key: TypeError(
                f"params[{k!r}]: {problem}"))
        if isinstance(target, (str, os.PathLike)):
            self._stream: IO[str] = open(Path(target), "w", encoding="utf-8")
            self._owned = True
        else:
            self._stream, self._owned = target, False
        self._next, self._ended = 0, False
        header = {"format": TRACE_FORMAT, "version": TRACE_VERSION, "source": source,
                  "params": {k: _number_out(v) if isinstance(v, float) else v
                             for k, v in params.items()}}
        self._emit(header)

    def _emit(self, row: dict) -> None:
        self._stream.write(json.dumps(row) + "\n")
        self._stream.flush()

    def write(self, step: TraceStep) -> None:
        if not isinstance(step, TraceStep):
            raise TypeError(f"write takes a TraceStep, got {type(step).__name__}")
        if step.step != self._next:
            raise ValueError(f"steps are written in order from 0: expected step {self._next}, "
                             f"got {step.step}")
        if self._ended:
            raise ValueError(f"step {step.step - 1} recorded an error, which ends the run: no "
                             f"step follows it")
        if step.error is not None and (not isinstance(step.error, str) or not step.error):
            raise TypeError(f"error must be a non-empty str ('Type: message'), got "
                            f"{step.error!r}")
        self._emit(step.as_json())
        self._next += 1
        self._ended = step.error is not None

    def close(self) -> None:
        if self._owned and not self._stream.closed:
            self._stream.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_trace(target, steps: "Trace | Iterable[TraceStep]", *, source: str = "",
                params: dict | None = None) -> None:
    """Write a whole trace (header and ``steps``) to a path or text stream. ``steps`` may be
    a ``Trace`` (what ``record`` and ``read_trace`` return): its header's source and params
    are written unless ``source``/``params`` are given."""
    if isinstance(steps, Trace):
        source = source or steps.header.source
        params = steps.header.params if params is None else params
        steps = steps.steps
    with TraceWriter(target, source=source, params=params) as writer:
        for step in steps:
            writer.write(step)


def read_trace(source: "str | os.PathLike | IO[str]") -> Trace:
    """Read and validate a trace from a path or text stream; ``TraceFormatError`` (a
    ``ValueError``) names the first line and field that break the format."""
    if isinstance(source, (str, os.PathLike)):
        where = str(source)
        try:
            with open(Path(source), encoding="utf-8") as stream:
                text = stream.read()
        except FileNotFoundError:
            raise FileNotFoundError(f"trace file {where!r} does not exist") from None
        except UnicodeDecodeError as err:
            raise TraceFormatError(where, 1, None, f"not UTF-8 text ({err.reason})") from None
    else:
        where, text = getattr(source, "name", "<trace>"), source.read()
    header = None
    steps: list = []
    lines: list = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            row = strict_json(raw)
        except json.JSONDecodeError as err:
            raise TraceFormatError(where, number, None,
                                   f"not valid JSON ({err.msg} at column {err.colno})") from None
        except ValueError as err:       # 1e999, NaN literals, 5000-digit integers, deep nesting
            raise TraceFormatError(where, number, None, str(err)[:120]) from None
        if not isinstance(row, dict):
            raise TraceFormatError(where, number, None,
                                   f"each line must be a JSON object, got {type(row).__name__}")
        if header is None:
            header = _parse_header(row, where, number)
            continue
        if steps and steps[-1].error is not None:
            raise TraceFormatError(where, number, None,
                                   f"step {steps[-1].step} (line {lines[-1]}) recorded an error, "
                                   f"which ends the run: no step may follow it")
        step = _parse_step(row, where, number, len(steps), header.version)
        if steps and step.scale_before != steps[-1].scale_after and not (
                math.isnan(step.scale_before) and math.isnan(steps[-1].scale_after)):
            raise TraceFormatError(
                where, number, "scale_before",
                f"{step.scale_before!r} is not the previous step's scale_after "
                f"{steps[-1].scale_after!r} (line {lines[-1]}); a trace is one unbroken run")
        steps.append(step)
        lines.append(number)
    if header is None:
        raise TraceFormatError(where, 1, None, f"empty trace: the first line must be the header "
                               f'{{"format": "{TRACE_FORMAT}", "version": {TRACE_VERSION}}}')
    return Trace(header, tuple(steps), tuple(lines))


def _parse_header(row: dict, where: str, number: int) -> TraceHeader:
    if row.get("format") != TRACE_FORMAT:
        if "step" in row:
            problem = "missing header: the first line must be the header, not a step"
        else:
            problem = f"must be {TRACE_FORMAT!r}, got {row.get('format')!r}"
        raise TraceFormatError(where, number, "format", problem)
    version = row.get("version")
    if version not in READ_VERSIONS or isinstance(version, bool):
        raise TraceFormatError(where, number, "version",
                               f"this reader knows versions {', '.join(map(str, READ_VERSIONS))}, "
                               f"got {version!r}")
    for key in row:
        if key not in HEADER_FIELDS:
            raise TraceFormatError(where, number, key, f"unknown header field; known: "
                                   f"{', '.join(HEADER_FIELDS)}")
    source = row.get("source", "")
    if not isinstance(source, str):
        raise TraceFormatError(where, number, "source", f"must be a string, got {source!r}")
    params = row.get("params", {})
    if not isinstance(params, dict):
        raise TraceFormatError(where, number, "params", f"must be an object, got {params!r}")
    parsed = {}
    for key, value in params.items():
        if isinstance(value, str) and key not in _STRING_PARAMS:
            value = _number_in(value, where, number, f"params.{key}")
        _check_param(key, value, lambda problem, k=key: TraceFormatError(
            where, number, f"params.{k}", problem))
        parsed[key] = value
    return TraceHeader(source=source, params=parsed, version=version)


_STRING_PARAMS = ("precision", "backoff_op", "growth_compare", "hysteresis_refill",
                  "overflow_check", "unscale_op", "name", "source")


def _check_param(key, value, error) -> None:
    if not isinstance(key, str) or not key:
        raise error("parameter names must be non-empty strings")
    if value is not None and not isinstance(value, (bool, int, float, str)):
        raise error(f"must be a number, bool, string or null, got {value!r}")


def _parse_step(row: dict, where: str, number: int, index: int, version: int) -> TraceStep:
    known = REQUIRED + (OPTIONAL if version >= 2 else OPTIONAL[:-1])
    for key in row:
        if key not in known:
            raise TraceFormatError(where, number, key, f"unknown step field in version "
                                   f"{version}; known: {', '.join(known)}")
    for key in REQUIRED:
        if key not in row:
            raise TraceFormatError(where, number, key, "required field is missing")
    step = _integer(row["step"], where, number, "step")
    if step != index:
        raise TraceFormatError(where, number, "step",
                               f"expected {index} (steps count from 0 without gaps), got {step}")
    flags = {}
    for key in ("found_inf", "skipped"):
        if not isinstance(row[key], bool):
            raise TraceFormatError(where, number, key, f"must be true or false, got "
                                   f"{row[key]!r}")
        flags[key] = row[key]
    scales = {key: _number_in(row[key], where, number, key)
              for key in ("scale_before", "scale_after")}
    extra = {}
    for key in ("growth_tracker", "hysteresis"):
        if key in row and row[key] is not None:
            extra[key] = _integer(row[key], where, number, key)
    stats = row.get("grad_stats")
    if stats is not None:
        if not isinstance(stats, dict):
            raise TraceFormatError(where, number, "grad_stats",
                                   f"must be an object of numbers, got {stats!r}")
        stats = {k: _number_in(v, where, number, f"grad_stats.{k}") for k, v in stats.items()}
        _check_counts(stats, where, number)
    error = row.get("error")
    if error is not None and (not isinstance(error, str) or not error.strip()):
        raise TraceFormatError(where, number, "error", f"must be a non-empty string "
                               f"('ExceptionType: message'), got {error!r}")
    return TraceStep(step, flags["found_inf"], scales["scale_before"], scales["scale_after"],
                     flags["skipped"], grad_stats=stats, error=error, **extra)


def _check_counts(stats: dict, where, number) -> None:
    """``count`` and ``nonfinite`` are element counts (a replay checks ``found_inf`` against
    ``nonfinite``): whole numbers >= 0, ``nonfinite`` at most ``count``."""
    for key in ("count", "nonfinite"):
        value = stats.get(key)
        if value is not None and not (value >= 0 and float(value).is_integer()):
            raise TraceFormatError(where, number, f"grad_stats.{key}",
                                   f"must be a whole number >= 0 (elements), got {value!r}")
    if stats.get("nonfinite", 0) > stats.get("count", math.inf):
        raise TraceFormatError(where, number, "grad_stats.nonfinite",
                               f"{stats['nonfinite']!r} is more than count {stats['count']!r}")


def _integer(raw, where, number, field) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise TraceFormatError(where, number, field, f"must be an integer, got {raw!r}")
    return raw


def _number_in(raw, where, number, field) -> float:
    if isinstance(raw, bool):
        raise TraceFormatError(where, number, field, f"must be a number, got {raw!r}")
    if isinstance(raw, (int, float)):
        return float(raw)
    if isinstance(raw, str):
        text = raw.strip().lower()
        if text in ("inf", "+inf", "-inf", "nan", "infinity", "-infinity"):
            return float(text)
        if "0x" in text:
            try:
                return float.fromhex(text)
            except ValueError:
                pass
    raise TraceFormatError(where, number, field, f"must be a number, 'inf', '-inf', 'nan' or a "
                           f"hex float like '0x1p+16', got {raw!r}")
