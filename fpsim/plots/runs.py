"""Your own runs, side by side: ``plot_runs`` (and ``fpsim plot``) draws the traces of any
number of runs in five panels -- loss (skipped steps marked x, NaN/inf losses marked at the top
edge), loss scale, gradient underflow, lost updates, gradient norm -- plus a legend panel
saying how many steps each run has, how many it skipped, where its loss was not finite and
whether it was interrupted.

A run is a training run folder or trace file (``fpsim.train.load_run``: JSON Lines or CSV,
complete or interrupted) or a loss-scaler trace recorded from a framework
(``fpsim-scaler-trace``, ``fpsim.conformance.GradScalerRecorder``); ``open_run`` reads either.
A scaler trace has no loss, underflow or lost-update columns: those panels show the other
runs, or say that no run recorded them.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

from ..conformance.trace import TRACE_FORMAT, read_trace
from ..train.runs import Run, first_json_row, load_run
from .style import figure_style, new_figure, write_user_figure

__all__ = ["open_run", "plot_runs", "runs_figure", "PANELS", "distinguishing_labels",
           "label_fields"]

# (column, title, y label, y scale) in panel order; fractions are drawn in percent
PANELS = (
    ("loss", "training loss", "loss (x: skipped step; v at top: NaN/inf)", "auto"),
    ("scale", "loss scale", "loss scale (log2)", "log2"),
    ("underflow_fraction", "gradient underflow", "% of nonzero gradient values flushed to 0",
     "percent"),
    ("lost_update_fraction", "lost updates", "% of weight updates lost to rounding", "percent"),
    ("grad_norm", "gradient norm", "global L2 norm, unscaled (gaps: skipped)", "log"),
)
# identical runs draw on top of each other: styles keep each visible
STYLES = ("-", "--", "-.", ":")


def open_run(path: "Run | str | os.PathLike") -> Run:
    """A ``Run`` from a training run (folder or trace) or a framework's scaler trace."""
    if isinstance(path, Run):
        return path
    path = Path(path)
    if path.is_file() and _is_scaler_trace(path):
        return _scaler_trace_run(path)
    return load_run(path)


def _is_scaler_trace(path: Path) -> bool:
    header = first_json_row(path)
    return header is not None and header.get("format") == TRACE_FORMAT


def _scaler_trace_run(path: Path) -> Run:
    trace = read_trace(path)
    steps = trace.steps
    columns = {"scale": tuple(s.scale_before for s in steps),
               "scale_after": tuple(s.scale_after for s in steps),
               "found_inf": tuple(s.found_inf for s in steps),
               "skipped": tuple(s.skipped for s in steps),
               "growth_tracker": tuple(s.growth_tracker for s in steps),
               "hysteresis": tuple(s.hysteresis for s in steps)}
    keys = sorted({k for s in steps for k in (s.grad_stats or {})})
    for key in keys:
        values = tuple((s.grad_stats or {}).get(key) for s in steps)
        columns["grad_norm" if key == "l2_norm" else f"grad_{key}"] = values
    if "grad_norm" in columns:  # a skipped step's gradients were not used: as in fpsim traces
        columns["grad_norm"] = tuple(math.nan if s.skipped or v is None else v
                                     for s, v in zip(steps, columns["grad_norm"]))
    label = trace.header.source or path.stem
    config = {"format": TRACE_FORMAT, "source": trace.header.source,
              "params": dict(trace.header.params)}
    return Run(f"{label} (scaler trace)", str(path), "scaler-trace",
               tuple(s.step for s in steps), columns, config)


def plot_runs(runs, out: "str | os.PathLike", *, labels=None) -> Path:
    """Draw ``runs`` (``Run`` objects or paths ``open_run`` reads) into ``out`` (``.png`` or
    ``.svg``, the same bytes for the same runs); ``labels`` (one per run) replaces the labels
    taken from ``run.json``. Every run is read and checked before anything is written;
    returns the path written."""
    out = Path(out)
    if out.suffix.lower() not in (".png", ".svg"):
        raise ValueError(f"cannot write a figure to {out}: the name must end in .png or .svg")
    with figure_style():
        return write_user_figure(runs_figure(runs, labels=labels), out)


def runs_figure(runs, *, labels=None):
    """The figure ``plot_runs`` writes, for a caller to look at or save (call inside
    ``figure_style()``; close it with ``matplotlib.pyplot.close``). Axes in ``PANELS``
    order, then the legend panel."""
    runs = [open_run(r) for r in runs]
    if not runs:
        raise ValueError("plot_runs needs at least one run")
    if labels is not None:
        labels = [str(label) for label in labels]
        if len(labels) != len(runs):
            raise ValueError(f"got {len(labels)} label(s) for {len(runs)} run(s): give one "
                             f"label per run, in order")
    else:
        labels = _distinct(distinguishing_labels(runs), [r.source for r in runs])
    fig, grid = new_figure(12.0, 10.0, nrows=3, ncols=2)
    axes = grid.ravel()
    for ax, (column, title, ylabel, scale) in zip(axes, PANELS):
        drawn = 0
        for i, (run, label) in enumerate(zip(runs, labels)):
            drawn += _draw(ax, column, run, label, f"C{i % 10}", STYLES[i % len(STYLES)])
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel, fontsize=7.5)
        if not drawn:
            ax.text(0.5, 0.5, "not recorded in these runs", transform=ax.transAxes,
                    ha="center", va="center", color="0.4")
            continue
        _set_scale(ax, column, scale, runs)
    _legend_panel(axes[-1], axes[:len(PANELS)], runs, labels)
    fig.tight_layout()
    return fig


