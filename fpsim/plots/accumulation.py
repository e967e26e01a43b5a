"""Figure for experiment 7: relative error of a dot product against the inner dimension."""
from __future__ import annotations

from pathlib import Path

from .style import figure_style, new_figure, save_figure


def plot_accumulation_error(k_values, errors: dict, stem: Path) -> list[Path]:
    with figure_style():
        fig, axes = new_figure(9.0, 3.4, ncols=len(errors), sharey=True)
        for ax, (data_name, by_model) in zip(axes, errors.items()):
            for model, values in by_model.items():
                ax.loglog(k_values, [max(v, 1e-12) for v in values], marker="o", label=model)
            ax.set_title(f"fp16 inputs, {data_name}")
            ax.set_xlabel("inner dimension K")
        axes[0].set_ylabel("median relative error")
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        return save_figure(fig, stem)
