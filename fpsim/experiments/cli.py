"""``fpsim reproduce [--quick] [--only NAMES] [--out DIR]``: the paper's experiments, their
figures, ``summary.md`` and ``summary.json``.

On a terminal a progress bar shows the whole run and the current experiment, with an ETA;
off a terminal (a pipe, a log, CI) nothing but the final line is printed, as ``fpsim train``
does. The bars advance in *expected seconds*: ``MEASURED_SECONDS`` holds each experiment's
CPU time measured on the project's 2-core machine (the run times the README states), and
tqdm's rate rescales the ETA to this machine's pace as the run goes. An experiment reaches 100%
only when it has finished; one that runs longer than expected waits at 99%.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from ..train.cli import add_backend_option, chosen_backend

__all__ = ["register", "run", "MEASURED_SECONDS", "ProgressBars", "DEFAULT_OUT"]

# Where each mode writes unless --out says otherwise: the lessons in notebooks/ check their
# numbers against the full run's figures/summary.json, which a quick run must not replace.
DEFAULT_OUT = {"full": "figures", "quick": "figures/quick"}

# CPU seconds (all threads; `timings.json`'s "cpu_seconds") per experiment of
# `fpsim reproduce [--quick] --quiet` on the project's 2-core machine: the README's run times
# are their sums. CPU time, not wall-clock: the machine was shared while measuring, which
# stretches wall-clock time but hardly CPU time. benchmarks/bench_reproduce.py measures again.
MEASURED_SECONDS = {
    "quick": {"underflow": 1.2, "loss_curves": 9.2, "master_weights": 2.1, "overflow": 4.8,
              "bf16": 4.9, "recipes": 6.0, "accumulation": 2.4, "cnn": 6.1,
              "fp8": 7.9, "lstm_lm": 5.0, "transformer_lm": 6.7, "fp4": 9.4},
    "full": {"underflow": 1.2, "loss_curves": 50.7, "master_weights": 2.9, "overflow": 21.3,
             "bf16": 14.2, "recipes": 37.1, "accumulation": 6.7, "cnn": 30.4,
             "fp8": 14.7, "lstm_lm": 21.3, "transformer_lm": 22.3, "fp4": 26.9},
}


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
    p.add_argument("--out", default=None,
                   help="output folder (default: figures, or figures/quick with --quick, so "
                        "that quick numbers never replace the full run's)")
    p.add_argument("--overwrite", action="store_true",
                   help="let a run of one mode (quick or full) replace a folder holding a run "
                        "of the other (refused without this)")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    add_backend_option(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar or messages")


def run(args: argparse.Namespace) -> int:
    """Exit status 0 done, 1 an experiment failed; bad input raises ValueError (status 2)."""
    with chosen_backend(args.backend):
        return _reproduce_as_told(args)


def _reproduce_as_told(args: argparse.Namespace) -> int:
    from . import BROKEN, REGISTRY, ExperimentsFailed, names, reproduce

    if args.list:
        for name in names(include_broken=True):
            print(f"{name:16} {REGISTRY[name].title if name in REGISTRY else BROKEN[name]}")
        return 0
    only = None
    if args.only is not None:           # given, even empty: it must name an experiment
        only = [n.strip() for n in args.only.split(",") if n.strip()]
        if not only:
            raise ValueError(f"--only {args.only!r} names no experiment; give comma-separated "
                             f"names from {', '.join(names(include_broken=True))}, or leave "
                             f"--only out to run them all")
    if args.out is None:
        args.out = DEFAULT_OUT["quick" if args.quick else "full"]
    chosen = only or names(include_broken=True)
    measured = MEASURED_SECONDS["quick" if args.quick else "full"]
    bars = None
    if not args.quiet and _on_terminal():
        bars = ProgressBars({name: measured.get(name, 10.0) for name in chosen})  # drawn lazily
    began = time.perf_counter()
    try:
        results = reproduce(args.out, quick=args.quick, only=only, overwrite=args.overwrite,
                            progress=bars.message if bars else None,
                            on_start=bars.start if bars else None,
                            on_note=lambda text: print(f"fpsim reproduce: {text}",
                                                       file=sys.stderr, flush=True))
    except ExperimentsFailed as err:
        print(f"fpsim reproduce: {err}", file=sys.stderr)
        return 1
    finally:
        if bars is not None:
            bars.close()
    if not args.quiet:
        print(f"wrote {len(results)} experiment(s) to {args.out}/: summary.md, summary.json, "
              f"{sum(len(r.figures) for r in results)} figure files; "
              f"{time.perf_counter() - began:.0f} s (timings.md: per experiment)")
    return 0


def _on_terminal() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


class ProgressBars:
    """Two tqdm bars on stderr, the whole run and the current experiment, advanced twice a
    second by elapsed time against ``plan`` (name -> expected seconds). ``start(name)`` when an
    experiment begins (the first call draws the bars, so input refused before any experiment
    starts leaves the terminal alone), ``message(text)`` shows what it is doing, ``close()``
    at the end."""

    def __init__(self, plan: dict):
        self.plan = dict(plan)
        self.overall = self.current = None
        self.done, self.name, self.began = 0.0, None, 0.0
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.ticker = threading.Thread(target=self._tick, daemon=True)

    def _draw(self) -> None:
        from tqdm import tqdm

        style = dict(file=sys.stderr, dynamic_ncols=True, smoothing=0, unit="s",
                     bar_format="{desc} {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]"
                                "{postfix}")
        self.overall = tqdm(total=sum(self.plan.values()), desc="all experiments", position=0,
                            **style)
        self.current = tqdm(total=1.0, desc="", position=1, leave=False, **style)
        self.ticker.start()

    def start(self, name: str) -> None:
        with self.lock:
            if self.overall is None:
                self._draw()
            self._finish_current()
            self.name, self.began = name, time.monotonic()
            self.current.reset(total=self.plan.get(name, 10.0))
            self.current.set_description_str(name, refresh=False)
            self.current.set_postfix_str("", refresh=True)

    def message(self, text: str) -> None:
        with self.lock:
            if self.current is not None:
                self.current.set_postfix_str(text.strip().removeprefix(f"{self.name}: "))

    def close(self) -> None:
        self.stopped.set()
        if self.ticker.is_alive():
            self.ticker.join()
        with self.lock:
            if self.overall is None:
                return
            self._finish_current()
            self.current.close()
            self.overall.close()

    def _finish_current(self) -> None:
        if self.name is not None:
            self._advance(self.plan.get(self.name, 10.0))
            self.done += self.plan.get(self.name, 10.0)
            self.name = None

    def _advance(self, within: float) -> None:
        self.current.update(within - self.current.n)
        self.overall.update(self.done + within - self.overall.n)

    def _tick(self) -> None:
        while not self.stopped.wait(0.5):
            with self.lock:
                if self.name is not None:
                    expected = self.plan.get(self.name, 10.0)
                    self._advance(min(time.monotonic() - self.began, 0.99 * expected))
