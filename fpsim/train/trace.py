"""Per-step training traces: one record a step, written and flushed as training goes, so an
interrupted run leaves a readable trace up to its last completed step.

A trace grows while training runs, so it cannot be replaced whole at every step as other
outputs are (``fpsim.files``). Instead each record goes to the file in one ``write`` of a
whole line in append mode: a line is either all there or, after a crash mid-write (a full
disk, a power cut), the file's last line lacks its newline. ``read_trace`` refuses such a torn
line by default, naming it; ``drop_torn_tail=True`` drops it (what resuming does).

Two layouts with the same columns: JSON Lines (``.jsonl``, the default) and CSV (``.csv``).
Floats are written with ``repr`` (shortest round-trip form) and the loss also as its exact
float32 bits in hex, so a trace read back gives the same bits.

>>> import io
>>> buffer = io.StringIO()
>>> writer = TraceWriter(buffer, layout="jsonl")
>>> writer.write(StepRecord(step=0, loss=0.6931471805599453, scale=65536.0, found_inf=False,
...     skipped=False, grad_norm=1.5, underflow_fraction=0.0, lost_update_fraction=0.0,
...     wall_time=0.01))
>>> read_trace(io.StringIO(buffer.getvalue()))[0].loss_bits
'0x3f317218'
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path
from typing import IO, NamedTuple

import numpy as np

from ..files import naming_file

__all__ = ["StepRecord", "TraceWriter", "read_trace", "TraceError", "TRACE_VERSION",
           "format_record", "trace_header", "split_torn_tail", "strict_json", "check_steps"]

TRACE_VERSION = 1


class TraceError(ValueError):
    """A trace file that does not parse: names the line and the field."""


class StepRecord(NamedTuple):
    """What one training step did.

    ``loss`` is the float32 loss as a float (the value the optimizer saw, NaN or inf
    included); ``loss_bits`` its float32 encoding; ``scale`` the loss scale used for this step;
    ``found_inf`` whether any scaled gradient was inf/NaN; ``skipped`` whether the update was
    skipped; ``grad_norm`` the global L2 norm of the unscaled gradients (NaN when skipped);
    ``underflow_fraction`` the fraction of gradient values that were nonzero in exact arithmetic
    but zero in their format; ``lost_update_fraction`` the fraction of parameter updates that
    did not change the stored weight; ``wall_time`` seconds the step took (the one field that
    differs between runs); ``lr`` the learning rate of the step where a schedule set it (None,
    and no ``lr`` column, otherwise).
    """

    step: int
    loss: float
    scale: float
    found_inf: bool
    skipped: bool
    grad_norm: float
    underflow_fraction: float
    lost_update_fraction: float
    wall_time: float
    lr: float | None = None

    @property
    def loss_bits(self) -> str:
        return f"0x{int(np.float32(self.loss).view(np.uint32)):08x}"

    def as_row(self) -> dict:
        row = self._asdict()
        if self.lr is None:
            del row["lr"]
        row["loss_bits"] = self.loss_bits
        return row


# the columns every step has; OPTIONAL ones are in every step of a trace or in none
OPTIONAL = ("lr",)
FIELDS = tuple(f for f in StepRecord._fields if f not in OPTIONAL) + ("loss_bits",)
_TYPES = {"step": int, "found_inf": bool, "skipped": bool}


def _json_float(value: float):
    # JSON has no inf/NaN literals; strings keep the file valid for every JSON reader.
    return value if math.isfinite(value) else repr(float(value))


class TraceWriter:
    """Write ``StepRecord`` rows to a file (or text stream), each row one whole line written
    at once. A path is created (or emptied) unless ``append=True``, which adds rows to a trace
    that already has its header."""

    def __init__(self, target: "str | os.PathLike | IO[str]", layout: str | None = None, *,
                 append: bool = False, lr: bool = False):
        if isinstance(target, (str, os.PathLike)):
            layout = layout or ("csv" if Path(target).suffix == ".csv" else "jsonl")
        layout = layout or "jsonl"
        if layout not in ("jsonl", "csv"):
            raise ValueError(f"trace layout must be 'jsonl' or 'csv', got {layout!r}")
        self.layout = layout
        self._fd: int | None = None
        self._stream: IO[str] | None = None
        self._path = target
        if isinstance(target, (str, os.PathLike)):
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
            self._fd = os.open(target, flags, 0o644)
        else:
            self._stream = target
        self.lr = lr        # whether the steps carry a learning rate (the lr column)
        if layout == "csv" and not append:
            self._emit(trace_header(layout, lr=lr))

    def _emit(self, line: str) -> None:
        if self._stream is not None:
            self._stream.write(line)
            self._stream.flush()
            return
        data = line.encode("utf-8")
        with naming_file(self._path):
            while data:     # one write() in practice; a short write only on a full disk
                data = data[os.write(self._fd, data):]

    def write(self, record: StepRecord) -> None:
        self._emit(format_record(record, self.layout))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def format_record(record: StepRecord, layout: str = "jsonl") -> str:
    """One trace line (newline included) for ``record``, as ``TraceWriter`` writes it."""
    row = record.as_row()
    if layout == "csv":
        buffer = io.StringIO()
        columns = _columns(record.lr is not None)
        csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n").writerow(
            {k: repr(v) if isinstance(v, float) else v for k, v in row.items()})
        return buffer.getvalue()
    return json.dumps({k: _json_float(v) if isinstance(v, float) else v
                       for k, v in row.items()}) + "\n"


def _columns(lr: bool) -> tuple:
    return FIELDS[:-1] + ("lr",) * lr + FIELDS[-1:]


def trace_header(layout: str, *, lr: bool = False) -> str:
    """What a trace of ``layout`` starts with before its first record (with ``lr``: steps
    that carry a learning rate)."""
    return ",".join(_columns(lr)) + "\n" if layout == "csv" else ""


def _parse_value(name: str, raw, where: str):
    kind = _TYPES.get(name, float)
    if name == "loss_bits":
        if not (isinstance(raw, str) and raw.startswith("0x")):
            raise TraceError(f"{where}: field 'loss_bits' must be a hex string like "
                             f"'0x3f800000', got {raw!r}")
        return raw
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        if raw in ("True", "False"):
            return raw == "True"
        raise TraceError(f"{where}: field {name!r} must be true or false, got {raw!r}")
    if kind is int:
        if isinstance(raw, bool) or not isinstance(raw, (int, str)):
            raise TraceError(f"{where}: field {name!r} must be an integer, got {raw!r}")
        try:
            return int(raw)
        except ValueError:
            raise TraceError(f"{where}: field {name!r} must be an integer, got {raw!r}") from None
    try:
        return float(raw) if not isinstance(raw, bool) else _bad_float(where, name, raw)
    except (TypeError, ValueError):
        return _bad_float(where, name, raw)


def _bad_float(where: str, name: str, raw):
    raise TraceError(f"{where}: field {name!r} must be a number (or 'nan'/'inf'), got {raw!r}")


def read_trace(source: "str | os.PathLike | IO[str]", *,
               drop_torn_tail: bool = False) -> list[StepRecord]:
    """Read a trace written by ``TraceWriter``; ``TraceError`` names the line and field that is
    wrong. Checks that every step has exactly the trace's fields, that ``loss_bits`` agrees with
    ``loss``, and that the steps run 0, 1, 2, ... each once (``check_steps``). A last line without
    its newline was torn by a crash while it was written: an error, or dropped with
    ``drop_torn_tail``."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise TraceError(f"{path}: not UTF-8 text ({err.reason})") from None
        name, is_csv = str(path), path.suffix == ".csv"
    else:
        text = source.read()
        name, is_csv = "<trace>", text.startswith("step,")
    whole, torn = split_torn_tail(text)
    if torn and not drop_torn_tail:
        raise TraceError(f"{name} line {whole.count(chr(10)) + 1}: torn (no newline at the end; "
                         f"the run stopped while writing it)")
    text = whole
    if is_csv:
        reader = csv.DictReader(io.StringIO(text))
        rows = list(reader)
        unknown = [f for f in reader.fieldnames or () if f not in FIELDS + OPTIONAL]
        if unknown:
            raise TraceError(f"{name} line 1: unknown column(s) {', '.join(unknown)}; a step "
                             f"has {', '.join(FIELDS)}")
        numbered = [(i + 2, row) for i, row in enumerate(rows)]
    else:
        numbered = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = strict_json(line)
            except json.JSONDecodeError as err:
                raise TraceError(f"{name} line {lineno}: not JSON ({err.msg})") from None
            except ValueError as err:   # 1e999, NaN literals, 5000-digit integers, deep nesting
                raise TraceError(f"{name} line {lineno}: {str(err)[:120]}") from None
            if not isinstance(row, dict):
                raise TraceError(f"{name} line {lineno}: expected a JSON object")
            numbered.append((lineno, row))
    records = []
    for lineno, row in numbered:
        where = f"{name} line {lineno}"
        missing = [f for f in FIELDS if f not in row or row[f] in (None, "")]
        if missing:
            raise TraceError(f"{where}: missing field(s) {', '.join(missing)}; a step has "
                             f"{', '.join(FIELDS)}")
        unknown = [str(f) if f is not None else "(a value past the last column)"
                   for f in row if f not in FIELDS + OPTIONAL]
        if unknown:
            raise TraceError(f"{where}: unknown field(s) {', '.join(unknown)}; a step has "
                             f"{', '.join(FIELDS)} (and lr where a schedule ran)")
        if ("lr" in row) != ("lr" in numbered[0][1]):
            raise TraceError(f"{where}: {'has' if 'lr' in row else 'lacks'} the field 'lr' "
                             f"that the first step {'lacks' if 'lr' in row else 'has'}; a "
                             f"trace's steps carry a learning rate all or none")
        values = {f: _parse_value(f, row[f], where) for f in FIELDS + OPTIONAL if f in row}
        bits = values.pop("loss_bits")
        record = StepRecord(**values)
        if record.loss_bits != bits and not math.isnan(record.loss):
            raise TraceError(f"{where}: field 'loss_bits' {bits} does not match loss "
                             f"{record.loss!r} ({record.loss_bits})")
        records.append(record)
    check_steps(name, [(lineno, r.step) for (lineno, _), r in zip(numbered, records)])
    return records


