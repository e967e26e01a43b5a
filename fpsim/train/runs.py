"""Finished (or interrupted) runs read back from disk, and the first place two runs differ.

A training run is the folder ``fpsim train --out`` (or ``train(out=...)``) writes: ``run.json``
and ``trace.jsonl`` or ``trace.csv``; a trace file alone works too (its ``run.json``, if one
sits beside it, still gives the label). ``load_run`` reads either into a ``Run``: per-step
columns (``loss``, ``scale``, ``found_inf``, ``skipped``, ``grad_norm``,
``underflow_fraction``, ``lost_update_fraction``, ``wall_time``), the configuration, and a
label such as ``"16-mixed, scaler dynamic, seed 0"``. A run whose ``run.json`` has no summary
stopped before its end (Ctrl-C, a crash): it loads with ``complete == False`` and its trace up
to the last step written.

``compare_runs(a, b)`` walks both runs step by step and returns the first step and field whose
values differ bit for bit (floats by their IEEE bits, the loss by its float32 bits; NaN equals
NaN of the same bits, -0.0 differs from 0.0), or says the runs are bit-identical.
``wall_time`` is never compared: it is the one column that differs between equal runs. The
record files beside the traces (``layers.jsonl``, ``fp8.jsonl``) are read, checked and
compared too (``fpsim.train.run_records``). Two training runs that differ are also shown side
by side (``fpsim.train.run_summary``): final and best loss, the loss gap, skipped steps, and
where one diverged.

>>> import io, json, tempfile
>>> from pathlib import Path
>>> from fpsim.train import StepRecord, TraceWriter
>>> folder = Path(tempfile.mkdtemp())
>>> def write(name, losses):
...     (folder / name).mkdir()
...     with TraceWriter(folder / name / "trace.jsonl") as w:
...         for i, loss in enumerate(losses):
...             w.write(StepRecord(i, loss, 1.0, False, False, 0.5, 0.0, 0.0, 0.01))
>>> write("a", [0.75, 0.5, 0.25]); write("b", [0.75, 0.5, 0.125])
>>> print(compare_runs(folder / "a", folder / "b").difference)
step 2, field loss: 0.25 (0x3e800000) | 0.125 (0x3e000000)
"""
from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from .run_records import check_summary, check_summary_steps, compare_records, run_folder
from .run_summary import side_by_side
from .trace import read_trace, strict_json

__all__ = ["Run", "load_run", "compare_runs", "Comparison", "Difference", "run_label",
           "TRAINING_COLUMNS", "first_json_row", "show_value", "shown_apart"]

TRAINING_COLUMNS = ("loss", "scale", "found_inf", "skipped", "grad_norm", "underflow_fraction",
                    "lost_update_fraction", "wall_time")
NOT_COMPARED = ("wall_time",)   # machine time: differs between bit-identical runs
FLOAT32_COLUMNS = ("loss",)     # shown and compared as float32 bit patterns
TRACE_NAMES = ("trace.jsonl", "trace.csv")


@dataclass(frozen=True)
class Run:
    """One run's per-step columns. ``columns[name][i]`` is the value at ``steps[i]``;
    ``config``: the run's ``run.json`` (or a scaler trace's header), ``{}`` if none;
    ``kind``: ``"training"`` or ``"scaler-trace"``; ``expected_steps``: the steps it was asked
    for, when known; ``complete``: False for a run that stopped before its end; ``notes``:
    what was tolerated in reading it (a torn last line left out)."""

    label: str
    source: str
    kind: str
    steps: tuple
    columns: dict
    config: dict = field(default_factory=dict)
    expected_steps: int | None = None
    complete: bool = True
    notes: tuple = ()

    def column(self, name: str):
        """The values of one column, or None when this run does not record it."""
        return self.columns.get(name)


def run_label(info: dict) -> str:
    """A short label from a ``run.json``: policy, scaler and seed (``"16-true, scaler none,
    seed 0"``); whatever of these is missing is left out."""
    config = info.get("config", {}) if isinstance(info, dict) else {}
    parts = []
    if config.get("policy"):
        parts.append(str(config["policy"]))
    scaler = config.get("scaler_name") or _scaler_name_from_repr(config.get("scaler"))
    if scaler:
        parts.append(f"scaler {scaler}")
    if config.get("seed") is not None:
        parts.append(f"seed {config['seed']}")
    return ", ".join(parts)


