"""Cells: one ``fpsim train`` run each, expanded from a spec and keyed by a hash of the full
training configuration and fpsim's version.

``run_cell`` is what a Dask worker executes: ``train(config)``, the cell's ``TrainConfig`` (what
``fpsim train`` runs for the same options), in a temporary folder on the worker's own disk; it
returns the results row and the run's files, which the client writes, so workers need no
shared disk.
"""
from __future__ import annotations

import hashlib
import io
import itertools
import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .. import backend
from .._version import __version__
from ..train import read_trace, train
from ..train.config import from_options
from ..train.fp8_stats import FP8_TABLE
from ..train.layer_stats import LAYERS
from .results import summarize
from .spec import SweepSpec

__all__ = ["Cell", "expand", "config_key", "run_cell", "CELL_FILES", "cell_count"]

# the run's files a cell keeps: layers.jsonl with per_layer = true, fp8.jsonl under an FP8 recipe
CELL_FILES = ("run.json", "trace.jsonl", LAYERS.file, FP8_TABLE.file)
# What a cell's configuration can do wrong (Adam given a momentum, a learning rate the rule
# refuses): recorded as a failed cell. Anything else (a full disk, a lost worker) is not the
# cell's result: Dask retries it.
CELL_ERRORS = (ValueError, TypeError, ArithmeticError)


@dataclass(frozen=True)
class Cell:
    index: int
    key: str
    config: dict      # every field of `fpsim train`
    axes: dict        # the values this cell takes on the sweep's axes


def config_key(config: dict, version: str = __version__) -> str:
    """16 hex digits of SHA-256 over the configuration (JSON, sorted keys; floats as their
    shortest round-trip form) and the fpsim version: equal keys, equal bits."""
    text = json.dumps({"fpsim": version, "train": config}, sort_keys=True,
                      separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cell_count(spec: SweepSpec) -> int:
    """How many cells ``expand`` would list, counted without listing them."""
    count = math.prod(len(values) for values in spec.grid.values())
    if spec.zipped:
        count *= len(next(iter(spec.zipped.values())))
    return count


def expand(spec: SweepSpec) -> list[Cell]:
    """Every cell: the product of the [grid] lists (in file order, the last varying fastest),
    then of the [zip] lists taken together."""
    grid = [[(name, value) for value in values] for name, values in spec.grid.items()]
    zipped = []
    if spec.zipped:
        zipped = [list(zip(*([(name, v) for v in values]
                             for name, values in spec.zipped.items())))]
    cells = []
    for index, combo in enumerate(itertools.product(*grid, *zipped)):
        axes: dict = {}
        for part in combo:
            axes.update(part if isinstance(part[0], tuple) else (part,))
        config = dict(spec.base, **axes)
        config = {name: config[name] for name in sorted(config)}
        cells.append(Cell(index, config_key(config), config, axes))
    return cells


def run_cell(cell: Cell, backend_name: str = "numpy") -> dict:
    """Train one cell (on a worker) on the sweep's backend: ``{"fpsim": version, "row":
    results row, "files": {name: text}}``. A configuration that fails gives a row with status
    "failed" and the error."""
    with tempfile.TemporaryDirectory(prefix="fpsim-cell-") as folder, \
            backend.use_backend(backend_name):
        error = None
        began = time.perf_counter()
        try:
            train(from_options(dict(cell.config, out=folder)), progress=False)
        except CELL_ERRORS as err:
            error = f"{type(err).__name__}: {err}"
        wall_time = time.perf_counter() - began
        files = {name: (Path(folder) / name).read_text(encoding="utf-8")
                 for name in CELL_FILES if (Path(folder) / name).exists()}
    records = read_trace(io.StringIO(files["trace.jsonl"])) if error is None else []
    final_scale = json.loads(files["run.json"])["summary"]["final_scale"] if error is None else None
    row = summarize(cell.index, cell.key, cell.config, records, final_scale, wall_time, error)
    return {"fpsim": __version__, "row": row, "files": files if error is None else {}}
