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

from .trace import split_torn_tail, strict_json

__all__ = ["LAYERS_FILE", "LAYERS_FORMAT", "LAYERS_VERSION", "STATISTICS", "LayerStats",
           "LayerStatsWriter", "read_layer_stats"]

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


def _number(value: float):
    return value if math.isfinite(value) else repr(float(value))


def _line(stats: LayerStats) -> str:
    row = {"step": stats.step}
    row.update({name: [_number(v) for v in getattr(stats, name)] for name in STATISTICS})
    return json.dumps(row, allow_nan=False) + "\n"


class LayerStatsWriter:
    """Append one whole line per step (``write``) to ``path``; a new file starts with the
    header naming the parameters, ``kept`` steps (of a resumed run) written after it."""

    def __init__(self, path: "str | os.PathLike", names, kept=()) -> None:
        self.names = tuple(names)
        header = {"format": LAYERS_FORMAT, "version": LAYERS_VERSION,
                  "parameters": list(self.names)}
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self._emit(json.dumps(header) + "\n" + "".join(_line(s) for s in kept))

    def _emit(self, text: str) -> None:
        data = text.encode("utf-8")
        while data:
            data = data[os.write(self._fd, data):]

    def write(self, stats: LayerStats) -> None:
        self._emit(_line(stats))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _values(path: Path, lineno: int, row: dict, name: str, count: int) -> tuple:
    values = row.get(name)
    if not isinstance(values, list) or len(values) != count:
        raise ValueError(f"{path} line {lineno}: {name!r} must be a list of {count} values, one "
                         f"per parameter, got {str(values)[:60]}")
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
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text; it should be a layers.jsonl") from None
    whole, torn = split_torn_tail(text)
    if torn and not drop_torn_tail:
        raise ValueError(f"{path}: the last line lacks its newline (an interrupted write)")
    lines = whole.splitlines()
    try:
        header = strict_json(lines[0]) if lines else None
    except ValueError as err:
        raise ValueError(f"{path} line 1: not JSON ({err})") from None
    if not isinstance(header, dict) or header.get("format") != LAYERS_FORMAT:
        raise ValueError(f"{path} line 1 must be the header {{\"format\": \"{LAYERS_FORMAT}\", "
                         f"...}}: it is not a layers.jsonl of fpsim train --per-layer")
    if header.get("version") != LAYERS_VERSION:
        raise ValueError(f"{path}: version {header.get('version')!r}; this fpsim reads "
                         f"version {LAYERS_VERSION}")
    names = header.get("parameters")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{path} line 1: 'parameters' must be a list of names")
    steps = []
    for lineno, line in enumerate(lines[1:], start=2):
        try:
            row = strict_json(line)
        except ValueError as err:
            raise ValueError(f"{path} line {lineno}: not JSON ({err})") from None
        if not isinstance(row, dict) or row.get("step") != len(steps):
            raise ValueError(f"{path} line {lineno}: expected step {len(steps)} (steps 0, 1, "
                             f"2, ... in order), got {str(row)[:60]}")
        steps.append(LayerStats(len(steps), *(_values(path, lineno, row, name, len(names))
                                              for name in STATISTICS)))
    return tuple(names), steps
