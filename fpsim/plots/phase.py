"""Phase diagrams of a sweep: a heatmap of one outcome over two axes, one panel per value of
a third axis.

The cells hold what the sweep's rows say after aggregation (``fpsim.sweep.phase``): an
outcome name (``converged``, ``stalled``, ``diverged``, ``failed``) when the runs behind the
cell agree, ``mixed`` with how many ended each way when they do not, or a number (the median
of the runs behind it).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.colors import ListedColormap, LogNorm, Normalize
from matplotlib.patches import Patch

from .style import figure_style, new_figure, save_figure

__all__ = ["plot_phase_diagram", "OUTCOME_COLORS"]

OUTCOME_COLORS = {"converged": "#4c9a2a", "stalled": "#e0a526", "diverged": "#c0392b",
                  "failed": "#555555", "mixed": "#7d5ba6"}


def plot_phase_diagram(panels: dict, *, x_values: list[str], y_values: list[str], x_label: str,
                       y_label: str, outcome: str, stem: "str | Path",
                       title: str = "") -> list[Path]:
    """``panels``: panel title -> grid (rows: ``y_values``, columns: ``x_values``) of cells,
    each ``None`` (no run), ``(outcome name, {outcome: runs} when they disagree, runs)``
    when ``outcome`` is "outcome" (name "mixed" when the runs disagree), or a number.
    Writes ``stem.png`` and ``stem.svg``."""
    categorical = outcome == "outcome"
    names = list(OUTCOME_COLORS)
    with figure_style():
        width = 1.2 + len(panels) * max(2.6, 0.4 * len(x_values) + 0.8)
        if categorical:     # the outcome legend's five entries and a two-line title fit
            width = max(width, 7.0)
        height = 1.5 + max(1.6, 0.5 * len(y_values))
        fig, axes = new_figure(width, height, ncols=len(panels), squeeze=False,
                               constrained_layout=True)
        values = [_numbers(grid, categorical, names) for grid in panels.values()]
        finite = [v for grid in values for v in grid.ravel() if math.isfinite(v)]
        low, high = (min(finite), max(finite)) if finite else (0.0, 1.0)
        # numbers spread over orders of magnitude (losses that blew up) on a log scale
        norm = LogNorm(low, high) if low > 0 and high > 20 * low else Normalize(low, high)
        for ax, (label, grid), numbers in zip(axes[0], panels.items(), values):
            masked = np.ma.masked_invalid(numbers)
            if categorical:
                image = ax.imshow(masked, cmap=ListedColormap(list(OUTCOME_COLORS.values())),
                                  vmin=-0.5, vmax=len(names) - 0.5, aspect="auto",
                                  origin="lower")
            else:
                image = ax.imshow(masked, cmap="viridis", norm=norm, aspect="auto",
                                  origin="lower")
            for i, line in enumerate(grid):
                for j, cell in enumerate(line):
                    text = _annotation(cell, categorical)
                    if text:
                        ax.text(j, i, text, ha="center", va="center", fontsize=6,
                                color="white")
            ax.set_xticks(range(len(x_values)), x_values,
                          rotation=90 if max(len(v.strip("$")) for v in x_values) > 6 else 0)
            ax.set_yticks(range(len(y_values)), y_values)
            ax.set_xlabel(x_label)
            ax.set_title(label)
            ax.grid(False)
        axes[0][0].set_ylabel(y_label)
        if categorical:
            fig.legend(handles=[Patch(color=c, label=n) for n, c in OUTCOME_COLORS.items()],
                       loc="outside lower center", ncols=len(names), fontsize=8)
        else:
            fig.colorbar(image, ax=axes[0].tolist(), label=f"{outcome} (median)", shrink=0.9)
        if title:
            fig.suptitle(title)
        return save_figure(fig, stem)


def _numbers(grid, categorical: bool, names: list[str]) -> np.ndarray:
    def number(cell):
        if cell is None:
            return math.nan
        if categorical:
            return float(names.index(cell[0]))
        return float(cell)

    return np.array([[number(cell) for cell in row] for row in grid], np.float64)


def _annotation(cell, categorical: bool) -> str:
    if cell is None:
        return ""
    if categorical:
        _, counts, _ = cell     # a disagreement: how many runs ended each way
        return "\n".join(f"{n} {name[:4]}" for name, n in counts.items())
    return "" if not math.isfinite(cell) else f"{cell:.3g}"