def _scaler_name_from_repr(text) -> str | None:
    # run.json files written before "scaler_name" existed hold only the scaler's repr
    if not isinstance(text, str):
        return None
    if text.startswith("StaticScaler("):
        scale = re.search(r"scale=([^,)]+)", text)
        return f"static:{float(scale.group(1)):g}" if scale else "static"
    name = re.search(r"name='([^']*)'", text)
    return name.group(1) if name else None


def load_run(path: "str | os.PathLike") -> Run:
    """Read a training run: a run folder (``run.json`` and ``trace.jsonl`` or ``trace.csv``)
    or a trace file. Raises ``FileNotFoundError`` or ``ValueError`` (``TraceError``) naming
    the file and what is wrong."""
    path = Path(path)
    if path.is_dir():
        traces = [path / name for name in TRACE_NAMES if (path / name).is_file()]
        if not traces:
            raise FileNotFoundError(f"{path} holds no trace.jsonl or trace.csv: give a run "
                                    f"folder written by 'fpsim train --out' or a trace file")
        if len(traces) > 1:
            raise ValueError(f"{path} holds both trace.jsonl and trace.csv; name the one to "
                             f"read ({traces[0]} or {traces[1]})")
        trace_path, info_path = traces[0], path / "run.json"
    elif path.is_file():
        trace_path, info_path = path, path.parent / "run.json"
    else:
        raise FileNotFoundError(f"no run at {path}: give a run folder (run.json and "
                                f"trace.jsonl or trace.csv) or a trace file")
    header = first_json_row(trace_path)
    if header is not None and "format" in header:
        raise ValueError(f"{trace_path} is a framework's loss-scaler trace, not a training "
                         f"trace: read it with fpsim.plots.open_run (as fpsim plot and fpsim "
                         f"compare do)")
    info = _read_info(info_path) if info_path.is_file() else {}
    # A last line torn by a crash is the one defect an interrupted run may have: it is left
    # out, as resuming does, and said so; anything else wrong in the trace is refused.
    torn = _ends_torn(trace_path)
    records = read_trace(trace_path, drop_torn_tail=True)
    if not records:
        raise ValueError(f"{trace_path} holds no steps: there is nothing to draw or compare")
    expected = info.get("config", {}).get("steps")
    complete = "summary" in info if info else not torn
    check_summary_steps(info_path, info.get("summary", {}), trace_path, records)
    label = run_label(info) or trace_path.parent.name or str(trace_path)
    if not complete:
        label += f" (interrupted after step {records[-1].step})"
    notes = ((f"{trace_path}: the last line was torn by an interruption and is left out; "
              f"the run is read up to step {records[-1].step}",) if torn else ())
    columns = {name: tuple(getattr(r, name) for r in records) for name in TRAINING_COLUMNS}
    if records[0].lr is not None:       # a scheduled run: each step's learning rate
        columns["lr"] = tuple(r.lr for r in records)
    return Run(label, str(path), "training", tuple(r.step for r in records), columns, info,
               expected, complete, notes)


def _ends_torn(path: Path) -> bool:
    """Whether the file's last byte is not a newline (its last line was cut off)."""
    with open(path, "rb") as stream:
        stream.seek(0, os.SEEK_END)
        if stream.tell() == 0:
            return False
        stream.seek(-1, os.SEEK_END)
        return stream.read(1) != b"\n"


def first_json_row(path: "str | os.PathLike") -> dict | None:
    """The first non-blank line of a text file as a JSON object, or None when it is not one
    (a CSV trace, binary data): how a trace's kind is told without reading it all."""
    try:
        with open(path, encoding="utf-8") as stream:
            first = next((line for line in stream if line.strip()), "")
        row = strict_json(first)
    except (UnicodeDecodeError, ValueError):
        return None
    return row if isinstance(row, dict) else None


