"""The results table: one row per cell, what the run did and how it ended.

Outcomes, from the loss (``L`` = ln(classes), the loss of predicting the class frequencies,
where an untrained classifier sits; "trailing loss" = mean of the last ``WINDOW`` losses).
A cell alone (``summarize``: its ``result.json``) is judged by fixed thresholds:

- ``diverged``: a loss was NaN or inf, or the final trailing loss is above ``DIVERGED * L``;
- ``converged``: the final trailing loss is below ``CONVERGED * L``;
- ``stalled``: neither (the run never got, or did not stay, off the plateau);
- ``failed``: the configuration did not run (the row's ``error`` says why).

The table judges a cell against its baseline, the same run in full precision, where the
sweep holds one (``fpsim.sweep.baseline``); its ``judged_by`` column says which rule gave
each row's outcome (``JUDGES``), ``baseline_cell`` and ``baseline_trailing_loss`` what it
was judged against.

``plateau_left_step`` is the first step whose trailing loss is below ``CONVERGED * L``.
Numbers are written exactly: floats in their shortest round-trip form, the final loss also as
its float32 bits, so equal tables are equal bits. ``wall_time`` (seconds the cell's training
took) is the one column that differs between runs.

Tables: ``results.csv`` always (the standard library writes and reads it, so every install
has the table in one form), and ``results.parquet`` beside it when pyarrow is installed.
Both are written whole and atomically.
"""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from ..files import atomic_file, write_text

__all__ = ["summarize", "write_tables", "read_table", "METRICS", "OUTCOMES", "WINDOW",
           "CONVERGED", "DIVERGED", "parquet_available", "STATUSES", "JUDGEMENT", "JUDGES",
           "TABLE_METRICS", "plateau_loss"]

WINDOW = 10
CONVERGED = 0.9
DIVERGED = 1.5
OUTCOMES = ("converged", "stalled", "diverged", "failed")
STATUSES = ("ok", "failed")
# A cell's own results (its result.json), after its configuration, in table order.
METRICS = ("status", "outcome", "steps_run", "final_loss", "final_loss_bits", "trailing_loss",
           "best_loss", "best_step", "plateau_left_step", "skipped_steps", "final_scale",
           "underflow_fraction", "lost_update_fraction", "nan_step", "loss_sha256",
           "wall_time", "error")
HEAD = ("cell", "key")
# How the table judged a row (fpsim.sweep.baseline): which rule, against which cell and loss.
JUDGEMENT = ("judged_by", "baseline_cell", "baseline_trailing_loss")
JUDGES = ("baseline", "absolute")      # judged_by of a cell that ran; empty for a failed one
# The table's result columns: the cell's own, with how it was judged beside its outcome.
TABLE_METRICS = (*METRICS[:2], *JUDGEMENT, *METRICS[2:])


def _mean(values) -> float:
    values = list(values)
    return math.fsum(values) / len(values)


def plateau_loss(classes: int) -> float:
    """``L`` = ln(classes): the loss of predicting the class frequencies (balanced classes),
    where an untrained classifier sits."""
    return math.log(classes)


def summarize(index: int, key: str, config: dict, records, final_scale, wall_time: float,
              error: str | None) -> dict:
    """The row of one cell from its trace records (``fpsim.train.StepRecord``)."""
    row = {"cell": index, "key": key, **config}
    row.update(dict.fromkeys(METRICS))
    row["wall_time"] = wall_time
    if error is not None or not records:
        row.update(status="failed", outcome="failed", error=error or "no steps recorded")
        return row
    from ..train import loss_hash

    losses = [r.loss for r in records]
    plateau = plateau_loss(config["classes"])
    trailing = [_mean(losses[max(0, i - WINDOW + 1):i + 1]) for i in range(len(losses))]
    nonfinite = [r.step for r in records if not math.isfinite(r.loss)]
    finite = [(r.loss, r.step) for r in records if math.isfinite(r.loss)]
    best_loss, best_step = min(finite) if finite else (None, None)
    left = next((records[i].step for i, t in enumerate(trailing) if t < CONVERGED * plateau),
                None)
    if nonfinite or trailing[-1] > DIVERGED * plateau:
        outcome = "diverged"
    elif trailing[-1] < CONVERGED * plateau:
        outcome = "converged"
    else:
        outcome = "stalled"
    row.update(status="ok", outcome=outcome, steps_run=len(records), final_loss=losses[-1],
               final_loss_bits=records[-1].loss_bits, trailing_loss=trailing[-1],
               best_loss=best_loss, best_step=best_step, plateau_left_step=left,
               skipped_steps=sum(r.skipped for r in records), final_scale=float(final_scale),
               underflow_fraction=_mean(r.underflow_fraction for r in records),
               lost_update_fraction=_mean(r.lost_update_fraction for r in records),
               nan_step=nonfinite[0] if nonfinite else None, loss_sha256=loss_hash(losses))
    return row


