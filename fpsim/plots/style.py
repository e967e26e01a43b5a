"""Deterministic figures: the same numbers give the same PNG and SVG bytes on every run.

What makes matplotlib output vary, and what this module pins: the backend (Agg, no display),
the style (matplotlib's defaults reset, then our few choices, so a user's matplotlibrc does
not leak in), SVG element ids (a fixed ``svg.hashsalt``), and file metadata (no creation date,
no software version). Fonts are DejaVu, which ships inside matplotlib.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg", force=True)

import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

from ..files import atomic_file  # noqa: E402

__all__ = ["figure_style", "save_figure", "new_figure"]

_STYLE = {
    "svg.hashsalt": "fpsim",
    "svg.fonttype": "path",
    "font.family": "DejaVu Sans",
    "font.size": 9.0,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "lines.linewidth": 1.4,
    "legend.frameon": False,
    "path.simplify": False,
}
_NO_METADATA = {
    "png": {"Software": None},
    "svg": {"Date": None, "Creator": None},
}


@contextlib.contextmanager
def figure_style():
    """Matplotlib's defaults plus our style, whatever the user's rc settings are."""
    with matplotlib.rc_context():
        matplotlib.rcdefaults()
        matplotlib.rcParams.update(_STYLE)
        yield


def new_figure(width: float = 6.0, height: float = 3.6, **subplots):
    """A figure and axes in our style (call inside ``figure_style()``)."""
    return plt.subplots(figsize=(width, height), **subplots)


def save_figure(fig, stem: "str | Path", formats=("png", "svg")) -> list[Path]:
    """Write ``stem.png`` and ``stem.svg`` without timestamps or versions, each whole or not at
    all (``fpsim.files.atomic_file``), close the figure, and return the paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for ext in formats:
        path = stem.with_suffix(f".{ext}")
        with atomic_file(path, "wb") as handle:
            fig.savefig(handle, format=ext, metadata=_NO_METADATA[ext])
        written.append(path)
    plt.close(fig)
    return written
