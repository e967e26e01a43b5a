"""Figure for experiment 6: the Lightning precision recipes on one classification task."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .overflow import running_mean
from .style import figure_style, new_figure, save_figure


def plot_recipes(rows: dict, stem: Path, window: int = 20) -> list[Path]:
    """``rows``: recipe label -> dict with ``losses`` (per step) and ``accuracy`` (held out).
    Timings are left out on purpose: the figure is the same on every machine."""
    with figure_style():
        fig, (loss_ax, acc_ax) = new_figure(11.0, 3.8, ncols=2,
                                            gridspec_kw={"width_ratios": [1.5, 1.0]})
        labels = list(rows)
        for i, label in enumerate(labels):
            losses = np.asarray(rows[label]["losses"], np.float64)
            finite = np.isfinite(losses)
            color = f"C{i}"
            loss_ax.plot(running_mean(np.where(finite, losses, np.nan), window), color=color,
                         label=label)
            if not finite.all():
                first = int(np.argmin(finite))
                level = losses[:first].mean() if first else 0.0
                loss_ax.plot([first], [level], "v", color=color, markersize=7)
                loss_ax.annotate(f"{label}: NaN from step {first}", (first, level),
                                 xytext=(10, 4), textcoords="offset points", fontsize=7,
                                 color=color)
        loss_ax.set_xlabel("step")
        loss_ax.set_ylabel(f"training loss ({window}-step running mean)")
        loss_ax.set_title("training loss by precision recipe")
        loss_ax.legend(fontsize=7)
        y = np.arange(len(labels))[::-1]
        accuracy = [rows[label]["accuracy"] for label in labels]
        acc_ax.barh(y, accuracy, color=[f"C{i}" for i in range(len(labels))])
        for yi, label, value in zip(y, labels, accuracy):
            text = f"{100 * value:.1f}%" + ("  (NaN model)" if rows[label].get("nan") else "")
            acc_ax.text(value + 0.01, yi, text, va="center", fontsize=7)
        acc_ax.set_yticks(y, labels, fontsize=7)
        acc_ax.set_xlim(0, 1.15)
        acc_ax.set_xlabel("held-out accuracy")
        acc_ax.set_title("held-out accuracy (NaN logits: wrong)")
        fig.tight_layout()
        return save_figure(fig, stem)
