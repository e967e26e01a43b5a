"""Running a sweep on Dask: a local cluster of worker processes, or an existing cluster.

The client (this process) is the only writer: workers return each cell's row and files, the
client writes them under ``DIR/cells/KEY/`` (``result.json`` last, so a cell folder with a
``result.json`` is complete) and rewrites ``results.csv`` from the finished cells, whole and
atomically, as cells finish. So an interrupted sweep leaves complete rows only, rerunning the
same command skips the cells already done, and workers on other machines need no shared disk.
Each table judges every finished cell against its baseline where the sweep has one and it has
finished (``fpsim.sweep.baseline``), so the last table judges against every baseline.

A worker process that dies mid-cell (killed, out of memory) is noticed by the scheduler, which
gives the cell to a worker again (up to ``distributed.scheduler.allowed-failures`` times, 3 by
default); an exception that is not the cell's own result (an ``OSError`` on the worker, say)
is retried ``retries`` times. A cell that still does not run has no row, is named in the
summary, and the next run tries it again.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import backend
from .._version import __version__
from ..train.progress import progress_bar
from ..files import LOCK_NAME, folder_lock, write_text
from ..options import check_count, check_instance, check_path
from .baseline import find_baselines, judge
from .cells import Cell, cell_count, expand, run_cell
from .record import SWEEP_FORMAT, cell_row_text, read_cell_row, read_sweep_record
from .results import HEAD, OUTCOMES, TABLE_METRICS, write_tables
from .spec import SweepSpec

__all__ = ["run_sweep", "SweepSummary", "SWEEP_FORMAT", "local_cluster"]

PARQUET_EVERY_S = 2.0    # rewrite results.parquet at most this often (results.csv: every cell)
# One sweep's cells are listed, keyed and kept in memory at once, and each is a training run:
# beyond this many the sweep is refused (split it) rather than left to exhaust the machine.
MAX_CELLS = 100_000
WORKERS_PER_CORE = 4     # a local cluster's ceiling: more processes than this only contend
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass
class SweepSummary:
    out: Path
    cells: int
    earlier: int                       # cells done by an earlier run of the same sweep
    outcomes: dict = field(default_factory=dict)
    not_run: dict = field(default_factory=dict)   # cell index -> why it could not run
    seconds: float = 0.0
    workers: int = 0
    tables: list = field(default_factory=list)

    def line(self) -> str:
        counts = ", ".join(f"{self.outcomes.get(o, 0)} {o}" for o in OUTCOMES)
        done = self.cells - len(self.not_run)
        if self.earlier == self.cells:
            how = "all from earlier runs, nothing to run"
        else:
            how = (f"{done - self.earlier} run now on {self.workers} worker(s) in "
                   f"{self.seconds:.1f} s, {self.earlier} from earlier runs")
        text = (f"sweep: {done} of {self.cells} cells: {counts} ({how}); wrote "
                f"{', '.join(str(p) for p in self.tables)}")
        if self.not_run:
            text += (f"\n{len(self.not_run)} cell(s) could not run (rerun the same command "
                     f"to retry them): " + "; ".join(f"cell {i}: {why}" for i, why
                                                     in sorted(self.not_run.items())[:5]))
        return text


def columns(spec: SweepSpec) -> list[str]:
    """The table's columns: cell and key, the axes, the other training fields, the results."""
    return [*HEAD, *spec.axes, *(name for name in sorted(spec.base)), *TABLE_METRICS]


