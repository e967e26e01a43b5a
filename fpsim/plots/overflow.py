"""Figure for experiment 4: a too-large static loss scale, and dynamic scaling's sawtooth."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .style import figure_style, new_figure, save_figure


def running_mean(values, window: int) -> np.ndarray:
    """Trailing mean over up to ``window`` steps (display only); NaN where any value is."""
    values = np.asarray(values, np.float64)
    out = np.empty_like(values)
    for i in range(len(values)):
        out[i] = values[max(0, i - window + 1): i + 1].mean()
    return out


def plot_overflow(runs: dict, stem: Path, window: int = 20) -> list[Path]:
    """``runs``: label -> dict with ``losses``, ``scales`` (per step, before the update),
    ``skipped`` (bools per step) and ``dynamic`` (a dynamic scaler gets its own scale panel;
    static ones are drawn dotted in each)."""
    dynamic = [label for label, run in runs.items() if run["dynamic"]]
    static = [label for label, run in runs.items() if not run["dynamic"]]
    with figure_style():
        fig, axes = new_figure(13.0, 3.8, ncols=len(dynamic) + 1)
        scale_axes, loss_ax = axes[:-1], axes[-1]
        palette = dict(zip(list(runs), [f"C{i}" for i in range(len(runs))]))
        for ax, label in zip(scale_axes, dynamic):
            run = runs[label]
            steps = np.arange(len(run["scales"]))
            log_scale = np.log2(np.asarray(run["scales"], np.float64))
            skipped = np.asarray(run["skipped"], bool)
            ax.step(steps, log_scale, where="post", color=palette[label], label="loss scale")
            ax.plot(steps[skipped], log_scale[skipped], "x", markersize=5, color="k",
                    label=f"skipped step ({int(skipped.sum())})")
            if static:
                first = runs[static[0]]
                ax.plot(np.arange(len(first["scales"])),
                        np.log2(np.asarray(first["scales"], np.float64)), ":", color="0.4",
                        label="static scale (every step overflows)")
            ax.set_title(label)
            ax.set_xlabel("step")
            ax.set_ylabel("log2(loss scale)")
            ax.legend(fontsize=7, loc="center right")
        # The dynamic runs' curves nearly coincide: a wide pale line under a narrow dashed
        # one keeps each visible, and the note says how far apart they are.
        dynamic_styles = iter([dict(linestyle="-", linewidth=3.2, alpha=0.45),
                               dict(linestyle="--", linewidth=1.3)] * len(runs))
        means = {}
        for label, run in runs.items():
            steps = np.arange(len(run["losses"]))
            losses = np.asarray(run["losses"], np.float64)
            finite = np.isfinite(losses)
            shown = running_mean(np.where(finite, losses, np.nan), window)
            means[label] = shown
            style = next(dynamic_styles) if run["dynamic"] else dict(linestyle=":")
            loss_ax.plot(steps, shown, color=palette[label], label=label, **style)
            if not finite.all():
                first = int(np.argmin(finite))
                level = losses[:first].mean() if first else 0.0
                loss_ax.plot([first], [level], "v", color=palette[label], markersize=7)
                loss_ax.annotate(f"loss NaN from step {first}", (first, level),
                                 xytext=(10, -16), textcoords="offset points", fontsize=7,
                                 color=palette[label])
        if len(dynamic) == 2:
            gap = np.nanmax(np.abs(means[dynamic[0]] - means[dynamic[1]]))
            loss_ax.text(0.98, 0.2, f"{dynamic[0]} (wide) and\n{dynamic[1]} (dashed):\n"
                         f"running means at most {gap:.3f} apart", transform=loss_ax.transAxes,
                         ha="right", va="bottom", fontsize=7, color="0.3")
        loss_ax.set_xlabel("step")
        loss_ax.set_ylabel(f"training loss ({window}-step running mean)")
        loss_ax.set_title("training loss")
        loss_ax.legend(fontsize=7, loc="center right")
        fig.tight_layout()
        return save_figure(fig, stem)
