"""Figures: the experiments' (each a function of the numbers it shows; see ``style`` for what
keeps the files byte-identical between runs) and your own runs' (``plot_runs``)."""
from .runs import PANELS, open_run, plot_runs, runs_figure
from .style import figure_style, new_figure, save_figure, write_figure

__all__ = ["figure_style", "new_figure", "save_figure", "write_figure", "plot_runs",
           "open_run", "runs_figure", "PANELS"]
