"""The paper's experiments, rerunnable: ``reproduce()`` and ``fpsim reproduce``.

Each experiment is a function ``run(ctx) -> Result`` registered under a short name. It
writes its figures (PNG and SVG, through ``fpsim.plots``) into ``ctx.out`` and returns every
number it shows. ``reproduce`` runs the chosen experiments in order and writes
``summary.md`` and ``summary.json``. Everything but wall-clock timings is identical on every
machine; timings go to ``timings.json`` and ``timings.md`` alone. Every file is written
atomically (``fpsim.files``), and rerunning some experiments (``only``) into a folder that
holds a run keeps the others' sections in the summaries.
"""
from __future__ import annotations

import json
import signal
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import backend
from ..files import folder_lock, write_text
from ..train.run_folder import replacing_run, tidy_run_folder

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
    name to its error message; the others ran and their outputs are written, unless they were
    to replace a run (``kept``: the folder that keeps it)."""

    def __init__(self, failures: dict[str, str], done: list[str], kept: "Path | None" = None):
        self.failures, self.done = failures, done
        lines = [f"  {name}: {message}" for name, message in failures.items()]
        outcome = ("and their outputs are written" if kept is None else
                   f"but nothing was replaced: {kept} keeps its previous run")
        super().__init__(f"{len(failures)} experiment(s) failed (the other {len(done)} ran "
                         f"{outcome}):\n" + "\n".join(lines))


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
              on_start: Callable[[str], None] | None = None,
              on_note: Callable[[str], None] | None = None,
              overwrite: bool = False) -> list[Result]:
    """Run the experiments (all, or those named in ``only``) and write their figures,
    ``summary.md``, ``summary.json`` and ``timings.json`` into ``out``. ``progress`` receives
    short messages; ``on_start(name)`` is called as each experiment begins (a progress bar's
    hook); ``on_note`` receives what must not pass unseen, such as a stale lock taken over
    (default: ``progress``).

    With ``only``, the other experiments already summarised in ``out`` keep their sections of
    ``summary.md`` and ``summary.json``; a folder holding a run of the other mode (quick or
    full), or summaries that do not read back, is refused before anything runs, so numbers of
    the two modes never mix.

    A folder holding a run of the other mode is refused unless ``overwrite``. With
    ``overwrite``, a folder's finished run (its ``summary.json``) is kept until the new one is
    complete: the new one is written into a hidden folder inside ``out`` and its files moved
    in only when every experiment ran (``fpsim.train.run_folder``).

    An experiment that fails to import or raises does not stop the others: they run, their
    outputs and summaries are written, and then ``ExperimentsFailed`` names every failure."""
    available = names(include_broken=True)
    chosen = available if not only else list(only)
    unknown = [n for n in chosen if n not in available]
    if unknown:
        raise ValueError(f"unknown experiment(s) {', '.join(map(repr, unknown))}; valid names: "
                         f"{', '.join(available)}")
    out = Path(out)
    kept = _kept_sections(out, [n for n in available if n not in chosen], quick) if only else {}
    if not overwrite:
        _check_mode(out, quick)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"cannot write the output folder {out}: {err.strerror or err}") from None
    report = progress or (lambda message: None)
    replacing = overwrite and (out / "summary.json").is_file()
    with folder_lock(out) as taken_over:     # a second reproduce into ``out`` is refused
        for note in ([taken_over] if taken_over else []) + tidy_run_folder(out):
            (on_note or report)(f"note: {note}")
        with _noting_ctrl_c() as interrupted, \
                (replacing_run(out, None) if replacing else nullcontext(out)) as target:
            results, failures = _run_chosen(Context(target, quick, report), chosen, kept,
                                            on_start, interrupted)
            if failures and replacing:      # an incomplete new run replaces nothing
                raise ExperimentsFailed(failures, [r.name for r in results], kept=out)
    if failures:
        raise ExperimentsFailed(failures, [r.name for r in results])
    return results


@contextmanager
def _noting_ctrl_c():
    """Record each Ctrl-C (then raise ``KeyboardInterrupt`` as Python does). A Ctrl-C that
    lands while C++ code converts arguments (matplotlib's pybind11 wrappers) can come out as a
    ``TypeError`` instead; the record lets the runner still stop as for Ctrl-C rather than
    take it for a failed experiment. Only on the main thread with Python's own handler."""
    seen: list[int] = []
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield seen
        return

    def note_and_interrupt(signum, frame):
        seen.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, note_and_interrupt)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _run_chosen(ctx: Context, chosen: list[str], kept: dict,
                on_start: Callable[[str], None] | None,
                interrupted: list) -> tuple[list[Result], dict]:
    """Run ``chosen`` in order and write the summaries; returns the results and failures."""
    report, results, timings, failures = ctx.progress, [], {}, {}
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
            if interrupted:
                raise KeyboardInterrupt from err
            failures[name] = f"{type(err).__name__}: {err}"
            report(f"[{index}/{len(chosen)}] {name} failed: {failures[name]}")
            continue
        timings[name] = {"seconds": round(time.perf_counter() - began, 2),
                         "cpu_seconds": round(time.process_time() - cpu_began, 2),
                         **result.timings}
        results.append(result)
    _write_summaries(ctx.out, results, ctx.quick, timings, kept)
    return results, failures


