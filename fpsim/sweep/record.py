"""The sweep's own files read back: ``sweep.json`` (what the folder holds) and each cell's
``result.json`` (its row), checked against their shape before anything uses them.

Every problem is a ``ValueError`` naming the file and what is wrong in it (a JSON decode error
included), so a damaged or hand-edited file gives one clear line instead of a ``KeyError`` or
``AttributeError`` deep inside the sweep.

JSON has no NaN or inf: a result that is one (the final loss of a run that diverged) is
written as the string ``"nan"``, ``"inf"`` or ``"-inf"``, as traces write them
(``cell_row_text``), and read back as the float.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from ..train.trace import strict_json
from .results import METRICS, OUTCOMES, STATUSES

__all__ = ["SWEEP_FORMAT", "read_json_object", "read_sweep_record", "read_cell_row",
           "cell_row_text"]

SWEEP_FORMAT = "fpsim-sweep"
SPEC_KEYS = {"name": str, "description": str, "base": dict, "grid": dict, "zip": dict}
RECORD_KEYS = {"format": str, "version": int, "fpsim": str, "spec": dict, "cells": list}
# Result columns that hold numbers (or nothing), checked so that a table never carries text
# where a number belongs.
NUMERIC_METRICS = ("steps_run", "final_loss", "trailing_loss", "best_loss", "best_step",
                   "plateau_left_step", "skipped_steps", "final_scale", "underflow_fraction",
                   "lost_update_fraction", "nan_step", "wall_time")
NON_FINITE = ("nan", "inf", "-inf")     # how result.json spells the floats JSON lacks


def read_json_object(path: Path, what: str) -> dict:
    """``path`` parsed as one JSON object (``what`` says what it should be, for messages)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text; it should be {what}") from None
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror or err}") from None
    try:
        value = strict_json(text)
    except ValueError as err:      # JSONDecodeError included: say where, in which file
        raise ValueError(f"{path} is not valid JSON ({' '.join(str(err).split())}); it should "
                         f"be {what}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds {_kind(value)}, not a JSON object; it should be {what}")
    return value


def _kind(value) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
               int: "an integer", float: "a number", type(None): "null"}


def _check_keys(path: Path, where: str, value: dict, keys: dict) -> None:
    missing = [k for k in keys if k not in value]
    if missing:
        raise ValueError(f"{path}: {where}lacks {', '.join(map(repr, missing))} (it should have "
                         f"{', '.join(map(repr, keys))})")
    for key, kind in keys.items():
        item = value[key]
        if not isinstance(item, kind) or (kind is int and isinstance(item, bool)):
            raise ValueError(f"{path}: {where}{key!r} must be {_TYPE_NAMES[kind]}, not "
                             f"{_kind(item)} ({str(item)[:40]})")


def read_sweep_record(path: Path) -> dict:
    """``sweep.json`` of a sweep folder, checked: its format, version, spec (name,
    description, base, grid, zip; every axis a non-empty list) and cells list."""
    what = "the sweep's record written by fpsim sweep"
    record = read_json_object(path, what)
    if record.get("format") != SWEEP_FORMAT:
        raise ValueError(f"{path}: 'format' is {record.get('format')!r}, not {SWEEP_FORMAT!r}: "
                         f"it is not {what}")
    _check_keys(path, "", record, RECORD_KEYS)
    record.setdefault("backend", "numpy")      # sweeps recorded before --backend: NumPy's
    if not isinstance(record["backend"], str):
        raise ValueError(f"{path}: 'backend' must be a string (the backend the sweep ran on), "
                         f"not {_kind(record['backend'])}")
    _check_keys(path, "'spec' ", record["spec"], SPEC_KEYS)
    for table in ("grid", "zip"):
        for axis, values in record["spec"][table].items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"{path}: spec.{table}.{axis} must be a non-empty list of "
                                 f"values, not {_kind(values)}")
    return record


def cell_row_text(row: dict) -> str:
    """A cell's row as its ``result.json`` text: strict JSON, a NaN or inf result as its
    string (``NON_FINITE``)."""
    spelled = {name: repr(value) if isinstance(value, float) and not math.isfinite(value)
               else value for name, value in row.items()}
    return json.dumps(spelled, indent=1, sort_keys=True, allow_nan=False) + "\n"


def read_cell_row(path: Path, key: str, config: dict) -> dict:
    """A finished cell's ``result.json``: its row, which must belong to the cell keyed ``key``
    with ``config`` and hold every result column with values of the right kind."""
    hint = f"delete {path.parent} to run that cell again"
    try:
        row = read_json_object(path, "a sweep cell's result row")
    except ValueError as err:   # bare NaN literals included, as sweeps before 6d7b8c3 wrote
        raise ValueError(f"{err}; {hint}") from None
    if row.get("key") != key:
        raise ValueError(f"{path}: 'key' is {row.get('key')!r}, but the folder is cell {key}; "
                         f"{hint}")
    missing = [name for name in (*config, *METRICS) if name not in row]
    if missing:
        raise ValueError(f"{path}: lacks {', '.join(map(repr, missing[:5]))}"
                         f"{' ...' if len(missing) > 5 else ''}; {hint}")
    changed = [name for name in config if row[name] != config[name]]
    if changed:
        name = changed[0]
        raise ValueError(f"{path}: {name} is {row[name]!r}, but cell {key} has {name} = "
                         f"{config[name]!r}; {hint}")
    if row["status"] not in STATUSES or row["outcome"] not in OUTCOMES:
        raise ValueError(f"{path}: status {row['status']!r} / outcome {row['outcome']!r} not "
                         f"among {', '.join(STATUSES)} / {', '.join(OUTCOMES)}; {hint}")
    for name in NUMERIC_METRICS:
        value = row[name]
        if value in NON_FINITE:
            row[name] = float(value)
        elif value is not None and (isinstance(value, bool) or
                                    not isinstance(value, (int, float))):
            raise ValueError(f"{path}: {name} must be a number, {', '.join(map(repr, NON_FINITE))}"
                             f" or null, not {_kind(value)} ({str(value)[:40]}); {hint}")
    return row
