"""``fpsim reproduce [--quick] [--only NAMES] [--out DIR]``: the paper's experiments, their
figures, ``summary.md`` and ``summary.json``."""
from __future__ import annotations

import argparse
import sys

__all__ = ["register", "run"]


def register(commands) -> None:
    p = commands.add_parser(
        "reproduce", help="rerun the paper's experiments: figures and a summary of every number",
        description="Rerun the experiments of 'Mixed Precision Training' (Micikevicius et al., "
                    "2018) and write their figures (PNG and SVG), summary.md and summary.json "
                    "into the output folder, the same bytes on every machine; wall-clock "
                    "timings go to timings.json and timings.md beside them (not tracked by "
                    "git in figures/). A progress bar with an ETA shows on a terminal.")
    p.add_argument("--quick", action="store_true",
                   help="smaller runs, about a minute on two cores (the numbers differ from a "
                        "full run but are just as deterministic)")
    p.add_argument("--only", default=None,
                   help="comma-separated experiment names (default: all; see --list)")
    p.add_argument("--out", default="figures", help="output folder")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bar or messages")


def run(args: argparse.Namespace) -> int:
    from . import BROKEN, REGISTRY, ExperimentsFailed, names, reproduce

    if args.list:
        for name in names(include_broken=True):
            print(f"{name:16} {REGISTRY[name].title if name in REGISTRY else BROKEN[name]}")
        return 0
    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    progress = None if args.quiet else (lambda message: print(message, file=sys.stderr,
                                                               flush=True))
    try:
        results = reproduce(args.out, quick=args.quick, only=only, progress=progress)
    except ExperimentsFailed as err:
        print(f"fpsim reproduce: {err}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"wrote {len(results)} experiment(s) to {args.out}/: summary.md, summary.json, "
              f"{sum(len(r.figures) for r in results)} figure files")
    return 0
