"""Keeps the run times the docs state for `fpsim reproduce` (docs/reproduce.md, the README's
quick start) honest: runs it (quick, or full with ``--full``) in a fresh process, measures
wall-clock and CPU seconds (the child's user + system time), and compares each experiment's
CPU seconds (``timings.json``'s ``cpu_seconds``) with ``MEASURED_SECONDS`` in
``fpsim/experiments/cli.py``, whose sums the docs state and from which the progress bar's
ETA starts.

Target: the whole run's CPU time within a factor of 1.5 of the stated total, either way
(slower: the docs promise too little; faster: it has gone stale). CPU time, because a
shared machine stretches wall-clock time several-fold but CPU time only a little; the script
prints wall-clock time and the load average beside it, and `--repeat N` keeps the fastest of
N runs.

Run: python benchmarks/bench_reproduce.py [--full] [--repeat N]
Exit status 0: within the target; 1: outside it (the table says which experiments moved).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fpsim.experiments.cli import MEASURED_SECONDS  # noqa: E402

TOLERANCE = 1.5


def measure(quick: bool) -> dict:
    """One `fpsim reproduce` in a child process: wall and CPU seconds, and the per-experiment
    seconds it wrote to timings.json."""
    with tempfile.TemporaryDirectory(prefix="fpsim-bench-reproduce-") as out:
        command = [sys.executable, "-m", "fpsim", "reproduce", "--quiet", "--out", out]
        if quick:
            command.append("--quick")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        subprocess.run(command, check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        wall = time.perf_counter() - began
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        timings = json.loads((Path(out) / "timings.json").read_text())["experiments"]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu,
            "experiments": {name: t["cpu_seconds"] for name, t in timings.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="time the full run (minutes)")
    parser.add_argument("--repeat", type=int, default=1, help="keep the fastest of N runs")
    args = parser.parse_args()
    mode = "full" if args.full else "quick"
    stated = MEASURED_SECONDS[mode]
    runs = [measure(quick=not args.full) for _ in range(max(1, args.repeat))]
    best = min(runs, key=lambda r: r["cpu"])
    print(f"fpsim reproduce{'' if args.full else ' --quick'}: {best['wall']:.1f} s wall, "
          f"{best['cpu']:.1f} s CPU (load average now {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} cores)")
    print(f"{'experiment':<16}{'stated CPU s':>14}{'measured':>10}{'ratio':>8}")
    for name, seconds in best["experiments"].items():
        expected = stated.get(name)
        ratio = f"{seconds / expected:.2f}" if expected else "-"
        print(f"{name:<16}{expected if expected is not None else '-':>14}{seconds:>10.1f}"
              f"{ratio:>8}")
    total_stated = sum(stated[name] for name in best["experiments"] if name in stated)
    total = sum(best["experiments"].values())
    ratio = total / total_stated
    verdict = "ok" if 1 / TOLERANCE <= ratio <= TOLERANCE else "OUTSIDE the target"
    print(f"{'all':<16}{total_stated:>14.1f}{total:>10.1f}{ratio:>8.2f}  {verdict} "
          f"(target: within {TOLERANCE}x of the stated total)")
    return 0 if verdict == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
