"""Figures for the experiments, each a function of the numbers it shows; see ``style`` for
what keeps the files byte-identical between runs."""
from .style import figure_style, new_figure, save_figure

__all__ = ["figure_style", "new_figure", "save_figure"]
