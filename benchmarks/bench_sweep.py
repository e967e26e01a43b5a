"""Sweep throughput on Dask: cells per second with 1 and 2 local worker processes, and the
per-cell overhead against the cell's own training time.

Each cell is one `fpsim train` run of about a second (a 2-hidden-layer MLP, ``--steps``
steps; the seed is the axis, so every cell does the same work). For each worker count a local
cluster is started first (its start-up is reported, not counted), then rounds of the sweep
run on it into fresh folders, the worker counts taking turns round by round so that load from
other processes disturbs them alike; the fastest round of each counts. Each round also runs the
cells on plain process pools (below), in turn with the sweeps.

- cells/s = cells / the sweep's wall time (connect, check, submit, run, write every file);
- speed-up = cells/s with 2 workers / cells/s with 1 (target, issue 14: >= 1.7 on 2 cores);
- overhead per cell = (1-worker wall time - the sum of the cells' own training times, the
  ``wall_time`` column, measured inside the workers) / cells, as a fraction of the mean cell
  time (target: <= 5% for cells of >= 1 s);
- busy = the sum of the cells' own times / (workers x wall time): how much of the wall time the
  workers spent training;
- machine ceiling = the same cells run by a plain process pool of 1 and of 2 processes (no
  Dask): what running two cells at once on this machine gives at best (a VM's two CPUs may
  share a core or its caches, and other jobs take them). The sweep's speed-up over this
  ceiling is the part Dask and the sweep keep.

On a machine shared with other jobs the speed-up can fall short while busy stays near 100%:
then the cells themselves ran slower (the mean cell time grows with 2 workers), the cores were
taken, and the sweep's own part is not the cause. The load average is printed for that reason.

Run: python benchmarks/bench_sweep.py [--cells N] [--steps S] [--repeat R] [--quick]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import csv
import math
import multiprocessing
import os
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

# The pool's processes get one BLAS thread, like the sweep's workers (set before NumPy loads).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from fpsim.sweep import expand, parse_spec, run_sweep  # noqa: E402  (after the thread settings)
from fpsim.sweep.cells import run_cell  # noqa: E402
from fpsim.sweep.run import local_cluster  # noqa: E402

SPEC = """
[sweep]
name = "bench"
[base]
data = "teacher"
samples = 1024
hidden = "32,32"
steps = {steps}
[grid]
seed = {seeds}
"""


def _cell_seconds(folder: Path) -> list[float]:
    with open(folder / "results.csv", newline="") as handle:
        return [float(row["wall_time"]) for row in csv.DictReader(handle)]


def _pool(processes: int):
    """A plain process pool (no Dask), started and warmed up."""
    pool = concurrent.futures.ProcessPoolExecutor(processes,
                                                  mp_context=multiprocessing.get_context("spawn"))
    list(pool.map(_warm_up, range(processes)))
    return pool


def _warm_up(_) -> None:
    import fpsim.sweep.cells  # noqa: F401


def _pool_seconds(pool, cells) -> float:
    began = time.perf_counter()
    list(pool.map(run_cell, cells))
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=8, help="cells per sweep (8)")
    parser.add_argument("--steps", type=int, default=200, help="training steps per cell (200)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per worker count (3)")
    parser.add_argument("--quick", action="store_true", help="4 cells of 30 steps, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.cells, args.steps, args.repeat = 4, 30, 1
    spec = parse_spec(SPEC.format(steps=args.steps, seeds=list(range(args.cells))), "bench")
    print(f"load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
          f" on {os.cpu_count()} CPUs")
    counts = (1, 2)
    best = {n: math.inf for n in counts}
    pool = {n: math.inf for n in counts}
    cell_times = {}
    with ExitStack() as stack, tempfile.TemporaryDirectory() as scratch:
        clusters, pools = {}, {}
        for n in counts:
            began = time.perf_counter()
            clusters[n] = stack.enter_context(local_cluster(n))
            print(f"local cluster of {n} worker(s) started in {time.perf_counter() - began:.2f} s")
            pools[n] = stack.enter_context(_pool(n))
        for round_ in range(args.repeat + 1):          # round 0 warms the workers up
            for n in counts:
                seconds = _pool_seconds(pools[n], expand(spec))
                if round_:
                    pool[n] = min(pool[n], seconds)
                out = Path(scratch) / f"r{round_}w{n}"
                began = time.perf_counter()
                summary = run_sweep(spec, out, scheduler=clusters[n].scheduler_address,
                                    progress=False)
                seconds = time.perf_counter() - began
                if summary.not_run:
                    raise SystemExit(f"cells did not run: {summary.not_run}")
                if round_ and seconds < best[n]:
                    best[n] = seconds
                    cell_times[n] = _cell_seconds(out)
    print(f"\n{args.cells} cells of {args.steps} steps; fastest of {args.repeat} round(s)")
    print(f"{'workers':>8} {'wall s':>8} {'cells/s':>8} {'mean cell s':>12} {'busy':>6}")
    for n in counts:
        mean_cell = math.fsum(cell_times[n]) / len(cell_times[n])
        busy = math.fsum(cell_times[n]) / (n * best[n])
        print(f"{n:>8} {best[n]:>8.2f} {args.cells / best[n]:>8.3f} {mean_cell:>12.3f} "
              f"{busy:>6.1%}")
    speedup = best[1] / best[2]
    own = math.fsum(cell_times[1])
    overhead = (best[1] - own) / args.cells
    mean_cell = own / args.cells
    ceiling = pool[1] / pool[2]
    print(f"\nspeed-up, 2 workers against 1: {speedup:.2f}x (target >= 1.7)")
    print(f"machine ceiling, a plain pool of 2 processes against 1: {ceiling:.2f}x "
          f"({pool[1]:.2f} s, {pool[2]:.2f} s); the sweep keeps {speedup / ceiling:.0%} of it")
    print(f"load average (1 min) after: {os.getloadavg()[0]:.2f}")
    print(f"overhead per cell (1 worker): {overhead * 1e3:.1f} ms = {overhead / mean_cell:.1%} "
          f"of a {mean_cell:.2f} s cell (target <= 5% for cells >= 1 s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
