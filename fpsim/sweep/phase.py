"""The phase diagram of a finished (or partly finished) sweep: one outcome over two axes.

Runs that share the two axes' values (and the facet's) but differ on other axes (seeds, say)
are gathered into one cell: for ``outcome`` their outcome when they all agree, else "mixed"
with how many runs ended each way (two seeds a hair apart on either side of a threshold are
shown as the disagreement they are, never as one of the two); for a number, the median of its
finite values. Outcomes are the table's: judged against each run's fp32 baseline where the
sweep has one (``fpsim.sweep.baseline``); the title says how many were.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

from .record import read_sweep_record
from .results import OUTCOMES, read_table

__all__ = ["phase_diagram", "NUMERIC_OUTCOMES", "PLOTTED", "MIXED"]

NUMERIC_OUTCOMES = ("final_loss", "trailing_loss", "best_loss", "best_step",
                    "plateau_left_step", "skipped_steps", "final_scale", "underflow_fraction",
                    "lost_update_fraction", "nan_step", "wall_time")
PLOTTED = ("outcome", *NUMERIC_OUTCOMES)
MIXED = "mixed"     # runs gathered in one square that ended differently


def phase_diagram(folder: "str | Path", x: str, y: str, *, outcome: str = "outcome",
                  facet: str | None = None, out: "str | Path | None" = None) -> list[Path]:
    """Draw ``outcome`` over axes ``x`` and ``y`` (one panel per value of ``facet``) from the
    sweep in ``folder``; writes ``out``.png and .svg (default ``folder/phase_<outcome>``)."""
    folder = Path(folder)
    record, table = folder / "sweep.json", folder / "results.csv"
    if not record.exists() or not table.exists():
        raise ValueError(f"{folder} holds no sweep results (sweep.json and results.csv); run "
                         f"fpsim sweep SPEC --out {folder} first")
    if outcome not in PLOTTED:
        raise ValueError(f"unknown outcome {outcome!r}; choose {', '.join(PLOTTED)}")
    info = read_sweep_record(record)
    axes = [*info["spec"]["grid"], *info["spec"]["zip"]]
    for option, name in (("--x", x), ("--y", y), ("--facet", facet)):
        if name is not None and name.replace("-", "_") not in axes:
            raise ValueError(f"{option} {name!r} is not an axis of this sweep; its axes: "
                             f"{', '.join(axes)}")
    x, y = x.replace("-", "_"), y.replace("-", "_")
    facet = facet.replace("-", "_") if facet else None
    if len({x, y, facet} - {None}) < len([n for n in (x, y, facet) if n]):
        raise ValueError("--x, --y and --facet must be different axes")
    rows = read_table(table)
    if not rows:
        raise ValueError(f"{table} has no finished cells yet")
    absent = [name for name in (x, y, facet, outcome) if name and name not in rows[0]]
    if absent:
        raise ValueError(f"{table} has no column {absent[0]!r}, which {record} names: the two "
                         f"files are not of one sweep; rerun fpsim sweep on {folder}")
    for number, row in enumerate(rows, start=2):
        if outcome in NUMERIC_OUTCOMES and row[outcome] and not _is_number(row[outcome]):
            raise ValueError(f"{table} line {number}: {outcome} {row[outcome]!r} is not a "
                             f"number")
    order = {name: _first_seen(rows, name) for name in (x, y, facet) if name}
    panels = {}
    for panel in order[facet] if facet else [None]:
        grid = []
        for y_value in order[y]:
            line = []
            for x_value in order[x]:
                runs = [row for row in rows if row[x] == x_value and row[y] == y_value
                        and (facet is None or row[facet] == panel)]
                line.append(_gather(runs, outcome))
            grid.append(line)
        panels[f"{facet} = {panel}" if facet else ""] = grid
    stem = Path(out) if out is not None else folder / f"phase_{outcome}"
    if stem.suffix in (".png", ".svg"):
        stem = stem.with_suffix("")
    from ..plots.phase import plot_phase_diagram  # matplotlib only when drawing

    title = f"{info['spec']['name']}: {outcome}" if outcome != "outcome" else info["spec"]["name"]
    against_baseline = sum(row["judged_by"] == "baseline" for row in rows)
    if outcome == "outcome" and against_baseline:
        title += (f"\n{against_baseline} of {len(rows)} runs judged against their fp32 run, "
                  f"the rest by fixed thresholds")
    return plot_phase_diagram(panels, x_values=[_label(v) for v in order[x]],
                              y_values=[_label(v) for v in order[y]], x_label=_name(x, order[x]),
                              y_label=_name(y, order[y]),
                              outcome=outcome, stem=stem, title=title)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _first_seen(rows, name) -> list[str]:
    seen = []
    for row in rows:
        if row[name] not in seen:
            seen.append(row[name])
    return seen


def _gather(runs: list[dict], outcome: str):
    if not runs:
        return None
    if outcome == "outcome":
        counts = {name: sum(row["outcome"] == name for row in runs) for name in OUTCOMES}
        found = {name: n for name, n in counts.items() if n}
        if len(found) == 1:
            return next(iter(found)), {}, len(runs)
        return MIXED, found, len(runs)
    values = sorted(float(row[outcome]) for row in runs if row[outcome] not in ("", None))
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return math.nan
    half = len(values) // 2
    return values[half] if len(values) % 2 else (values[half - 1] + values[half]) / 2


_STATIC = re.compile(r"^static:([0-9.e+]+)$")


def _label(value: str) -> str:
    """A tick label: a static loss scale that is a power of two as 2^k."""
    match = _STATIC.match(value)
    if match:
        exponent = math.log2(float(match.group(1))) if float(match.group(1)) > 0 else 0.5
        if exponent == int(exponent):
            return f"$2^{{{int(exponent)}}}$"
    return value


def _name(axis: str, values: list[str]) -> str:
    if axis == "scaler" and all(_STATIC.match(v) for v in values):
        return "static loss scale (scaler)"
    return axis