def check_folder(spec: SweepSpec, out: Path, backend_name: str = "numpy") -> None:
    """``out`` must be new, empty, or hold this same sweep (made by this fpsim version, on
    this backend): a sweep's results are never replaced by another's, nor its cells mixed
    with cells computed elsewhere. Writes nothing."""
    record = out / "sweep.json"
    if record.exists():
        earlier = read_sweep_record(record)
        if earlier["fpsim"] != __version__:      # first: a version's specs hold other fields
            raise ValueError(f"{out} was swept with fpsim {earlier['fpsim']}, this is fpsim "
                             f"{__version__} (its cells' configurations and keys differ); "
                             f"choose another --out, or resume it with fpsim "
                             f"{earlier['fpsim']}")
        if earlier["spec"] != spec.as_dict():
            raise ValueError(f"{out} holds a different sweep (its sweep.json has another spec); "
                             f"choose another --out, or rerun that sweep's own spec to resume")
        if earlier["backend"] != backend_name:
            raise ValueError(f"{out} was swept on the {earlier['backend']} backend, this run "
                             f"asks for {backend_name}; resume it with --backend "
                             f"{earlier['backend']}, or choose another --out")
    elif out.exists() and (not out.is_dir() or any(p.name != LOCK_NAME for p in out.iterdir())):
        raise ValueError(f"{out} is not an empty folder and holds no sweep; choose a new or "
                         f"empty --out")


@contextlib.contextmanager
def locked_folder(spec: SweepSpec, out: Path, note, backend_name: str = "numpy"):
    """Create ``out`` and hold its lock (``fpsim.files.folder_lock``, as ``fpsim train`` and
    ``fpsim reproduce`` do) while the sweep writes there: a second sweep into ``out`` is
    refused (``FolderInUse``, naming the process). ``note`` receives the line saying a stale
    lock, left by a process killed outright, was taken over. The folder is checked again under
    the lock: another sweep may have written it since the first check."""
    with contextlib.ExitStack() as stack:
        try:
            out.mkdir(parents=True, exist_ok=True)
            taken_over = stack.enter_context(folder_lock(out))
        except OSError as err:     # a read-only folder: found before any worker starts
            raise ValueError(f"cannot write the output folder {out}: "
                             f"{err.strerror or err}") from None
        if taken_over:
            note(taken_over)
        check_folder(spec, out, backend_name)
        yield


def _result_path(out: Path, cell: Cell) -> Path:
    """A cell's ``result.json``: written last, so the cell is finished when it exists."""
    return out / "cells" / cell.key / "result.json"


def finished_rows(cells: list[Cell], out: Path) -> dict[int, dict]:
    """The rows of the cells already finished in ``out``, by cell index, each checked as it
    is read (``read_cell_row``)."""
    done = {}
    for cell in cells:
        path = _result_path(out, cell)
        if path.exists():
            done[cell.index] = dict(read_cell_row(path, cell.key, cell.config), cell=cell.index)
    return done


def write_results(out: Path, spec: SweepSpec, done: dict[int, dict], baselines: dict[int, int],
                  *, parquet: bool = True) -> tuple[list[Path], dict[int, dict]]:
    """The tables of the finished cells (``done``: each cell's own row), each judged against
    its baseline (``baselines``, from ``find_baselines``) where that has finished: the paths
    written and the table's rows by cell."""
    rows = judge(list(done.values()), baselines)
    return (write_tables(out, rows, columns(spec), parquet=parquet),
            {row["cell"]: row for row in rows})


def write_record(spec: SweepSpec, cells: list[Cell], out: Path, backend_name: str) -> None:
    """Write ``sweep.json`` (the spec, the cells, the backend, the versions) into the locked
    ``out``."""
    (out / "cells").mkdir(exist_ok=True)
    info = {"format": SWEEP_FORMAT, "version": 1, "fpsim": __version__, "spec": spec.as_dict(),
            "source": spec.source, "backend": backend_name, "versions": _versions(),
            "cells": [{"cell": c.index, "key": c.key, "axes": c.axes} for c in cells]}
    write_text(out / "sweep.json", json.dumps(info, indent=2, sort_keys=True,
                                              allow_nan=False) + "\n")


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {"python": sys.version.split()[0],
                                    "platform": platform.platform()}
    for package in ("numpy", "ml_dtypes", "dask", "distributed", "pyarrow"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = None
    return found


def _save_cell(out: Path, cell: Cell, payload: dict) -> dict:
    result = _result_path(out, cell)
    result.parent.mkdir(parents=True, exist_ok=True)
    for name, text in payload["files"].items():
        write_text(result.parent / name, text)
    row = payload["row"]
    write_text(result, cell_row_text(row))
    return row


@contextlib.contextmanager
def local_cluster(workers: int):
    """A Dask cluster on this machine: ``workers`` processes of one thread each, their BLAS
    on one thread, logs silenced (a cell that fails is reported through its result; shutdown
    races log harmless errors); its status pages (which Dask always serves) on a free local
    port, so that two sweeps on one machine do not collide. The worker processes ignore
    Ctrl-C (they inherit an ignored SIGINT): this process handles it and closes them."""
    from distributed import LocalCluster

    with _sigint_ignored_by_children():
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL,
                               env=ONE_THREAD)
    with cluster:
        yield cluster


