"""Per-layer statistics of a run (``fpsim train --per-layer``, ``train(per_layer=True)``):
for each parameter and step,

- ``grad_underflow``: of the gradient values that were nonzero before the rounding that
  produced the parameter's gradient, the fraction that became zero (each op's backward
  charges its rounding to the input whose gradient it produced, ``fpsim.exact.underflow``;
  ``nan`` where a rounding could not be matched to that gradient: not measured);
- ``lost_updates``: of the parameter's elements the update rule meant to move, the fraction
  whose stored value did not change (``Optimizer.step(per_parameter=True)``; 0 on a skipped
  step, which moves nothing);
- ``grad_max``: the largest magnitude in the parameter's gradient as the backward pass left
  it (times the loss scale; ``nan``/``inf`` where it held them).

``grad_underflow`` counts only the rounding that produced the parameter's own gradient: a
gradient lost one op earlier (an activation's gradient that flushed to zero on its way down)
leaves nothing to flush, so a layer that received no gradient at all reads 0 there and
``grad_max`` 0 (lesson 8 finds such a head).

They go to ``layers.jsonl`` beside the trace, JSON Lines: a header ``{"format":
"fpsim-layer-stats", "version": 1, "parameters": [names]}``, then one line per step
``{"step": k, "grad_underflow": [...], "lost_updates": [...], "grad_max": [...]}`` in the
parameters' order, non-finite values as the strings ``"nan"``, ``"inf"``, ``"-inf"``. The
trace file and its format are unchanged. ``fpsim plot --per-layer RUN`` draws them.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from ..files import naming_file
from .trace import split_torn_tail, strict_json

__all__ = ["LAYERS_FILE", "LAYERS_FORMAT", "LAYERS_VERSION", "STATISTICS", "LayerStats",
           "LayerStatsWriter", "read_layer_stats", "StepTable", "StepTableWriter",
           "read_step_table", "open_step_table", "LAYERS"]

LAYERS_FILE = "layers.jsonl"
LAYERS_FORMAT = "fpsim-layer-stats"
LAYERS_VERSION = 1
STATISTICS = ("grad_underflow", "lost_updates", "grad_max")
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


@dataclass(frozen=True)
class LayerStats:
    """One step's statistics, one value per parameter in the run's parameter order."""

    step: int
    grad_underflow: tuple
    lost_updates: tuple
    grad_max: tuple


@dataclass(frozen=True)
class StepTable:
    """A JSON Lines file of one row per step and one value per named column in each
    statistic: ``file`` name, header ``format`` and ``version``, the header key listing the
    column names (``names_key``), the ``statistics``, and the ``row`` type built from
    ``(step, *one tuple per statistic)``."""

    file: str
    format: str
    version: int
    names_key: str
    statistics: tuple
    row: type
    what: str


LAYERS = StepTable(LAYERS_FILE, LAYERS_FORMAT, LAYERS_VERSION, "parameters", STATISTICS,
                   LayerStats, "a layers.jsonl of fpsim train --per-layer")


def _number(value: float):
    return value if math.isfinite(value) else repr(float(value))


def _line(table: StepTable, stats) -> str:
    row = {"step": stats.step}
    row.update({name: [_number(v) for v in getattr(stats, name)] for name in table.statistics})
    return json.dumps(row, allow_nan=False) + "\n"


class StepTableWriter:
    """Append one whole line per step (``write``) to ``path``; a new file starts with the
    header naming the columns, ``kept`` steps (of a resumed run) written after it."""

    def __init__(self, table: StepTable, path: "str | os.PathLike", names, kept=()) -> None:
        self.table, self.names = table, tuple(names)
        header = {"format": table.format, "version": table.version,
                  table.names_key: list(self.names)}
        self._path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self._emit(json.dumps(header) + "\n" + "".join(_line(table, s) for s in kept))

    def _emit(self, text: str) -> None:
        data = text.encode("utf-8")
        with naming_file(self._path):
            while data:
                data = data[os.write(self._fd, data):]

    def write(self, stats) -> None:
        self._emit(_line(self.table, stats))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def LayerStatsWriter(path: "str | os.PathLike", names, kept=()) -> StepTableWriter:
    """The ``layers.jsonl`` writer (module doc)."""
    return StepTableWriter(LAYERS, path, names, kept)


def _values(path: Path, lineno: int, row: dict, name: str, count: int) -> tuple:
    values = row.get(name)
    if not isinstance(values, list) or len(values) != count:
        raise ValueError(f"{path} line {lineno}: {name!r} must be a list of {count} values, one "
                         f"per column, got {str(values)[:60]}")
    out = []
    for value in values:
        if isinstance(value, str) and value in _NON_FINITE:
            out.append(_NON_FINITE[value])
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(float(value))
        else:
            raise ValueError(f"{path} line {lineno}: {name!r} holds {value!r}; values are "
                             f"numbers or 'nan', 'inf', '-inf'")
    return tuple(out)


def read_layer_stats(path: "str | os.PathLike", *, drop_torn_tail: bool = True):
    """``(parameter names, [LayerStats, ...])`` from a ``layers.jsonl``, every line checked
    (steps 0, 1, 2, ... in order; a last line torn by an interruption dropped)."""
    return read_step_table(LAYERS, path, drop_torn_tail=drop_torn_tail)


def read_step_table(table: StepTable, path: "str | os.PathLike", *,
                    drop_torn_tail: bool = True):
    """``(column names, [row, ...])`` from a ``table`` file, every line checked (steps 0, 1,
    2, ... in order; a last line torn by an interruption dropped)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text; it should be {table.what}") from None
    whole, torn = split_torn_tail(text)
    if torn and not drop_torn_tail:
        raise ValueError(f"{path}: the last line lacks its newline (an interrupted write)")
    lines = whole.splitlines()
    try:
        header = strict_json(lines[0]) if lines else None
    except ValueError as err:
        raise ValueError(f"{path} line 1: not JSON ({err})") from None
    if not isinstance(header, dict) or header.get("format") != table.format:
        raise ValueError(f"{path} line 1 must be the header {{\"format\": \"{table.format}\", "
                         f"...}}: it is not {table.what}")
    if header.get("version") != table.version:
        raise ValueError(f"{path}: version {header.get('version')!r}; this fpsim reads "
                         f"version {table.version}")
    names = header.get(table.names_key)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{path} line 1: {table.names_key!r} must be a list of names")
    steps: list = []
    for lineno, line in enumerate(lines[1:], start=2):
        try:
            row = strict_json(line)
        except ValueError as err:
            raise ValueError(f"{path} line {lineno}: not JSON ({err})") from None
        if not isinstance(row, dict) or row.get("step") != len(steps):
            raise ValueError(f"{path} line {lineno}: expected step {len(steps)} (steps 0, 1, "
                             f"2, ... in order), got {str(row)[:60]}")
        steps.append(table.row(len(steps), *(_values(path, lineno, row, name, len(names))
                                             for name in table.statistics)))
    return tuple(names), steps


def open_step_table(stack, table: StepTable, out_dir, names, start: int):
    """``(the writer or None, the rows kept from before a resumed run's start)`` for
    ``table`` in ``out_dir`` (None: nothing is written); the writer closes with ``stack``.
    Resuming needs the file, naming the same columns, with at least ``start`` rows."""
    names = tuple(names)
    if out_dir is None:
        return None, []
    path = Path(out_dir) / table.file
    kept: list = []
    if start > 0:
        if not path.exists():
            raise ValueError(f"cannot resume at step {start}: there is no {path} (the run "
                             f"wrote one); resume into the run's own folder")
        recorded, steps = read_step_table(table, path)
        if recorded != names or len(steps) < start:
            raise ValueError(f"cannot resume at step {start}: {path} holds {len(steps)} "
                             f"step(s) of {table.names_key} {list(recorded)[:4]}..., not the "
                             f"first {start} of this model's")
        kept = steps[:start]
    writer = StepTableWriter(table, path, names, kept)
    stack.callback(writer.close)
    return writer, list(kept)
