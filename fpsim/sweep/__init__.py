"""Sweeps: many ``fpsim train`` runs over a grid of configurations, on Dask.

``load_spec`` reads and checks a TOML sweep file, ``expand`` lists its cells, ``run_sweep``
runs the cells not yet done on a local Dask cluster or an existing one, and ``phase_diagram``
draws one outcome over two axes. ``fpsim sweep`` and ``fpsim sweep-plot`` are the commands.
"""
from .cells import Cell, config_key, expand, run_cell
from .phase import phase_diagram
from .results import OUTCOMES, read_table
from .run import SweepSummary, run_sweep
from .spec import SpecError, SweepSpec, load_spec, parse_spec

__all__ = ["SweepSpec", "SpecError", "load_spec", "parse_spec", "Cell", "expand", "config_key",
           "run_cell", "run_sweep", "SweepSummary", "phase_diagram", "read_table", "OUTCOMES"]
