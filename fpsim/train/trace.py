"""Per-step training traces: one record a step, written and flushed as training goes, so an
interrupted run leaves a readable trace up to its last completed step.

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

__all__ = ["StepRecord", "TraceWriter", "read_trace", "TraceError", "TRACE_VERSION"]

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
    differs between runs).
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

    @property
    def loss_bits(self) -> str:
        return f"0x{int(np.float32(self.loss).view(np.uint32)):08x}"

    def as_row(self) -> dict:
        row = self._asdict()
        row["loss_bits"] = self.loss_bits
        return row


FIELDS = StepRecord._fields + ("loss_bits",)
_TYPES = {"step": int, "found_inf": bool, "skipped": bool}


def _json_float(value: float):
    # JSON has no inf/NaN literals; strings keep the file valid for every JSON reader.
    return value if math.isfinite(value) else repr(float(value))


class TraceWriter:
    """Append ``StepRecord`` rows to a file (or text stream) and flush after every row."""

    def __init__(self, target: "str | os.PathLike | IO[str]", layout: str | None = None):
        if isinstance(target, (str, os.PathLike)):
            path = Path(target)
            layout = layout or ("csv" if path.suffix == ".csv" else "jsonl")
            self._stream: IO[str] = open(path, "w", newline="", encoding="utf-8")
            self._owned = True
        else:
            layout = layout or "jsonl"
            self._stream, self._owned = target, False
        if layout not in ("jsonl", "csv"):
            raise ValueError(f"trace layout must be 'jsonl' or 'csv', got {layout!r}")
        self.layout = layout
        self._csv = None
        if layout == "csv":
            self._csv = csv.DictWriter(self._stream, fieldnames=FIELDS, lineterminator="\n")
            self._csv.writeheader()

    def write(self, record: StepRecord) -> None:
        row = record.as_row()
        if self._csv is not None:
            self._csv.writerow({k: repr(v) if isinstance(v, float) else v
                                for k, v in row.items()})
        else:
            row = {k: _json_float(v) if isinstance(v, float) else v for k, v in row.items()}
            self._stream.write(json.dumps(row) + "\n")
        self._stream.flush()

    def close(self) -> None:
        if self._owned:
            self._stream.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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


def read_trace(source: "str | os.PathLike | IO[str]") -> list[StepRecord]:
    """Read a trace written by ``TraceWriter``; ``TraceError`` names the line and field that
    is wrong. Checks that ``loss_bits`` agrees with ``loss``."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        text = path.read_text(encoding="utf-8")
        name, is_csv = str(path), path.suffix == ".csv"
    else:
        text = source.read()
        name, is_csv = "<trace>", text.startswith("step,")
    if is_csv:
        rows = list(csv.DictReader(io.StringIO(text)))
        numbered = [(i + 2, row) for i, row in enumerate(rows)]
    else:
        numbered = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise TraceError(f"{name} line {lineno}: not JSON ({err.msg})") from None
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
        values = {f: _parse_value(f, row[f], where) for f in FIELDS}
        bits = values.pop("loss_bits")
        record = StepRecord(**values)
        if record.loss_bits != bits and not math.isnan(record.loss):
            raise TraceError(f"{where}: field 'loss_bits' {bits} does not match loss "
                             f"{record.loss!r} ({record.loss_bits})")
        records.append(record)
    return records