def _cell_text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def write_tables(folder: "str | Path", rows: list[dict], columns: list[str], *,
                 parquet: bool = True) -> list[Path]:
    """``results.csv`` (and ``results.parquet`` when pyarrow is installed and ``parquet``)
    from ``rows``, sorted by cell; each written whole, atomically. Returns the paths
    written."""
    folder = Path(folder)
    rows = sorted(rows, key=lambda row: row["cell"])
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell_text(row.get(name)) for name in columns])
    write_text(folder / "results.csv", buffer.getvalue())
    written = [folder / "results.csv"]
    if parquet and parquet_available():
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist([{name: row.get(name) for name in columns} for row in rows],
                                     schema=_schema(rows, columns))
        with atomic_file(folder / "results.parquet", "wb") as handle:
            pq.write_table(table, handle)
        written.append(folder / "results.parquet")
    return written


def _schema(rows, columns):
    import pyarrow as pa

    def kind(name):
        values = [row.get(name) for row in rows if row.get(name) is not None]
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return pa.int64()
        if values and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                          for v in values):
            return pa.float64()
        if values and all(isinstance(v, bool) for v in values):
            return pa.bool_()
        return pa.string()

    return pa.schema([(name, kind(name)) for name in columns])


def parquet_available() -> bool:
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True


def read_table(path: "str | Path") -> list[dict]:
    """Rows of ``results.csv`` as dicts of strings (empty string: no value), checked: the
    header names the cell, key and result columns, every row has exactly the header's fields,
    a known status and outcome, a judgement that fits them (``_judgement_problem``), and the
    file ends with a whole row. ``ValueError`` names the file and the row (counting the header
    as line 1) that is wrong."""
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            text = handle.read()
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text; it should be a sweep's results table") \
            from None
    lines = list(csv.reader(io.StringIO(text)))
    if not lines:
        raise ValueError(f"{path} is empty: it should start with its header row")
    header = lines[0]
    missing = [name for name in (*HEAD, *TABLE_METRICS) if name not in header]
    if missing and set(missing) <= set(JUDGEMENT):
        raise ValueError(f"{path}: the header lacks {', '.join(missing)}: a table written "
                         f"before sweeps judged outcomes against fp32; rerun fpsim sweep with "
                         f"its spec and --out {path.parent} to rewrite it (no cell runs again)")
    if missing:
        raise ValueError(f"{path}: the header lacks {', '.join(missing[:5])}: not a table "
                         f"written by fpsim sweep")
    if not text.endswith("\n"):
        raise ValueError(f"{path} line {len(lines)}: the last row is cut off (no newline at "
                         f"the end): the file was not written whole; rerun fpsim sweep on its "
                         f"folder to rewrite the table")
    rows = []
    for number, fields in enumerate(lines[1:], start=2):
        where = f"{path} line {number}"
        if len(fields) != len(header):
            raise ValueError(f"{where}: {len(fields)} fields where the header has "
                             f"{len(header)}; rerun fpsim sweep on its folder to rewrite the "
                             f"table")
        row = dict(zip(header, fields))
        if row["status"] not in STATUSES or row["outcome"] not in OUTCOMES:
            raise ValueError(f"{where}: status {row['status']!r} / outcome {row['outcome']!r} "
                             f"not among {', '.join(STATUSES)} / {', '.join(OUTCOMES)}")
        if not row["cell"].isdecimal():
            raise ValueError(f"{where}: cell {row['cell']!r} is not a cell number")
        problem = _judgement_problem(row)
        if problem:
            raise ValueError(f"{where}: {problem}; rerun fpsim sweep on its folder to rewrite "
                             f"the table")
        rows.append(row)
    cells = {row["cell"] for row in rows}
    for number, row in enumerate(rows, start=2):
        if row["judged_by"] == "baseline" and row["baseline_cell"] not in cells:
            raise ValueError(f"{path} line {number}: judged against baseline cell "
                             f"{row['baseline_cell']}, which the table does not hold; rerun "
                             f"fpsim sweep on its folder to rewrite the table")
    return rows


def _judgement_problem(row: dict) -> "str | None":
    """What is wrong with a table row's judgement columns (all strings), or None: a cell that
    ran names the rule that judged it, a failed one none; a baseline is a cell number and
    its trailing loss a finite number; a row judged by its baseline has both."""
    judged_by, cell, loss = row["judged_by"], row["baseline_cell"], row["baseline_trailing_loss"]
    if row["status"] == "failed" and judged_by:
        return f"judged_by {judged_by!r} for a failed cell, which is not judged (leave it empty)"
    if row["status"] == "ok" and judged_by not in JUDGES:
        return f"judged_by {judged_by!r} is not among {', '.join(JUDGES)}"
    if cell and not cell.isdecimal():
        return f"baseline_cell {cell!r} is not a cell number"
    if loss and not _finite(loss):
        return f"baseline_trailing_loss {loss!r} is not a finite number"
    if judged_by == "baseline" and not (cell and loss):
        return "judged_by 'baseline' without a baseline_cell and its baseline_trailing_loss"
    return None


def _finite(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False
