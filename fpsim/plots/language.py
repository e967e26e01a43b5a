"""Figure for the language-model experiments (``lstm_lm``, ``transformer_lm``): each precision
recipe's training loss against the source's entropy, and per step the share of gradient values
flushed to zero and of updates lost to rounding."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .overflow import running_mean
from .style import figure_style, new_figure, save_figure

SMOOTH = 5
RUN_STYLES = ["-", "-", "--", ":", "-.", "-", "--"]


def plot_language(runs: dict, entropy: float, model: str, stem: Path) -> list[Path]:
    """``runs``: label -> run numbers (``losses``, NaN as the string "nan"; per-step
    ``underflow_fraction`` and ``lost_update_fraction``), drawn in the dict's order, which
    picks each run's colour (``summary.json`` sorts its keys: put them back in ``RUNS`` order
    before redrawing from it)."""
    with figure_style():
        fig, (loss_ax, under_ax, lost_ax) = new_figure(14.0, 4.2, ncols=3)
        for i, ((label, r), ls) in enumerate(zip(runs.items(), RUN_STYLES)):
            color = f"C{i}"
            losses = np.array([float(v) for v in r["losses"]], np.float64)
            steps = np.arange(len(losses))
            finite = np.isfinite(losses)
            loss_ax.plot(steps, running_mean(np.where(finite, losses, np.nan), SMOOTH),
                         color=color, ls=ls, label=label)
            if not finite.all():
                first = int(np.argmin(finite))
                level = float(losses[:first].mean()) if first else float(np.nanmax(
                    [float(v) for other in runs.values() for v in other["losses"][:1]]))
                loss_ax.plot([first], [level], "v", color=color, markersize=7)
                loss_ax.annotate(f"{label}: NaN from step {first}", (first, level),
                                 xytext=(10, 4), textcoords="offset points", fontsize=7,
                                 color=color)
            under_ax.plot(steps, 100.0 * np.asarray(r["underflow_fraction"]), color=color,
                          ls=ls, label=label)
            lost_ax.plot(steps, 100.0 * np.asarray(r["lost_update_fraction"]), color=color,
                         ls=ls, label=label)
        loss_ax.axhline(entropy, color="black", lw=0.8, ls=(0, (4, 3)))
        top = loss_ax.get_ylim()[1]
        loss_ax.set_ylim(entropy - 0.05 * (top - entropy), top)   # the entropy line in view
        loss_ax.annotate(f"source entropy {entropy:.4f} nats (best possible)",
                         (len(losses) - 1, entropy), xytext=(0, 3), textcoords="offset points",
                         fontsize=7, ha="right")
        loss_ax.set_xlabel("step")
        loss_ax.set_ylabel(f"training loss, nats/token ({SMOOTH}-step trailing mean)")
        loss_ax.set_title(f"{model}: loss by recipe")
        loss_ax.legend(fontsize=7)
        under_ax.set_xlabel("step")
        under_ax.set_ylabel("% of nonzero gradient values flushed to 0")
        under_ax.set_title("Gradient underflow in backward, per step")
        lost_ax.set_xlabel("step")
        lost_ax.set_ylabel("% of element updates that left the weight unchanged")
        lost_ax.set_title("Updates lost to rounding, per step")
        fig.tight_layout()
        return save_figure(fig, stem)