def _check_mode(out: Path, quick: bool) -> None:
    """Refuse to write into a folder whose ``summary.json`` records a run of the other mode:
    quick numbers would silently replace full ones (or the reverse)."""
    json_path = out / "summary.json"
    if not json_path.exists():
        return
    try:
        previous = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return      # no numbers to keep: a damaged summary is replaced by a whole one
    previous_mode = previous.get("mode") if isinstance(previous, dict) else None
    if previous_mode not in ("quick", "full"):
        return
    mode = "quick" if quick else "full"
    if previous_mode != mode:
        raise ValueError(f"{out} holds a {previous_mode} run (its summary.json says so); a "
                         f"{mode} run would replace its numbers: choose another --out, or pass "
                         f"--overwrite to replace them")


def _kept_sections(out: Path, others: list[str], quick: bool) -> dict[str, tuple[dict, str]]:
    """The summary entries (``summary.json``) and ``summary.md`` sections of the experiments
    in ``others`` that ``out`` already holds, name -> (entry, section text)."""
    json_path, md_path = out / "summary.json", out / "summary.md"
    if not json_path.exists():
        return {}
    mode = "quick" if quick else "full"
    try:
        previous = json.loads(json_path.read_text(encoding="utf-8"))
        sections = _md_sections(md_path.read_text(encoding="utf-8")) if md_path.exists() else {}
        experiments = previous["experiments"]
        if not isinstance(experiments, dict):
            raise TypeError("'experiments' is not an object")
        previous_mode = previous["mode"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError) as err:
        raise ValueError(f"{json_path} does not read back ({type(err).__name__}: {err}), so the "
                         f"other experiments' summaries cannot be kept; rerun all experiments "
                         f"or choose another --out") from None
    if previous_mode != mode and any(name in experiments for name in others):
        raise ValueError(f"{out} holds a {previous_mode} run; rerunning some experiments in "
                         f"{mode} mode would mix the two in one summary: rerun them "
                         f"{'with' if previous_mode == 'quick' else 'without'} --quick, or "
                         f"choose another --out")
    kept = {}
    for name in others:
        entry = experiments.get(name)
        if isinstance(entry, dict) and isinstance(entry.get("title"), str):
            kept[name] = (entry, sections.get(entry["title"], ""))
    return kept


def _md_sections(text: str) -> dict[str, str]:
    """``summary.md``'s sections by title (the text after ``## ``), each section's text
    from its heading to the next."""
    sections, title = {}, None
    for line in text.split("\n"):
        if line.startswith("## "):
            title = line[3:]
            sections[title] = line + "\n"
        elif title is not None:
            sections[title] += line + "\n"
    return sections


def _write_summaries(out: Path, results: list[Result], quick: bool, timings: dict,
                     kept: dict[str, tuple[dict, str]] | None = None) -> None:
    mode = "quick" if quick else "full"
    kept = kept or {}
    fresh = {r.name: r for r in results}
    order = [name for name in names(include_broken=True) if name in fresh or name in kept]
    entries = {name: ({"title": fresh[name].title, "figures": fresh[name].figures,
                       "numbers": fresh[name].numbers} if name in fresh else kept[name][0])
               for name in order}
    payload = {"mode": mode, "experiments": entries}
    write_text(out / "summary.json", json.dumps(payload, indent=2, sort_keys=True) + "\n")
    # which array library computed: the bits are the same on each, the seconds are not
    computed_on: dict[str, Any] = {"backend": backend.name(), "versions": backend.versions()}
    write_text(out / "timings.json", json.dumps({"mode": mode, "experiments": timings,
                                                 **computed_on}, indent=2, sort_keys=True) + "\n")
    lines = ["# Mixed Precision Training, reproduced with fpsim", "",
             f"Mode: {mode} (`fpsim reproduce{' --quick' if quick else ''}`). Every number "
             f"below is in `summary.json`; figures are PNG and SVG beside this file.", ""]
    for name in order:
        if name not in fresh:
            lines += kept[name][1].rstrip("\n").split("\n") + [""] if kept[name][1] else []
            continue
        r = fresh[name]
        lines += [f"## {r.title}", "", r.summary.strip(), ""]
        if r.table:
            lines += [r.table.strip(), ""]
        lines += [f"![{r.title}]({fig})" for fig in r.figures if fig.endswith(".png")] + [""]
    write_text(out / "summary.md", "\n".join(lines))
    timing_lines = ["# Wall-clock timings (these, and only these, differ between machines)", "",
                    f"Computed on the {backend.name()} backend ("
                    + ", ".join(f"{k} {v}" for k, v in computed_on["versions"].items()) + ").",
                    "", "| experiment | seconds | CPU seconds (all threads) |", "|---|---|---|"]
    timing_lines += [f"| {name} | {t['seconds']} | {t['cpu_seconds']} |"
                     for name, t in timings.items()]
    for r in results:
        if r.timing_table:
            timing_lines += ["", f"## {r.title}", "", r.timing_table.strip()]
    write_text(out / "timings.md", "\n".join(timing_lines) + "\n")
