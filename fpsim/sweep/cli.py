"""``fpsim sweep`` and ``fpsim sweep-plot``.

    fpsim sweep sweeps/loss_scale.toml --out sweeps/loss_scale [--workers N | --scheduler ADDR]
    fpsim sweep-plot sweeps/loss_scale --x scaler --y lr --facet policy [--outcome final_loss]

The whole spec is checked before anything runs; a problem is one line and exit status 2.
"""
from __future__ import annotations

import argparse
import re
import sys

from ..train.cli import add_backend_option
from .phase import PLOTTED, phase_diagram
from .run import run_sweep
from .spec import load_spec

__all__ = ["register", "run", "COMMANDS"]

COMMANDS = ("sweep", "sweep-plot")
SCHEDULER_PROTOCOLS = ("tcp", "tls", "ws", "wss", "ucx")
# [PROTOCOL://]HOST:PORT, HOST a name, an IPv4 address or an IPv6 one in brackets
_SCHEDULER_ADDRESS = re.compile(r"(?:(?P<protocol>[a-z]+)://)?"
                                r"(?P<host>[A-Za-z0-9][A-Za-z0-9._-]*|\[[0-9A-Fa-f:.]+\])"
                                r":(?P<port>[0-9]{1,5})")


def register(commands) -> None:
    p = commands.add_parser("sweep", help="run many training configurations on Dask",
                            description="Run every cell of a sweep (a TOML file: [base] "
                            "fields of fpsim train, [grid] and [zip] axes) that is not yet "
                            "done in --out, on a local Dask cluster or an existing one.")
    p.add_argument("spec", help="the sweep's TOML file")
    p.add_argument("--out", required=True, help="folder for sweep.json, results, cells/")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes of the local cluster, at most 4 per CPU core and "
                        "never more than the cells to run (default: the CPU count)")
    p.add_argument("--scheduler", default=None,
                   help="address of a running Dask scheduler (tcp://HOST:8786) to use instead "
                        "(default: none, a local cluster)")
    add_backend_option(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary")
    f = commands.add_parser("sweep-plot", help="draw a sweep's phase diagram",
                            description="Heatmap of one outcome over two axes of a sweep, "
                            "PNG and SVG.")
    f.add_argument("folder", help="the sweep's --out folder")
    f.add_argument("--x", required=True, help="axis along x")
    f.add_argument("--y", required=True, help="axis along y")
    f.add_argument("--facet", default=None,
                   help="axis with one panel per value (default: none, one panel)")
    f.add_argument("--outcome", default="outcome", help=f"what to draw: {', '.join(PLOTTED)}")
    f.add_argument("--out", default=None, help="file stem (default FOLDER/phase_OUTCOME)")


def run(args: argparse.Namespace) -> int:
    """Exit status: 0 when every cell has a row (failed cells included), 1 when some cells
    could not run, 130 on Ctrl-C. Bad input raises ValueError (status 2 from fpsim.cli)."""
    if args.command == "sweep-plot":
        written = phase_diagram(args.folder, args.x, args.y, outcome=args.outcome,
                                facet=args.facet, out=args.out)
        print("wrote " + ", ".join(str(p) for p in written))
        return 0
    scheduler = None if args.scheduler is None else check_scheduler_address(args.scheduler)
    spec = load_spec(args.spec)

    def announce(line: str) -> None:
        # the plan (cells, workers started) unless --quiet; a stale lock taken over always
        if line.startswith("note:"):
            print(f"fpsim sweep: {line}", file=sys.stderr, flush=True)
        elif not args.quiet:
            print(line, flush=True)

    try:
        summary = run_sweep(spec, args.out, workers=args.workers, scheduler=scheduler,
                            progress=False if args.quiet else None, announce=announce,
                            backend_name=args.backend)
    except KeyboardInterrupt:
        print(f"fpsim sweep: interrupted; {args.out} holds the finished cells: rerun the same "
              f"command to resume")
        return 130
    if not args.quiet:
        print(summary.line())
    return 1 if summary.not_run else 0


def check_scheduler_address(text: str) -> str:
    """``text`` if it has the form of a Dask scheduler's address, else a ValueError saying
    which forms are accepted (before any work: Dask's own message comes after a wait)."""
    found = _SCHEDULER_ADDRESS.fullmatch(text.strip())
    if found is None or found["protocol"] not in (None, *SCHEDULER_PROTOCOLS) or \
            not 1 <= int(found["port"]) <= 65535:
        raise ValueError(f"--scheduler {text!r} is not a Dask scheduler address: give HOST:PORT "
                         f"or PROTOCOL://HOST:PORT ({', '.join(SCHEDULER_PROTOCOLS)}; e.g. "
                         f"tcp://10.0.0.5:8786), or leave --scheduler out for a local cluster")
    return text.strip()