def _read_info(path: Path) -> dict:
    try:
        info = strict_json(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err.msg}, line {err.lineno})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text") from None
    except ValueError as err:       # numbers beyond float range, NaN literals, deep nesting
        raise ValueError(f"{path} is not valid JSON ({err})") from None
    if not isinstance(info, dict):
        raise ValueError(f"{path} must hold a JSON object (a run's configuration), not "
                         f"{type(info).__name__}")
    for key in ("config", "summary"):
        if key in info and not isinstance(info[key], dict):
            raise ValueError(f"{path}: {key!r} must be a JSON object, not "
                             f"{type(info[key]).__name__}")
    config = info.get("config", {})
    steps = config.get("steps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                              or steps < 1):
        raise ValueError(f"{path}: config.steps must be a positive integer, got {steps!r}")
    for key in ("policy", "scaler_name", "scaler"):
        if config.get(key) is not None and not isinstance(config[key], str):
            raise ValueError(f"{path}: config.{key} must be a string, got {config[key]!r}")
    check_summary(path, info.get("summary", {}))
    return info


@dataclass(frozen=True)
class Difference:
    """The first step and column at which two runs differ, with both values (None where a
    run does not record the column at that step)."""

    step: int
    field: str
    a: object
    b: object

    def __str__(self) -> str:
        return (f"step {self.step}, field {self.field}: {show_value(self.field, self.a)} | "
                f"{show_value(self.field, self.b)}")


def show_value(name: str, value) -> str:
    """A value with its exact bits: float32 hex for the loss, IEEE double hex (``float.hex``)
    for other floats, ``true``/``false`` for flags."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if name in FLOAT32_COLUMNS:
            return f"{value!r} (0x{struct.unpack('<I', struct.pack('<f', value))[0]:08x})"
        return f"{value!r} ({value.hex()})"
    return "-" if value is None else repr(value)


def shown_apart(a, b, width: int = 60) -> tuple[str, str]:
    """``repr`` of two values, each cut to about ``width`` characters around the first
    character where they differ, so that long values (a platform string, a path) still show
    their difference. ``...`` marks what is left out.

    >>> shown_apart("x" * 100 + "A", "x" * 100 + "B", width=20)
    ("...xxxxxxxxxxxxA'", "...xxxxxxxxxxxxB'")
    """
    ra, rb = repr(a), repr(b)
    if len(ra) <= width and len(rb) <= width:
        return ra, rb
    first = next((i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), min(len(ra), len(rb)))
    start = max(0, first - (width - 3) * 3 // 4)    # most of the room for the difference

    def window(text: str) -> str:
        head = "..." if start else ""
        room = width - len(head)
        part = text[start:start + room]
        return head + (part[:room - 3] + "..." if start + room < len(text) else part)

    return window(ra), window(rb)


def _bits(name: str, value):
    if isinstance(value, float):
        return struct.pack("<f" if name in FLOAT32_COLUMNS else "<d", value)
    return (type(value).__name__, value)


@dataclass(frozen=True)
class Comparison:
    """``difference``: the first ``Difference`` (None if every compared value agrees);
    ``lengths``: steps in each run; ``fields``: the columns compared; ``config_differences``:
    ``{key: (a, b)}`` for the configuration entries (versions, platform, options) that
    differ."""

    a: Run
    b: Run
    fields: tuple
    difference: Difference | None
    identical_steps: int
    config_differences: dict
    records: tuple = ()         # RecordComparison of each record file both runs have
    record_notes: tuple = ()    # what was not compared, or was torn

    @property
    def lengths(self) -> tuple:
        return len(self.a.steps), len(self.b.steps)

    @property
    def identical(self) -> bool:
        """True when every step of both runs agrees bit for bit in every compared field and
        record file."""
        return self.difference is None and self.lengths[0] == self.lengths[1] and \
            all(r.identical for r in self.records)

    def __str__(self) -> str:
        names = "\n".join(f"{which} = {run.source} ({_described(run)})"
                          for which, run in (("A", self.a), ("B", self.b)))
        compared = ", ".join(self.fields)
        if self.records:
            compared += f" and of {' and '.join(r.file for r in self.records)}"
        if self.identical:
            lines = [f"bit-identical: {self.lengths[0]} steps, every value of {compared} "
                     f"({', '.join(NOT_COMPARED)} not compared)", names]
        elif self.difference is not None:
            d = self.difference
            width = len(d.field) + 2
            lines = [f"differ first at step {d.step}, field {d.field} (after "
                     f"{self.identical_steps} bit-identical steps)", names,
                     f"  {'A':<{width}}{show_value(d.field, d.a)}",
                     f"  {'B':<{width}}{show_value(d.field, d.b)}"]
            lines += self._row(d.step)
        else:
            uneven = [(f"'s {r.file}", r.rows) for r in self.records if r.rows[0] != r.rows[1]]
            what, counts = ("", self.lengths) if self.lengths[0] != self.lengths[1] \
                else uneven[0]
            shorter, longer = sorted(counts)
            which = "A" if counts[0] > counts[1] else "B"
            lines = [f"the first {shorter} steps are bit-identical in {compared}; {which}{what} "
                     f"has {longer - shorter} more step(s) than the other", names]
        if not self.identical and all("loss" in run.columns for run in (self.a, self.b)):
            lines += side_by_side(self.a.steps, self.a.columns, self.b.steps, self.b.columns)
        lines += [f"note: {which}: {note}" for which, run in (("A", self.a), ("B", self.b))
                  for note in run.notes]
        lines += [f"note: {note}" for note in self.record_notes]
        if self.config_differences:
            lines.append("configuration differences (A | B):")
            for key, (va, vb) in list(self.config_differences.items())[:12]:
                lines.append(f"  {key}: {' | '.join(shown_apart(va, vb))}")
            if len(self.config_differences) > 12:
                lines.append(f"  ... and {len(self.config_differences) - 12} more")
        return "\n".join(lines)

    def _row(self, step: int) -> list[str]:
        """Every compared field of both runs at ``step``, the differing ones marked."""
        if step not in self.a.steps or step not in self.b.steps:
            return []
        ia, ib = self.a.steps.index(step), self.b.steps.index(step)
        lines = [f"  at step {step}:"]
        width = max(len(name) for name in self.fields)
        for name in self.fields:
            va, vb = self.a.columns[name][ia], self.b.columns[name][ib]
            mark = "" if _bits(name, va) == _bits(name, vb) else "  <- differs"
            lines.append(f"    {name:<{width}}  {show_value(name, va)} | "
                         f"{show_value(name, vb)}{mark}")
        return lines


def _described(run: Run) -> str:
    """The run's label and, where its run.json names it, the backend that computed it."""
    computed_on = run.config.get("backend") if isinstance(run.config, dict) else None
    return ", ".join(p for p in (run.label, computed_on and f"backend {computed_on}") if p)


def compare_runs(a: "Run | str | os.PathLike", b: "Run | str | os.PathLike") -> Comparison:
    """Compare two runs (``Run`` objects, or paths ``load_run`` reads) step by step; the
    result's ``difference`` is the first step and field that differ in their bits."""
    run_a = a if isinstance(a, Run) else load_run(a)
    run_b = b if isinstance(b, Run) else load_run(b)
    fields = tuple(name for name in run_a.columns
                   if name in run_b.columns and name not in NOT_COMPARED)
    if not fields:
        raise ValueError(f"{run_a.source} and {run_b.source} record no column in common")
    index_b = {step: i for i, step in enumerate(run_b.steps)}
    difference, same = None, 0
    for ia, step in enumerate(run_a.steps):
        ib = index_b.get(step)
        if ib is None:
            break
        for name in fields:
            va, vb = run_a.columns[name][ia], run_b.columns[name][ib]
            if _bits(name, va) != _bits(name, vb):
                difference = Difference(step, name, va, vb)
                break
        if difference is not None:
            break
        same += 1
    records, notes = _compare_record_files(run_a, run_b)
    first = [d for d in [difference] + [Difference(*r.first) for r in records if r.first] if d]
    difference = min(first, key=lambda d: d.step, default=None)     # the trace's on a tie
    same = same if difference is None else min(same, difference.step)
    return Comparison(run_a, run_b, fields, difference, same,
                      _config_differences(run_a.config, run_b.config), records, notes)


def _compare_record_files(run_a: Run, run_b: Run) -> tuple[tuple, tuple]:
    """The record files beside two training runs read from disk, compared (run_records)."""
    if not all(r.kind == "training" and Path(r.source).exists() for r in (run_a, run_b)):
        return (), ()
    return compare_records(run_folder(run_a.source), run_folder(run_b.source))


_IGNORED_CONFIG = ("summary", "resumed_at")


def _flatten(info: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in info.items():
        if not prefix and key in _IGNORED_CONFIG:
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _config_differences(a: dict, b: dict) -> dict:
    fa, fb = _flatten(a), _flatten(b)
    keys = list(fa) + [k for k in fb if k not in fa]
    return {k: (fa.get(k), fb.get(k)) for k in keys
            if not _same_json(fa.get(k), fb.get(k))}


def _same_json(x, y) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return x == y and type(x) is type(y)
