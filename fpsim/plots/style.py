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

__all__ = ["figure_style", "save_figure", "new_figure", "write_figure", "write_user_figure",
           "FIGURE_TYPES"]

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


FIGURE_TYPES = tuple(_NO_METADATA)


def write_figure(fig, path: "str | Path") -> Path:
    """Write ``fig`` to ``path`` (PNG or SVG, chosen by the extension) without timestamps or
    versions, atomically (``fpsim.files.atomic_file``), and close the figure."""
    path = Path(path)
    ext = path.suffix.lower().lstrip(".")
    if ext not in _NO_METADATA:
        plt.close(fig)
        raise ValueError(f"cannot write a figure to {path}: the name must end in "
                         f"{' or '.join('.' + e for e in _NO_METADATA)}")
    try:
        with atomic_file(path, "wb") as handle:
            fig.savefig(handle, format=ext, metadata=_NO_METADATA[ext])
    finally:
        plt.close(fig)
    return path


def write_user_figure(fig, path: "str | Path") -> Path:
    """``write_figure`` for a file a user named: its folder made, a failure to write it a
    ``ValueError`` saying so (the command's one line), the figure closed either way."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_figure(fig, path)
    except OSError as err:
        raise ValueError(f"cannot write the figure {path}: {err.strerror or err}") from None
    finally:
        plt.close(fig)


def save_figure(fig, stem: "str | Path", formats=("png", "svg")) -> list[Path]:
    """Write ``stem.png`` and ``stem.svg`` without timestamps or versions, close the figure,
    and return the paths. Each file is written whole or not at all (``fpsim.files``): an
    interrupted save leaves the previous figure in place."""
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
