"""A run's files: the folder checked and locked, ``run.json`` written first and completed
last, the trace opened (or continued after a resume), and the version record of each run.

``open_outputs`` holds ``out/.fpsim.lock`` for the run; a folder that already holds a run is
refused unless the run resumes it or replaces it (``overwrite``: the old run stays until the
new one is whole, ``run_folder.replacing_run``).
"""
from __future__ import annotations

import contextlib
import json
import platform
import sys
from pathlib import Path
from typing import NamedTuple

from .. import backend
from .._version import __version__ as _fpsim_version
from ..backend import xp
from ..files import folder_lock, write_text
from .fp8_stats import FP8_TABLE
from .layer_stats import LAYERS
from .resume import check_same_config
from .run_folder import replacing_run, tidy_run_folder
from .trace import StepRecord, TraceWriter, format_record, read_trace, trace_header

__all__ = ["RUN_FILES", "Outputs", "open_outputs", "finish_run_json", "run_info"]

# What a run folder holds; a folder with any of them holds a run.
RUN_FILES = ("run.json", "trace.jsonl", "trace.csv", "checkpoint.npz", LAYERS.file, FP8_TABLE.file)


class Outputs(NamedTuple):
    """Where a run writes: ``folder`` (None without ``out``), the trace ``writer``, the trace
    records ``kept`` from before a resume's step, and ``notes`` on what was done."""

    folder: Path | None
    writer: TraceWriter | None
    kept: list
    notes: list


def open_outputs(stack: contextlib.ExitStack, out, layout, settings, start, resume,
                 overwrite, identity, allow_changes, *, lr: bool = False) -> Outputs:
    """Lock ``out``, check what it holds, write ``run.json`` and open the trace; returns
    (folder, trace writer, trace records kept from before ``start``, notes)."""
    if out is None:
        return Outputs(None, None, [], [])
    out_dir = Path(out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".fpsim-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise ValueError(f"cannot write the output folder {out_dir}: "
                         f"{err.strerror or err}") from None
    taken_over = stack.enter_context(folder_lock(out_dir))
    notes = ([taken_over] if taken_over else []) + tidy_run_folder(out_dir)
    trace_path = out_dir / f"trace.{layout}"
    present = [name for name in RUN_FILES if (out_dir / name).exists()]
    kept: list[StepRecord] = []
    if resume is None and present and not overwrite:
        resume_hint = (f"continue it with --resume {out_dir / 'checkpoint.npz'} and more "
                       f"--steps, " if "checkpoint.npz" in present else "")
        raise ValueError(f"{out_dir} already holds a run ({', '.join(present)}); {resume_hint}"
                         f"replace it with --overwrite (overwrite=True), or choose another "
                         f"--out")
    if resume is None and present:      # overwrite: the old run stays until the new is whole
        out_dir = stack.enter_context(replacing_run(out_dir, present))
        trace_path = out_dir / f"trace.{layout}"
    elif resume is not None:
        _check_folder_run(out_dir, identity, allow_changes)
        if start > 0:
            kept, note = _kept_trace(trace_path, start)
            notes += [note] if note else []
    write_text(out_dir / "run.json", json.dumps(run_info(settings, start, identity), indent=2,
                                                sort_keys=True) + "\n")
    if resume is not None:
        write_text(trace_path, trace_header(layout, lr=lr) + "".join(format_record(r, layout)
                                                              for r in kept))
    writer = TraceWriter(trace_path, layout, append=resume is not None, lr=lr)
    return Outputs(out_dir, writer, kept, notes)


def _kept_trace(trace_path: Path, start: int) -> tuple[list[StepRecord], str]:
    """The trace's records before ``start`` (the checkpoint's step) and a note on what was
    dropped; refuses a trace that does not hold every one of those steps."""
    if not trace_path.exists():
        raise ValueError(f"cannot resume at step {start}: there is no {trace_path} with steps "
                         f"0..{start - 1}; resume with --out set to the folder that holds the "
                         f"run's trace")
    text = trace_path.read_bytes().decode("utf-8", errors="replace")
    torn = bool(text) and not text.endswith("\n")
    records = read_trace(trace_path, drop_torn_tail=True)
    kept = [r for r in records if r.step < start]
    if len(kept) < start:     # read_trace refused gaps, repeats and disorder: it stops short
        first = len(kept)
        missing = f"step {first} is" if first == start - 1 else f"steps {first}..{start - 1} are"
        raise ValueError(f"cannot resume at step {start}: {trace_path} "
                         f"{'holds no steps' if not kept else f'ends at step {first - 1}'}, so "
                         f"{missing} missing; the resumed trace would have a gap (resume from "
                         f"a checkpoint at or before step {first}, or from the start)")
    dropped = len(records) - len(kept)
    parts = ([f"{dropped} step(s) after step {start - 1}"] if dropped else []) + \
        (["a last line torn by an interruption"] if torn else [])
    note = (f"{trace_path}: dropped {' and '.join(parts)}; the trace continues from the "
            f"checkpoint's step {start}") if parts else ""
    return kept, note


def _check_folder_run(out_dir: Path, identity: dict, allow_changes: frozenset) -> None:
    """The trace a resume continues must be this run's: ``run.json``'s configuration must
    match, as the checkpoint's does."""
    path = out_dir / "run.json"
    if not path.exists():
        return
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))["identity"]
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError) as err:
        raise ValueError(f"cannot resume into {out_dir}: {path} does not say which run its trace "
                         f"belongs to ({type(err).__name__}: {err}); resume into the folder of "
                         f"the checkpoint's run") from None
    check_same_config(f"{path} (the run whose trace would continue)", recorded, identity,
                      allow_changes)


def run_info(settings: dict, start: int, identity: dict) -> dict:
    return {"fpsim": _fpsim_version, "python": sys.version.split()[0],
            **backend.versions(), "ml_dtypes": _version_of("ml_dtypes"),
            "platform": platform.platform(), "backend": backend.name(), "resumed_at": start,
            "config": settings, "identity": identity}


def finish_run_json(out_dir: Path, result, settings: dict, start: int,
                     identity: dict) -> None:
    info = run_info(settings, start, identity)
    info["summary"] = {
        "steps": len(result.records), "final_loss": _json_number(result.records[-1].loss),
        "loss_sha256": result.loss_hash, "skipped_steps": sum(r.skipped for r in result.records),
        "nonfinite_loss_steps": result.nonfinite_steps[:100],
        "final_scale": _json_number(result.scaler_state.scale),
    }
    write_text(out_dir / "run.json", json.dumps(info, indent=2, sort_keys=True) + "\n")


def _json_number(value: float):
    return value if xp.isfinite(value) else repr(float(value))


def _version_of(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"
