"""The paper's experiments, rerunnable: ``reproduce()`` and ``fpsim reproduce``.

Each experiment is a function ``run(ctx) -> Result`` registered under a short name. It
writes its figures (PNG and SVG, through ``fpsim.plots``) into ``ctx.out`` and returns every
number it shows. ``reproduce`` runs the chosen experiments in order and writes
``summary.md`` and ``summary.json``. Everything but wall-clock timings is identical on every
machine; timings go to ``timings.json`` and ``timings.md`` alone.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

__all__ = ["Context", "Result", "Experiment", "ExperimentsFailed", "REGISTRY", "BROKEN",
           "register", "reproduce", "names"]


@dataclass(frozen=True)
class Context:
    """What an experiment may use: the output folder, quick mode (about a minute in all on
    two cores, for CI and notebooks), and a progress callback taking a short message."""

    out: Path
    quick: bool = False
    progress: Callable[[str], None] = lambda message: None


@dataclass
class Result:
    """``numbers``: every number an experiment shows (JSON-serialisable, deterministic);
    ``figures``: file names written into the output folder; ``summary``: a markdown paragraph
    (what was run, what it shows, why); ``timings``: wall-clock numbers (machine-dependent,
    kept out of ``numbers``; ``timing_table`` shows them, in ``timings.md``)."""

    name: str
    title: str
    numbers: dict
    figures: list[str]
    summary: str
    table: str = ""
    timings: dict = field(default_factory=dict)
    timing_table: str = ""


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    run: Callable[[Context], Result]


REGISTRY: dict[str, Experiment] = {}


def register(name: str, title: str):
    def wrap(run: Callable[[Context], Result]) -> Callable[[Context], Result]:
        REGISTRY[name] = Experiment(name, title, run)
        return run

    return wrap


class ExperimentsFailed(RuntimeError):
    """Some experiments could not be imported or raised while running. ``failures`` maps each
    name to its error message; the others ran and their outputs are written."""

    def __init__(self, failures: dict[str, str], done: list[str]):
        self.failures, self.done = failures, done
        lines = [f"  {name}: {message}" for name, message in failures.items()]
        super().__init__(f"{len(failures)} experiment(s) failed (the other {len(done)} ran and "
                         f"their outputs are written):\n" + "\n".join(lines))


# Experiment modules that failed to import, name -> message: one broken module must not take
# ``reproduce`` (or ``--list``) down with it.
BROKEN: dict[str, str] = {}


def _module_names() -> list[str]:
    import pkgutil

    return [m.name for m in pkgutil.iter_modules(__path__)
            if not m.name.startswith("_") and m.name != "cli"]


def _load_all() -> None:
    """Import every experiment module in this package; importing one registers it (a module
    registers the experiment of its own name). Import errors are kept in ``BROKEN``."""
    import importlib

    for name in _module_names():
        if name in REGISTRY or name in BROKEN:
            continue
        try:
            importlib.import_module(f"{__name__}.{name}")
        except Exception as err:  # noqa: BLE001 - reported by reproduce, not swallowed
            BROKEN[name] = f"import failed: {type(err).__name__}: {err}"


# The paper's order; experiments not listed here come after, by name.
_ORDER = ["underflow", "loss_curves", "master_weights", "overflow", "bf16", "recipes",
          "accumulation"]


def names(*, include_broken: bool = False) -> list[str]:
    """The experiments in the paper's order; ``include_broken`` adds those whose module failed
    to import (``BROKEN``)."""
    _load_all()
    found = set(REGISTRY) | (set(BROKEN) if include_broken else set())
    return sorted(found, key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))


def reproduce(out: "str | Path" = "figures", *, quick: bool = False,
              only: list[str] | None = None,
              progress: Callable[[str], None] | None = None,
              on_start: Callable[[str], None] | None = None) -> list[Result]:
    """Run the experiments (all, or those named in ``only``) and write their figures,
    ``summary.md``, ``summary.json`` and ``timings.json`` into ``out``. ``progress`` receives
    short messages; ``on_start(name)`` is called as each experiment begins (a progress bar's
    hook).

    An experiment that fails to import or raises does not stop the others: they run, their
    outputs and summaries are written, and then ``ExperimentsFailed`` names every failure."""
    available = names(include_broken=True)
    chosen = available if not only else list(only)
    unknown = [n for n in chosen if n not in available]
    if unknown:
        raise ValueError(f"unknown experiment(s) {', '.join(map(repr, unknown))}; valid names: "
                         f"{', '.join(available)}")
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"cannot write the output folder {out}: {err.strerror or err}") from None
    report = progress or (lambda message: None)
    ctx = Context(out, quick, report)
    results, timings, failures = [], {}, {}
    for index, name in enumerate(chosen, start=1):
        if name in BROKEN:
            failures[name] = BROKEN[name]
            report(f"[{index}/{len(chosen)}] {name}: skipped, {BROKEN[name]}")
            continue
        experiment = REGISTRY[name]
        if on_start is not None:
            on_start(name)
        report(f"[{index}/{len(chosen)}] {experiment.title}")
        began, cpu_began = time.perf_counter(), time.process_time()
        try:
            result = experiment.run(ctx)
        except Exception as err:  # noqa: BLE001 - collected, reported, raised at the end
            failures[name] = f"{type(err).__name__}: {err}"
            report(f"[{index}/{len(chosen)}] {name} failed: {failures[name]}")
            continue
        timings[name] = {"seconds": round(time.perf_counter() - began, 2),
                         "cpu_seconds": round(time.process_time() - cpu_began, 2),
                         **result.timings}
        results.append(result)
    _write_summaries(out, results, quick, timings)
    if failures:
        raise ExperimentsFailed(failures, [r.name for r in results])
    return results


def _write_summaries(out: Path, results: list[Result], quick: bool, timings: dict) -> None:
    mode = "quick" if quick else "full"
    payload = {"mode": mode, "experiments": {
        r.name: {"title": r.title, "figures": r.figures, "numbers": r.numbers} for r in results}}
    (out / "summary.json").write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    (out / "timings.json").write_text(json.dumps({"mode": mode, "experiments": timings},
                                                 indent=2, sort_keys=True) + "\n")
    lines = ["# Mixed Precision Training, reproduced with fpsim", "",
             f"Mode: {mode} (`fpsim reproduce{' --quick' if quick else ''}`). Every number "
             f"below is in `summary.json`; figures are PNG and SVG beside this file.", ""]
    for r in results:
        lines += [f"## {r.title}", "", r.summary.strip(), ""]
        if r.table:
            lines += [r.table.strip(), ""]
        lines += [f"![{r.title}]({fig})" for fig in r.figures if fig.endswith(".png")] + [""]
    (out / "summary.md").write_text("\n".join(lines))
    timing_lines = ["# Wall-clock timings (these, and only these, differ between machines)", "",
                    "| experiment | seconds | CPU seconds (all threads) |", "|---|---|---|"]
    timing_lines += [f"| {name} | {t['seconds']} | {t['cpu_seconds']} |"
                     for name, t in timings.items()]
    for r in results:
        if r.timing_table:
            timing_lines += ["", f"## {r.title}", "", r.timing_table.strip()]
    (out / "timings.md").write_text("\n".join(timing_lines) + "\n")