@contextlib.contextmanager
def _sigint_ignored_by_children():
    """Ignore SIGINT while child processes start (an ignored signal stays ignored in a child,
    across exec), then restore this process's handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _client(workers: int | None, scheduler: str | None):
    from distributed import Client

    if scheduler is not None:
        try:
            client = Client(scheduler, timeout="10s")
        except (OSError, TimeoutError) as err:
            raise ValueError(f"cannot reach the Dask scheduler at {scheduler!r}: {err}") from None
        with client:
            yield client
        return
    with local_cluster(workers) as cluster, Client(cluster) as client:
        yield client


def installed_version() -> str:
    """The fpsim version of the process running this (on a worker: the worker's)."""
    return __version__


def backend_problem(backend_name: str) -> "str | None":
    """Why this process (on a worker: the worker) cannot compute on ``backend_name``, or
    None."""
    try:
        with backend.use_backend(backend_name):
            return None
    except ValueError as err:
        return str(err)


def _check_versions(client, backend_name: str) -> int:
    """The number of workers; every worker must run this fpsim version and have the
    sweep's backend."""
    found = client.run(installed_version)
    other = {addr: v for addr, v in found.items() if v != __version__}
    if other:
        addr, version = next(iter(other.items()))
        raise ValueError(f"Dask worker {addr} runs fpsim {version}, this is fpsim "
                         f"{__version__}: install the same version on every worker")
    problems = {addr: why for addr, why in client.run(backend_problem, backend_name).items()
                if why}
    if problems:
        addr, why = next(iter(problems.items()))
        raise ValueError(f"Dask worker {addr} cannot run the sweep: {why}")
    return len(found)


def local_worker_limit() -> int:
    """The most worker processes a local cluster may start on this machine."""
    return WORKERS_PER_CORE * max(1, os.cpu_count() or 1)


def run_sweep(spec: SweepSpec, out: "str | Path", *, workers: int | None = None,
              scheduler: str | None = None, progress: bool | None = None,
              retries: int = 2, announce=None, backend_name: str | None = None) -> SweepSummary:
    """Run every cell of ``spec`` not yet done in ``out``; returns the summary. ``workers``:
    processes of the local cluster (default: the CPU count; never more than the cells to
    run); ``scheduler``: the address of an existing Dask scheduler instead; ``backend_name``:
    what every cell computes on (default: this process's backend; recorded in sweep.json,
    and a folder swept on another is refused). ``announce``
    (a function of one line) hears the plan before any worker starts, and a note when a stale
    lock is taken over. Bad input raises ``TypeError`` (a wrong type) or ``ValueError`` before
    anything is written."""
    announce = announce or (lambda line: None)
    check_count("retries", retries, 0)
    if scheduler is not None and workers is not None:
        raise ValueError("--workers sizes the local cluster; with --scheduler the cluster's "
                         "own workers run the cells")
    limit = local_worker_limit()
    if workers is None:
        workers = max(1, os.cpu_count() or 1)
    if check_count("--workers", workers, 1) > limit:
        raise ValueError(f"--workers must be an integer from 1 to {limit} ({WORKERS_PER_CORE} "
                         f"per CPU core of this machine), got {workers!r}; for more workers "
                         f"start a Dask cluster and give --scheduler ADDRESS")
    check_instance("spec", spec, SweepSpec, "a SweepSpec (load_spec(path) reads one from a "
                                            "sweep file, parse_spec(text) from TOML)")
    out = check_path("out", out)
    count = cell_count(spec)
    if count > MAX_CELLS:
        raise ValueError(f"{spec.source}: the sweep has {count:,} cells, more than the "
                         f"{MAX_CELLS:,} one sweep accepts (each cell is a training run); split "
                         f"it into several sweeps, each into its own --out")
    backend_name = backend.name() if backend_name is None else backend_name
    # local workers are this machine: it must have the backend (a cluster's are asked)
    problem = backend_problem(backend_name) if scheduler is None else None
    if problem:
        raise ValueError(problem)
    cells = expand(spec)
    baselines = find_baselines({cell.index: cell.config for cell in cells})
    check_folder(spec, out, backend_name)
    began = time.perf_counter()
    with contextlib.ExitStack() as stack:
        client, n_workers = None, 0
        if scheduler is not None and not all(_result_path(out, c).exists() for c in cells):
            # an existing cluster is reached, and its workers' fpsim checked, before the
            # folder is made: a refused cluster leaves nothing behind
            client = stack.enter_context(_client(None, scheduler))
            n_workers = _check_versions(client, backend_name)
        stack.enter_context(locked_folder(spec, out, lambda text: announce(f"note: {text}"),
                                          backend_name))
        done = finished_rows(cells, out)
        pending = [cell for cell in cells if cell.index not in done]
        started = min(workers, len(pending)) if scheduler is None else None
        where = (f"{started} local worker process(es)" if scheduler is None
                 else f"the Dask cluster at {scheduler}")
        announce(f"sweep: {len(cells)} cells, {len(done)} done earlier, {len(pending)} to run"
                 + (f" on {where}" if pending else ""))
        # every cell done already: no cluster to start, the table is rewritten from the cells
        if pending and client is None:
            client = stack.enter_context(_client(started, scheduler))
            n_workers = _check_versions(client, backend_name)
        write_record(spec, cells, out, backend_name)
        summary = SweepSummary(out, len(cells), len(done), workers=n_workers)
        table: dict = {}
        try:
            if pending:
                _run_pending(client, pending, out, done, spec, baselines, summary, progress,
                             retries, backend_name)
        finally:
            summary.tables, table = write_results(out, spec, done, baselines)
    summary.seconds = time.perf_counter() - began
    for row in table.values():
        summary.outcomes[row["outcome"]] = summary.outcomes.get(row["outcome"], 0) + 1
    return summary


def _run_pending(client, pending, out, done, spec, baselines, summary, progress,
                 retries, backend_name) -> None:
    from distributed import as_completed

    futures = {}
    for cell in pending:
        future = client.submit(run_cell, cell, backend_name,
                               key=f"fpsim-cell-{cell.index}-{cell.key}",
                               retries=retries, pure=False)
        futures[future] = cell
    bar = progress_bar(summary.cells, summary.earlier, "cell", progress)
    table: dict = {}
    last_parquet = time.perf_counter()
    try:
        for future in as_completed(list(futures)):
            cell = futures.pop(future)
            if future.status != "finished":
                summary.not_run[cell.index] = _reason(future)
            else:
                payload = future.result()
                if payload["fpsim"] != __version__:
                    summary.not_run[cell.index] = f"a worker ran fpsim {payload['fpsim']}"
                else:
                    done[cell.index] = _save_cell(out, cell, payload)
                    # results.csv holds every finished cell the moment it is saved (a kill -9
                    # of this process loses no row); parquet, slower to write, follows at
                    # intervals and at the end
                    parquet = time.perf_counter() - last_parquet > PARQUET_EVERY_S
                    _, table = write_results(out, spec, done, baselines, parquet=parquet)
                    if parquet:
                        last_parquet = time.perf_counter()
            future.release()
            if bar is not None:
                bar.update(1)
                outcome = table[cell.index]["outcome"] if cell.index in done else "not run"
                bar.set_postfix_str(f"cell {cell.index}: {outcome}")
    finally:
        for future in futures:
            future.cancel()
        if bar is not None:
            bar.close()


def _reason(future) -> str:
    try:
        error = future.exception()
    except Exception as err:  # the cluster itself went away
        error = err
    return f"{type(error).__name__}: {error}".splitlines()[0][:300]