def check_steps(name: str, steps: "list[tuple[int, int]]") -> None:
    """A trace's steps, as (line number, step), must run 0, 1, 2, ... each once, in order;
    ``TraceError`` names the first step that is missing, repeated or out of place."""
    seen: dict[int, int] = {}
    for expected, (lineno, step) in enumerate(steps):
        if step == expected:
            seen[step] = lineno
            continue
        where = f"{name} line {lineno}"
        if step in seen:
            raise TraceError(f"{where}: step {step} appears twice (line {seen[step]} holds it "
                             f"too); a trace holds each step once, 0, 1, 2, ... in order")
        if expected == 0:
            raise TraceError(f"{where}: the trace starts at step {step}; a trace starts at "
                             f"step 0")
        if step > expected:
            missing = (f"step {expected} is missing" if step == expected + 1 else
                       f"steps {expected}..{step - 1} are missing")
            raise TraceError(f"{where}: {missing} (step {step} follows step {expected - 1})")
        raise TraceError(f"{where}: step {step} follows step {expected - 1}; a trace holds "
                         f"steps 0, 1, 2, ... in order")


def strict_json(text: str):
    """``json.loads`` that refuses, with ``ValueError``, what would silently change or stall
    a reading: numbers beyond float range (``1e999`` would read as inf), ``NaN``/``Infinity``
    literals (traces write those as strings), integers of more than 4300 digits, and nesting
    deeper than Python's recursion limit."""
    def finite(raw: str) -> float:
        value = float(raw)
        if math.isinf(value):
            raise ValueError(f"the number {raw[:20]}{'...' if len(raw) > 20 else ''} is beyond "
                             f"float range; write 'inf' as a string if inf is meant")
        return value

    def constant(name: str):
        raise ValueError(f"{name} is not JSON; write it as the string {name.lower()[:3]!r}")

    try:
        return json.loads(text, parse_float=finite, parse_constant=constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def split_torn_tail(text: str) -> tuple[str, str]:
    """``text`` split into its whole lines and a last line that lacks its newline ("" if
    none)."""
    cut = text.rfind("\n") + 1
    return text[:cut], text[cut:]
