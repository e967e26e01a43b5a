"""Per-step tables as heatmaps, one row per column of the table, one panel per statistic.

``plot_layers`` (``fpsim plot --per-layer RUN``) draws a run's ``layers.jsonl`` (``fpsim
train --per-layer``), parameter x step: the percentage of its gradient values that
underflowed, the percentage of its updates lost, and log2 of its gradient's largest magnitude
(as stored, times the loss scale). ``plot_fp8`` (``fpsim plot --fp8 RUN``) draws a run's
``fp8.jsonl`` (a run under an FP8 recipe), quantized tensor x step: log2 of the scale in use,
and the percentages of values saturated and flushed to zero. Cells that were not measured
or not finite are drawn grey.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..train.fp8_stats import FP8_TABLE
from ..train.layer_stats import LAYERS, read_step_table
from .style import figure_style, new_figure, write_user_figure

import matplotlib.pyplot as plt  # noqa: E402  (style chose the backend)

__all__ = ["plot_layers", "plot_fp8", "LAYER_PANELS", "FP8_PANELS"]

# (statistic, title, colour bar label, transform)
LAYER_PANELS = (
    ("grad_underflow", "gradient underflow", "% of nonzero gradient values flushed to 0",
     "percent"),
    ("lost_updates", "lost updates", "% of the parameter's updates lost", "percent"),
    ("grad_max", "largest gradient magnitude", "log2 |g| max (as stored, times the scale)",
     "log2"),
)
FP8_PANELS = (
    ("scale", "scale in use", "log2 scale", "log2"),
    ("saturated", "saturated (clipped to the format's largest value)", "% of the step's values",
     "percent"),
    ("flushed", "flushed to zero", "% of the step's values", "percent"),
)
_HINTS = {LAYERS.file: "train the run with --per-layer (fpsim train --per-layer --out RUN)",
          FP8_TABLE.file: "train the run under an FP8 recipe (fpsim train --policy "
                          "fp8-delayed --out RUN)"}


def _table_path(run: "str | os.PathLike", table) -> Path:
    path = Path(run)
    if path.is_dir():
        path = path / table.file
    if not path.exists():
        raise FileNotFoundError(f"no {table.file} at {path}: {_HINTS[table.file]}")
    return path


def _matrix(steps, statistic: str, transform: str) -> np.ndarray:
    values = np.array([getattr(s, statistic) for s in steps], np.float64).T   # parameter x step
    with np.errstate(divide="ignore", invalid="ignore"):
        if transform == "percent":
            values = values * 100.0
        elif transform == "log2":
            values = np.log2(values)
    return np.ma.masked_invalid(values)


def plot_layers(run: "str | os.PathLike", out: "str | os.PathLike") -> Path:
    """Draw the run's ``layers.jsonl`` into ``out`` (``.png`` or ``.svg``, the same bytes for
    the same statistics); checked before anything is written; returns the path written."""
    return _plot_table(LAYERS, LAYER_PANELS, run, out)


def plot_fp8(run: "str | os.PathLike", out: "str | os.PathLike") -> Path:
    """Draw the run's ``fp8.jsonl`` into ``out`` (as ``plot_layers``)."""
    return _plot_table(FP8_TABLE, FP8_PANELS, run, out)


def _plot_table(table, panels, run, out) -> Path:
    out = Path(out)
    if out.suffix.lower() not in (".png", ".svg"):
        raise ValueError(f"cannot write a figure to {out}: the name must end in .png or .svg")
    path = _table_path(run, table)
    names, steps = read_step_table(table, path)
    if not steps:
        raise ValueError(f"{path} holds no steps yet")
    with figure_style():
        fig, axes = new_figure(12.0, 2.0 + 1.1 * len(panels) + 0.25 * len(names) * 3,
                               nrows=len(panels), ncols=1)
        for ax, (statistic, title, label, transform) in zip(axes, panels):
            cmap = plt.get_cmap("viridis").with_extremes(bad="0.8")
            image = ax.imshow(_matrix(steps, statistic, transform), aspect="auto",
                              interpolation="nearest", cmap=cmap,
                              extent=(-0.5, len(steps) - 0.5, len(names) - 0.5, -0.5))
            ax.set_yticks(range(len(names)), names, fontsize=7)
            ax.set_title(title)
            ax.set_xlabel("step")
            fig.colorbar(image, ax=ax, label=label)
        fig.tight_layout()
        return write_user_figure(fig, out)