# run.json fields that say nothing a reader tells runs apart by: derived from others
# (recipe, overrides, the scaler's repr beside scaler_name) or the same for every run
LABEL_SKIPPED = ("command", "model", "recipe", "overrides", "scaler")
LABEL_FIELDS_SHOWN = 4
_CALL = re.compile(r"^(\w+)\((.*)\)$")
_ARGUMENT = re.compile(r"(\w+)=('[^']*'|[^,]*)")


def label_fields(config: dict) -> dict:
    """A run's configuration as label fields: ``run.json``'s ``config`` with the optimizer's
    repr (``SGD(lr=0.1, momentum=0.9, ...)``) split into its name and settings, and the
    scaler by its name."""
    fields = {}
    for key, value in config.items():
        if key in LABEL_SKIPPED or isinstance(value, (dict, list)):
            continue
        call = _CALL.match(value) if key == "optimizer" and isinstance(value, str) else None
        if call:
            fields["optimizer"] = call.group(1)
            fields.update(_ARGUMENT.findall(call.group(2)))
        else:
            fields["scaler" if key == "scaler_name" else key] = value
    return fields


def distinguishing_labels(runs: list[Run]) -> list[str]:
    """Each run's label from the configuration fields in which the training runs differ
    (``optimizer Adam, lr 0.001`` beside ``optimizer SGD, lr 0.1``); a run without
    ``run.json``, or runs that differ in nothing recorded, keep their own label (policy,
    scaler, seed)."""
    fields = [label_fields(r.config.get("config", {})) if r.kind == "training" else None
              for r in runs]
    known = [f for f in fields if f]
    # fields every run has (an SGD run's momentum beside an Adam run is told by the
    # optimizer's name already)
    keys = [k for k in dict.fromkeys(k for f in known for k in f) if all(k in f for f in known)]
    differ = [k for k in keys if len({repr(f[k]) for f in known}) > 1]
    labels = []
    for run, own in zip(runs, fields):
        if not own or not differ or len(known) < 2:
            labels.append(run.label)
            continue
        shown = [f"{k} {own[k]}" for k in differ]
        text = ", ".join(shown[:LABEL_FIELDS_SHOWN])
        if len(shown) > LABEL_FIELDS_SHOWN:
            text += f" (+{len(shown) - LABEL_FIELDS_SHOWN} more)"
        labels.append(text + ("" if run.complete else
                              f" (interrupted after step {run.steps[-1]})"))
    return labels


def _distinct(labels: list[str], sources: list[str]) -> list[str]:
    """Labels as given, with the run's path added where two runs would share one."""
    return [f"{label} [{source}]" if labels.count(label) > 1 else label
            for label, source in zip(labels, sources)]


def _finite(values) -> list:
    return [v if v is not None and math.isfinite(v) else math.nan for v in values]


def _draw(ax, column: str, run: Run, label: str, color: str, style: str) -> int:
    values = run.column(column)
    if values is None or all(v is None for v in values):
        return 0
    steps = list(run.steps)
    if column in ("underflow_fraction", "lost_update_fraction"):
        values = [math.nan if v is None else 100.0 * v for v in values]
    shown = _finite(values)
    if column == "scale":
        ax.step(steps, [v if v > 0 else math.nan for v in shown], where="post", color=color,
                linestyle=style, label=label)
    else:
        ax.plot(steps, shown, color=color, linestyle=style, lw=1.1, label=label)
    if column == "loss":
        _mark_loss_events(ax, run, values, color)
    return 1


def _mark_loss_events(ax, run: Run, losses, color: str) -> None:
    skipped = run.column("skipped") or ()
    marks = [(s, v) for s, v, skip in zip(run.steps, losses, skipped)
             if skip and v is not None and math.isfinite(v)]
    if marks:
        ax.plot([s for s, _ in marks], [v for _, v in marks], "x", color=color, ms=5,
                linestyle="none")
    bad = [s for s, v in zip(run.steps, losses) if v is None or not math.isfinite(v)]
    if bad:
        ax.plot(bad, [0.97] * len(bad), "v", color=color, ms=5, linestyle="none",
                transform=ax.get_xaxis_transform(), clip_on=False)


def _set_scale(ax, column: str, scale: str, runs) -> None:
    values = [v for r in runs for v in (r.column(column) or ())
              if v is not None and math.isfinite(v)]
    positive = [v for v in values if v > 0]
    if scale == "log2" and positive:
        ax.set_yscale("log", base=2)
    elif scale == "log" and positive:
        ax.set_yscale("log")
    elif scale == "auto" and positive and len(positive) == len(values) \
            and max(positive) / min(positive) > 100:
        ax.set_yscale("log")
    elif scale == "percent":
        ax.set_ylim(bottom=0)


def _legend_panel(ax, panels, runs, labels) -> None:
    ax.axis("off")
    handles = {}
    for panel in panels:
        for line in panel.get_lines():
            name = line.get_label()
            if name in labels and name not in handles:
                handles[name] = line
    lines = []
    for run, label in zip(runs, labels):
        skipped = sum(1 for v in (run.column("skipped") or ()) if v)
        losses = run.column("loss")
        bad = ([s for s, v in zip(run.steps, losses) if v is None or not math.isfinite(v)]
               if losses is not None else [])
        text = f"{len(run.steps)} steps, {skipped} skipped"
        if bad:
            text += f", loss NaN/inf at {len(bad)} (first: step {bad[0]})"
        if not run.complete:
            text += ", interrupted"
        lines.append(f"{label}: {text}")
    ordered = [handles[label] for label in labels if label in handles]
    if ordered:
        ax.legend(ordered, [h.get_label() for h in ordered], loc="upper left", fontsize=8,
                  title="runs")
    ax.text(0.0, 0.35 if ordered else 1.0, "\n".join(lines), transform=ax.transAxes,
            va="top", fontsize=7.5, wrap=True)
