"""A run folder's records read back: ``run.json``'s summary checked (``check_summary``,
``check_summary_steps``), and the record files beside two runs' traces compared bit for bit
(``compare_records``, for ``fpsim compare``).

A run folder may hold, besides ``run.json`` and the trace, ``layers.jsonl`` (``--per-layer``)
and ``fp8.jsonl`` (an FP8 recipe): one row per step of per-parameter or per-tensor
statistics. ``compare_records`` reads every such file either run has, each checked as resuming
checks it (a malformed one is a ``ValueError`` naming the file and line: never "identical"),
and compares the files both runs have step by step, every value by its IEEE bits. What was not
compared is said: a file only one run has, and ``checkpoint.npz`` (the run's final state, not
a record per step).
"""
from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from .fp8_stats import FP8_TABLE
from .layer_stats import LAYERS, StepTable, read_step_table
from .trace import split_torn_tail

__all__ = ["RECORD_TABLES", "RecordComparison", "compare_records", "run_folder",
           "SUMMARY_FIELDS", "check_summary", "check_summary_steps"]

RECORD_TABLES = (LAYERS, FP8_TABLE)
NOT_RECORDS = {"checkpoint.npz": "the run's final state, not a record per step"}


@dataclass(frozen=True)
class RecordComparison:
    """One record file both runs have: ``rows`` (steps in A's and B's), ``same_steps`` (the
    steps from 0 on that agree in every value) and ``first`` (``(step, field, a, b)`` where
    they first differ, or None; ``field`` is ``"<file> <statistic>[<column>]"``, or ``"<file>
    <names key>"`` when the runs name different columns)."""

    file: str
    rows: tuple
    same_steps: int
    first: tuple | None

    @property
    def identical(self) -> bool:
        return self.first is None and self.rows[0] == self.rows[1]


def run_folder(source: "str | os.PathLike") -> Path:
    """The folder a training run was read from: the folder given, or a trace file's."""
    path = Path(source)
    return path if path.is_dir() else path.parent


def compare_records(folder_a: Path, folder_b: Path) -> tuple[tuple, tuple]:
    """``(RecordComparison for each record file both folders hold, notes on what was not
    compared)``; every record file either holds is read and checked first."""
    compared, notes = [], []
    for table in RECORD_TABLES:
        a, b = (_read(table, folder) for folder in (folder_a, folder_b))
        notes += [f"{which}: {folder / table.file}: the last line was torn by an interruption "
                  f"and is left out" for which, folder, read in (("A", folder_a, a),
                                                                  ("B", folder_b, b))
                  if read is not None and read[2]]
        if a is not None and b is not None:
            compared.append(_compare_table(table, a[:2], b[:2]))
        elif a is not None or b is not None:
            notes.append(f"{table.file} not compared: only {'A' if a is not None else 'B'} "
                         f"has one")
    for name, why in NOT_RECORDS.items():
        if (folder_a / name).exists() or (folder_b / name).exists():
            notes.append(f"{name} not compared ({why})")
    return tuple(compared), tuple(notes)


def _read(table: StepTable, folder: Path):
    """``(names, rows, torn)`` of ``table`` in ``folder``, or None when it has none."""
    path = folder / table.file
    if not path.exists():
        return None
    names, rows = read_step_table(table, path, drop_torn_tail=True)   # checked: UTF-8 text
    return names, rows, bool(split_torn_tail(path.read_text(encoding="utf-8"))[1])


def _compare_table(table: StepTable, a, b) -> RecordComparison:
    (names_a, rows_a), (names_b, rows_b) = a, b
    counts = (len(rows_a), len(rows_b))
    if names_a != names_b:
        return RecordComparison(table.file, counts, 0, (0, f"{table.file} {table.names_key}",
                                                        list(names_a), list(names_b)))
    for step, (row_a, row_b) in enumerate(zip(rows_a, rows_b)):
        for statistic in table.statistics:
            for name, va, vb in zip(names_a, getattr(row_a, statistic),
                                    getattr(row_b, statistic)):
                if struct.pack("<d", va) != struct.pack("<d", vb):
                    return RecordComparison(table.file, counts, step,
                                            (step, f"{table.file} {statistic}[{name}]", va, vb))
    return RecordComparison(table.file, counts, min(counts), None)


# run.json's summary (fpsim.train.loop writes it at a run's end): each field and what it holds
_COUNT, _NUMBER = "an integer >= 0", "a number or 'nan', 'inf', '-inf'"
SUMMARY_FIELDS = {"steps": _COUNT, "skipped_steps": _COUNT, "final_loss": _NUMBER,
                  "final_scale": _NUMBER, "loss_sha256": "a SHA-256 in hex (64 digits)",
                  "nonfinite_loss_steps": "a list of integers >= 0"}


def check_summary(path: Path, summary: dict) -> None:
    """Each summary field present holds what a run writes there; the first that does not
    is named with what it holds."""
    for key, wanted in SUMMARY_FIELDS.items():
        if key in summary and not _summary_value_ok(wanted, summary[key]):
            raise ValueError(f"{path}: summary.{key} must be {wanted}, got "
                             f"{str(summary[key])[:60]!r}")


def _summary_value_ok(wanted: str, value) -> bool:
    def count(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if wanted == _COUNT:
        return count(value)
    if wanted == _NUMBER:
        return value in ("nan", "inf", "-inf") if isinstance(value, str) else \
            isinstance(value, (int, float)) and not isinstance(value, bool)
    if wanted == SUMMARY_FIELDS["loss_sha256"]:
        return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) is not None
    return isinstance(value, list) and all(count(v) for v in value)



def check_summary_steps(info_path: Path, summary: dict, trace_path: Path, records) -> None:
    """A finished run's trace holds the steps its summary counts: fewer is a trace cut
    short (or another run's), which would draw and compare as if it were whole."""
    if "steps" in summary and summary["steps"] != len(records):
        raise ValueError(f"{info_path}: summary.steps is {summary['steps']}, but {trace_path} "
                         f"holds {len(records)} step(s): the trace is not this finished run's "
                         f"whole trace")
